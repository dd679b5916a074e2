"""Texts -> token ids and character offsets, with truncation recorded per review.

Usage::

    encoded = encode_texts(tokenizer, ["好吃", "slow service"], max_length=512)
    encoded[0].ids, encoded[0].offsets, encoded[0].truncated

    with Encoder(tokenizer, max_length=512, threads=2) as encode:   # the same, on two threads
        encoded = encode(texts)

Needs a fast (Rust-backed) tokenizer: only it gives offsets into the original text, which is how a
token is traced back to its characters (BERT's Chinese tokenizer drops whitespace such as ``\\xa0``).
"""

from __future__ import annotations

import copy
import functools
import json
import re
import secrets
import unicodedata
from collections.abc import Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from .char_tokens import CharTokens, Encoding

#: Reviews longer than this many characters per allowed token are cut before tokenizing (the cut is
#: kept only when it cannot have changed the tokens kept: see ``_cut_is_exact``); keeps a 1 MB review
#: cheap.
_CHARS_PER_TOKEN_CAP = 32
#: The last whitespace of a text, taken as the end of a word: Python's ``\s`` less the control characters
#: it also matches (\x0b, \x0c, \x1c-\x1f, \x85), which BERT's normalizer deletes, joining the letters
#: on either side into one word ("un\x1fbelievable" is "unbelievable", not "un" and "##bel...").
_LAST_SPACE = re.compile(r"[^\S\x0b\x0c\x1c-\x1f\x85][\S\x0b\x0c\x1c-\x1f\x85]*\Z")


@dataclass(frozen=True)
class Encoded:
    """One review's model input: ``ids`` (n,) int32 with [CLS]/[SEP]; ``offsets`` (n, 2) int32."""

    ids: np.ndarray
    offsets: np.ndarray
    truncated: bool
    #: len(ids), kept as a plain int: every stage asks for it per review, and a property reading the
    #: array's shape held Python's lock for a twentieth of a run's host time (docs/performance.md)
    n_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_tokens", int(self.ids.shape[0]))


def encode_texts(tokenizer, texts: Sequence[str], max_length: int) -> list[Encoded]:
    """Tokenize a block of texts; each result holds the special tokens and at most ``max_length`` ids."""
    if not texts:
        return []
    cap = max_length * _CHARS_PER_TOKEN_CAP
    keeps_start = getattr(tokenizer, "truncation_side", "right") == "right"
    if not keeps_start:
        cap = len(max(texts, key=len))  # the cut keeps the start; truncation from the left keeps the end
    cut = [t[:cap] if len(t) > cap else t for t in texts]
    mark = _word_mark_id(tokenizer.backend_tokenizer)
    trims = _trims_offsets(tokenizer.backend_tokenizer)
    out = []
    for i, (ids, offsets, truncated) in enumerate(_encode_batch(tokenizer, cut, max_length)):
        if len(cut[i]) != len(texts[i]):
            if truncated and _cut_is_exact(tokenizer.backend_tokenizer, cut[i], offsets):
                pass  # the review overflows anyway, and the cut did not touch what was kept
            else:  # rare: mostly whitespace, dropped characters or words of hundreds of letters
                ids, offsets, truncated = _encode_batch(tokenizer, [texts[i]], max_length)[0]
        if mark is not None:
            _unpin_prepended_marks(texts[i], ids, offsets, mark)
        if trims:
            _span_trimmed_spaces(tokenizer.backend_tokenizer, texts[i], ids, offsets)
        if not texts[i].isascii() and _marks().search(texts[i]):
            _widen_over_marks(texts[i], offsets, end_known=not (truncated and keeps_start))
        out.append(Encoded(ids=ids, offsets=offsets, truncated=truncated))
    return out


