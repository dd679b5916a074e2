"""Tokens as a reader sees them, in every printed table and figure: byte-level BPE pieces (RoBERTa's
'Ġgood', 'cafÃ©') decoded back to text, and characters that would disturb a terminal escaped. The stored
tables keep the tokenizer's own spelling, which joins and token ids agree with."""

from __future__ import annotations

import unicodedata

#: GPT-2's byte-level alphabet (RoBERTa's tokens) inverted: each byte's printable character -> the byte;
#: the bytes with no printable self are drawn from chr(256) on ('Ġ' is the space).
_DRAWN = [*range(33, 127), *range(161, 173), *range(174, 256)]
_SHIFTED = dict(zip(map(chr, range(256, 512)), (b for b in range(256) if b not in _DRAWN), strict=False))
_BYTES = {chr(b): b for b in _DRAWN} | _SHIFTED
#: The most characters a token shows in a table cell or on a figure (the stored tables keep it whole).
PRINTED_CHARS = 40
#: Characters that reorder what follows them on screen (bidi embeddings, overrides and isolates).
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: str, limit: int | None = PRINTED_CHARS) -> str:
    """``text`` fit to print on one line: control characters, line breaks and bidi controls as escapes
    ('\\n', '\\x1b', '\\u202e'), cut to ``limit`` characters."""
    hidden = [unicodedata.category(c) in ("Cc", "Zl", "Zp") or c in _BIDI for c in text]
    text = "".join(repr(c)[1:-1] if h else c for c, h in zip(text, hidden, strict=True))
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def columns(text: str) -> int:
    """Terminal columns: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def readable(tokens: list[str], byte_level: bool | None = None) -> list[str]:
    """Tokens as a reader sees them (:func:`printable`), byte-level BPE tokens decoded (part of a
    character shows '�'); ``byte_level`` None (a manifest that does not say): told from the tokens."""
    if _spells_bytes(tokens, byte_level):
        tokens = [_decode(t).strip() or _decode(t, spaces=True) for t in tokens]
    return [printable(t) for t in tokens]


def _spells_bytes(tokens: list[str], byte_level: bool | None) -> bool:
    if byte_level is None:
        byte_level = any(c in _SHIFTED for t in tokens for c in t)
    return byte_level and all(c in _BYTES for t in tokens for c in t)


def _decode(token: str, spaces: bool = False) -> str:
    """A byte-level token's text; ``spaces``: spaces shown ('␣good') and other unprintable characters as
    escapes, for a token of spaces alone and for two tokens that differ only in a space."""
    text = bytes(_BYTES[c] for c in token).decode("utf-8", errors="replace")
    return "".join("␣" if c == " " else repr(c)[1:-1] for c in text) if spaces else text


def readable_map(tokens: list[str], byte_level: bool | None = None) -> dict[str, str]:
    """Each distinct token and how it reads (:func:`readable`) in a table's cells: two that read alike show
    their spaces ('␣good', 'good'); two that still do (pieces of characters, '�') their own spelling."""
    distinct = list(dict.fromkeys(tokens))
    cells = dict(zip(distinct, readable(distinct, byte_level), strict=True))
    if _spells_bytes(distinct, byte_level):
        for clash in _alike(cells):
            cells.update({t: printable(_decode(t, spaces=True), None) for t in clash})
    for clash in _alike(cells):  # cut alike, or pieces of one character
        cells.update({t: printable(t, None) for t in clash})
    return cells


def _alike(shown: dict[str, str]) -> list[list[str]]:
    """The groups of tokens that read the same."""
    by_text: dict[str, list[str]] = {}
    for token, text in shown.items():
        by_text.setdefault(text, []).append(token)
    return [tokens for tokens in by_text.values() if len(tokens) > 1]