class Encoder:
    """:func:`encode_texts` with a fixed ``max_length``, on ``threads`` threads at once.

    Each thread encodes a share of the texts with its own copy of the tokenizer: the Rust tokenizer lets
    go of Python's lock while it encodes, but calls on one tokenizer object wait for each other. The
    copies are made here, so configure the tokenizer (truncation side and so on) before.
    """

    def __init__(self, tokenizer, max_length: int, threads: int = 1) -> None:
        self.max_length = max_length
        self._tokenizers = [tokenizer] + [copy.deepcopy(tokenizer) for _ in range(threads - 1)]
        # a thread per copy (a shared pool may queue two shares on one thread while another idles)
        self._threads = [ThreadPoolExecutor(1, thread_name_prefix=f"encode-{i}") for i in range(1, threads)]

    def __call__(self, texts: Sequence[str]) -> list[Encoded]:
        k = len(self._tokenizers)
        if k == 1 or len(texts) < 2 * k:
            return encode_texts(self._tokenizers[0], texts, self.max_length)
        cut = [i * len(texts) // k for i in range(k + 1)]  # k shares whose sizes differ by one at most
        others = [
            thread.submit(encode_texts, tok, texts[cut[i] : cut[i + 1]], self.max_length)
            for i, (thread, tok) in enumerate(zip(self._threads, self._tokenizers[1:], strict=True), start=1)
        ]
        try:  # this thread takes the first share
            out = encode_texts(self._tokenizers[0], texts[: cut[1]], self.max_length)
        finally:  # even on an error here, no share is still running when this returns
            futures.wait(others)
        for future in others:
            out += future.result()
        return out

    def close(self) -> None:
        for thread in self._threads:
            thread.shutdown(cancel_futures=True)

    def __enter__(self) -> Encoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _word_mark_id(backend) -> int | None:
    """Id of the token that is a word-start mark alone: Metaspace's '▁', or byte-level BPE's 'Ġ' where
    it adds a space before the text; None for tokenizers that prepend no mark (WordPiece)."""
    state = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else {}
    for part in [state, *state.get("pretokenizers", [])]:
        if part.get("type") == "Metaspace" and part.get("prepend_scheme", "always") != "never":
            return backend.token_to_id(part["replacement"])
        if part.get("type") == "ByteLevel" and part.get("add_prefix_space"):
            return backend.token_to_id("\u0120")  # the byte-level spelling of a space
    return None


def _unpin_prepended_marks(text: str, ids: np.ndarray, offsets: np.ndarray, mark: int) -> None:
    """Give a lone word mark that stands for no character of the text an empty span, in place.

    The mark a tokenizer prepends to a word has no source character of its own (the pre-tokenizer drops
    the space it replaces), yet the tokenizer aligns it with that word's first character, which the next
    token covers too ('▁' and '好' of "好吃" both at 0..1; the same before a later word that has no
    ``▁x`` piece). A mark whose span ends before the next token's start (a tokenizer that keeps the
    spaces) spans real text: it is kept. The last content token has no next one where truncation cut
    the review after it: there a mark is pinned when its span holds no space.
    """
    for k in np.flatnonzero(ids[1:-1] == mark) + 1:
        start, end = offsets[k]
        if k + 1 < len(ids) - 1:
            pinned = offsets[k + 1, 0] < end
        else:
            pinned = end > start and not text[start:end].isspace()
        if pinned:
            offsets[k, 1] = start


def _trims_offsets(backend) -> bool:
    """Whether the post-processor trims whitespace off the offsets (byte-level BPE: RoBERTa and its
    kin), which leaves a token that is whitespace alone an empty span at that whitespace's end."""
    if backend.post_processor is None:
        return False
    state = json.loads(backend.post_processor.__getstate__())
    return any(part.get("trim_offsets") for part in [state, *state.get("processors", [])])


def _span_trimmed_spaces(backend, text: str, ids: np.ndarray, offsets: np.ndarray) -> None:
    """Give each content token that is whitespace alone the whitespace it stands for, in place: a
    space that byte-level BPE spells 'Ġ' (a trailing one, or one of two in a row) was trimmed to an
    empty span at its own end, or at its start where the text opens with it. A mark the tokenizer
    prepended stands for no character and keeps its empty span."""
    inner = offsets[1:-1]
    for k in np.flatnonzero(inner[:, 0] == inner[:, 1]) + 1:
        at = int(offsets[k, 1])
        spelt = backend.decode([int(ids[k])], skip_special_tokens=False)
        if not spelt.isspace():
            continue
        if text[max(0, at - len(spelt)) : at] == spelt:
            offsets[k, 0] = at - len(spelt)
        elif text[at : at + len(spelt)] == spelt and (
            k + 2 == len(offsets) or offsets[k + 1, 0] >= at + len(spelt)
        ):
            offsets[k, 1] = at + len(spelt)


def _joins_previous(char: str) -> bool:
    """A combining mark, or a Hangul vowel or final jamo: what a normalizer composes into (NFC, NFKC) or
    strips from (accent stripping) the character before it."""
    return (
        unicodedata.category(char)[0] == "M" or "\u1160" <= char <= "\u11ff" or "\ud7b0" <= char <= "\ud7ff"
    )


@functools.cache
def _marks() -> re.Pattern:
    """The characters of :func:`_joins_previous` in the Basic Multilingual Plane, and every character
    beyond it, as one fast class: a text without any has no mark to span (the few marks beyond the
    plane are looked for in texts that have such characters at all)."""
    chars = "".join(chr(c) for c in range(0x10000) if _joins_previous(chr(c)))
    return re.compile(f"[{re.escape(chars)}\U00010000-\U0010ffff]")


def _widen_over_marks(text: str, offsets: np.ndarray, end_known: bool) -> None:
    """Extend each content token's span, in place, over the marks after it that no token covers.

    Tokenizers align a composed 'é' (from 'e' + U+0301) with the 'e' alone, and a token whose accents
    were stripped ends before them, so the mark belongs to no span. The last token reaches over marks
    up to the text's end only where the text's end is known to be kept (``end_known``): after a cut,
    what follows may be a token of its own.
    """
    last = len(offsets) - 1  # the [SEP]
    for k in range(1, last):
        start, end = offsets[k]
        limit = offsets[k + 1, 0] if k + 1 < last else (len(text) if end_known else end)
        if start == end or end >= limit:
            continue
        while end < limit and _joins_previous(text[end]):
            end += 1
        offsets[k, 1] = end


#: Put before a special token's piece in a Unigram vocabulary, so that no text matches it: random for
#: each process, as a fixed prefix can be typed ("\ue000<s>" was); the piece keeps its id and score.
_UNREACHABLE = f"\ue000{secrets.token_hex(16)}"


def text_backend(tokenizer):
    """The Rust tokenizer that encodes a review's text as text (kept on ``tokenizer``, made once).

    ``encode_special_tokens`` (see :func:`_encode_batch`) stops a tokenizer from matching a special
    token's text, but a Unigram vocabulary (XLM-R's, CamemBERT's SentencePiece) also holds ``<s>``,
    ``</s>``, ``<pad>`` as pieces with the best score there is, so ``<s>`` in a review still became the
    control token. For those, a copy whose special pieces are renamed out of reach of any text
    encodes instead: every other piece, id and score is the same, so text without them is segmented
    exactly as before, and [CLS]/[SEP] are still added by their ids. WordPiece and BPE cannot produce
    a special token from text and are used as they are.
    """
    backend = tokenizer.backend_tokenizer
    cached = getattr(tokenizer, "_bertattn_text_backend", None)
    # a copied or unpickled tokenizer keeps the cache but not the Rust flag: made again then
    if cached is not None and cached[0] is backend and cached[1].encode_special_tokens:
        return cached[1]
    state = json.loads(backend.to_str())
    model = state.get("model", {})
    specials = set(tokenizer.all_special_tokens)
    text = backend
    if model.get("type") == "Unigram" and any(piece in specials for piece, _ in model["vocab"]):
        from tokenizers import Tokenizer

        model["vocab"] = [[_UNREACHABLE + p if p in specials else p, score] for p, score in model["vocab"]]
        text = Tokenizer.from_str(json.dumps(state))
    text.encode_special_tokens = True
    tokenizer._bertattn_text_backend = (backend, text)
    return text


def with_special_tokens(tokenizer, contents: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each review's content token ids (as a run's tokens table holds them) between the two special
    tokens the tokenizer adds around a text ([CLS] and [SEP], one each: checked on load): the ids the
    run scored."""
    ends = _encode_batch(tokenizer, [""], 2)[0][0]
    return [np.concatenate([ends[:1], np.asarray(c, dtype=np.int32), ends[1:]]) for c in contents]


def id_limit(tokenizer) -> int:
    """One past the largest token id: what a lookup by id needs. ``len(tokenizer)`` counts the tokens,
    which falls short where a vocabulary leaves ids unused (gaps between its ids)."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)


def _cut_is_exact(backend, cut: str, offsets: np.ndarray) -> bool:
    """Whether the tokens kept from a cut text are those the whole text would give.

    Tokenizers split words at whitespace, so tokens that end before the last whitespace of the cut text
    cannot depend on what the cut removed. Failing that, only WordPiece gives a proof: a kept token in
    the word that reaches the cut end would make that word longer than ``max_input_chars_per_word``
    (after normalizing) when what follows the kept tokens is, so the word would be one [UNK] ending past
    them. Everything else is re-encoded whole (a 150-letter word is [UNK] whole, pieces when cut).
    """
    end = int(offsets[:, 1].max(initial=0))
    space = _LAST_SPACE.search(cut)
    if space is not None and end <= space.start():
        return True
    model = backend.model
    if type(model).__name__ != "WordPiece":
        return False
    rest = cut[end:] if backend.normalizer is None else backend.normalizer.normalize_str(cut[end:])
    return len(rest) > model.max_input_chars_per_word


def _encode_batch(tokenizer, texts: list[str], max_length: int) -> list[Encoding]:
    """The tokenizer's own ids and offsets, with [CLS] and [SEP] around them, truncated to
    ``max_length``, and whether each text was truncated.

    A special token's text inside a review (``[SEP]``, ``<pad>``) is encoded as the characters it is
    (:func:`text_backend`): by default the tokenizer would turn it into the control token itself, and
    RoBERTa's ``<pad>`` would even shift the positions after it. BERT's tokenizers take the fast path of
    :mod:`.char_tokens`, which gives the same tokens. Calls the backend directly: the library's
    ``tokenizer(...)`` would also convert every token's id and offsets into Python lists that are not
    used here (a third of the encoding time).
    """
    backend = text_backend(tokenizer)
    side = getattr(tokenizer, "truncation_side", "right")
    chars = _char_tokens(tokenizer, backend)
    encoded = chars.encode(texts, max_length, keep_start=side == "right") if chars is not None else None
    if encoded is not None:
        return encoded
    backend.enable_truncation(max_length, direction=side)
    backend.no_padding()
    out = []
    for enc in backend.encode_batch(texts, add_special_tokens=True):
        n = len(enc)
        # fromiter over the flattened pairs: np.asarray on the list of tuples took twice as long
        offsets = np.fromiter(chain.from_iterable(enc.offsets), np.int32, count=2 * n).reshape(n, 2)
        out.append((np.asarray(enc.ids, dtype=np.int32), offsets, bool(enc.overflowing)))
    return out


def _char_tokens(tokenizer, backend) -> CharTokens | None:
    """The fast path's table for this tokenizer (kept on it, made once), or None where it has none."""
    cached = getattr(tokenizer, "_bertattn_char_tokens", None)
    if cached is None or cached[0] is not backend:
        cached = (backend, CharTokens.for_backend(backend))
        tokenizer._bertattn_char_tokens = cached
    return cached[1]
