"""The model's plain-array inputs and outputs: texts -> token ids and character offsets into the original
text, with truncation recorded per review; and what a batch hands back. No torch: host processes use them."""

from __future__ import annotations

import copy
import functools
import json
import re
import secrets
import unicodedata
import weakref
from collections.abc import Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from .char_tokens import CharTokens, Encoding

#: Reviews longer than this many characters per allowed token are cut before tokenizing, where the cut
#: cannot change the tokens kept (``_cut_is_exact``): a 1 MB review stays cheap.
_CHARS_PER_TOKEN_CAP = 32
#: The last whitespace of a text, which ends a word: ``\s`` less the control characters BERT's normalizer
#: deletes, joining the letters either side ("un\x1fbelievable" is one word).
_LAST_SPACE = re.compile(r"[^\S\x0b\x0c\x1c-\x1f\x85][\S\x0b\x0c\x1c-\x1f\x85]*\Z")


@dataclass(frozen=True)
class Encoded:
    """One review's model input: ``ids`` (n,) int32 with [CLS]/[SEP]; ``offsets`` (n, 2) int32."""

    ids: np.ndarray
    offsets: np.ndarray
    truncated: bool
    n_tokens: int = field(init=False)  # len(ids) as a plain int: every stage asks for it

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_tokens", int(self.ids.shape[0]))


class Outputs(NamedTuple):
    """One padded batch's outputs, float32 numpy arrays."""

    probs: np.ndarray  # (B, C)
    rows: np.ndarray  # (B, L, H, S): the [CLS] query's attention weights
    norms: np.ndarray  # (B, L, H, S): their norm-based weights
    value_zeroing: np.ndarray | None = None  # (B, L, S), where the classifier was loaded to compute it
    contributions: np.ndarray | None = None  # (B, S): ALTI's R[0, :], where the classifier was loaded so


def encode_texts(tokenizer, texts: Sequence[str], max_length: int) -> list[Encoded]:
    """Tokenize a block of texts; each result holds the special tokens and at most ``max_length`` ids."""
    if not texts:
        return []
    cap = max_length * _CHARS_PER_TOKEN_CAP
    keeps_start = getattr(tokenizer, "truncation_side", "right") == "right"
    if not keeps_start:
        cap = len(max(texts, key=len))  # the cut keeps the start; truncation from the left keeps the end
    cut = [t[:cap] if len(t) > cap else t for t in texts]
    backend = tokenizer.backend_tokenizer
    mark, trims = _word_mark_id(backend), _trims_offsets(backend)
    out = []
    for i, (ids, offsets, truncated) in enumerate(_encode_batch(tokenizer, cut, max_length)):
        # a cut text is encoded whole where the cut may change what it keeps (rare: long words, whitespace)
        if len(cut[i]) != len(texts[i]) and not (truncated and _cut_is_exact(backend, cut[i], offsets)):
            ids, offsets, truncated = _encode_batch(tokenizer, [texts[i]], max_length)[0]
        if mark is not None:
            _unpin_prepended_marks(texts[i], ids, offsets, mark)
        if trims:
            _span_trimmed_spaces(backend, texts[i], ids, offsets)
        if not texts[i].isascii() and _marks().search(texts[i]):
            _widen_over_marks(texts[i], offsets, end_known=not (truncated and keeps_start))
        out.append(Encoded(ids=ids, offsets=offsets, truncated=truncated))
    return out


class Encoder:
    """:func:`encode_texts` on ``threads`` threads, each with its own copy of the tokenizer (calls on one
    wait for each other), and a thread per copy: a shared pool may queue two shares on one thread."""

    def __init__(self, tokenizer, max_length: int, threads: int = 1) -> None:
        self.max_length = max_length
        self._tokenizers = [tokenizer] + [copy.deepcopy(tokenizer) for _ in range(threads - 1)]
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

    def close(self, *_exc: object) -> None:
        for thread in self._threads:
            thread.shutdown(cancel_futures=True)

    def __enter__(self) -> Encoder:
        return self

    __exit__ = close


def _word_mark_id(backend) -> int | None:
    """Id of a prepended word-start mark alone (Metaspace's '▁', byte-level BPE's 'Ġ'), or None."""
    state = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else {}
    for part in [state, *state.get("pretokenizers", [])]:
        if part.get("type") == "Metaspace" and part.get("prepend_scheme", "always") != "never":
            return backend.token_to_id(part["replacement"])
        if part.get("type") == "ByteLevel" and part.get("add_prefix_space"):
            return backend.token_to_id("\u0120")  # the byte-level spelling of a space
    return None


def _unpin_prepended_marks(text: str, ids: np.ndarray, offsets: np.ndarray, mark: int) -> None:
    """Give a lone word mark that stands for no character an empty span, in place ('▁' and '好' of "好吃"
    would both be at 0..1)."""
    for k in np.flatnonzero(ids[1:-1] == mark) + 1:
        start, end = offsets[k]
        if k + 1 < len(ids) - 1:
            pinned = offsets[k + 1, 0] < end
        else:
            pinned = end > start and not text[start:end].isspace()
        if pinned:
            offsets[k, 1] = start


def _trims_offsets(backend) -> bool:
    """Whether the post-processor trims whitespace off the offsets (byte-level BPE: RoBERTa and its kin)."""
    if backend.post_processor is None:
        return False
    state = json.loads(backend.post_processor.__getstate__())
    return any(part.get("trim_offsets") for part in [state, *state.get("processors", [])])


def _span_trimmed_spaces(backend, text: str, ids: np.ndarray, offsets: np.ndarray) -> None:
    """Give each whitespace token whose span was trimmed empty the whitespace it stands for, in place."""
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
    """A combining mark or a Hangul vowel or final jamo: what a normalizer joins to the character before."""
    return (
        unicodedata.category(char)[0] == "M" or "\u1160" <= char <= "\u11ff" or "\ud7b0" <= char <= "\ud7ff"
    )


@functools.cache
def _marks() -> re.Pattern:
    """A character class of :func:`_joins_previous` in the BMP, and everything beyond it: a quick test."""
    chars = "".join(chr(c) for c in range(0x10000) if _joins_previous(chr(c)))
    return re.compile(f"[{re.escape(chars)}\U00010000-\U0010ffff]")


def _widen_over_marks(text: str, offsets: np.ndarray, end_known: bool) -> None:
    """Extend each content token's span over the marks after it that no token covers ('e' + U+0301), in
    place; the last one only where the text's end is kept (``end_known``)."""
    last = len(offsets) - 1  # the [SEP]
    for k in range(1, last):
        start, end = offsets[k]
        limit = offsets[k + 1, 0] if k + 1 < last else (len(text) if end_known else end)
        if start == end or end >= limit:
            continue
        while end < limit and _joins_previous(text[end]):
            end += 1
        offsets[k, 1] = end


#: Put before a special token's piece in a Unigram vocabulary so that no text matches it (random: a fixed
#: prefix can be typed); the piece keeps its id and score.
_UNREACHABLE = f"\ue000{secrets.token_hex(16)}"
#: Per tokenizer: (its backend, the Rust tokenizer that encodes text as text, the fast path or None).
_PREPARED: weakref.WeakKeyDictionary[Any, tuple[Any, Any, CharTokens | None]] = weakref.WeakKeyDictionary()


def text_backend(tokenizer):
    """The Rust tokenizer that encodes a review's text as text, a special token's text included (a Unigram
    vocabulary's special pieces made unreachable)."""
    return _prepared(tokenizer)[0]


def without_fast_path(tokenizer) -> None:
    """Encode with ``tokenizer``'s own Rust path from now on, not :mod:`.char_tokens`'s."""
    _PREPARED[tokenizer] = (tokenizer.backend_tokenizer, text_backend(tokenizer), None)


def _prepared(tokenizer) -> tuple[Any, CharTokens | None]:
    """:func:`text_backend` and its fast path, made once per tokenizer."""
    backend = tokenizer.backend_tokenizer
    cached = _PREPARED.get(tokenizer)
    if cached is None or cached[0] is not backend:
        state = json.loads(backend.to_str())
        model = state.get("model", {})
        specials = set(tokenizer.all_special_tokens)
        text = backend
        if model.get("type") == "Unigram" and any(piece in specials for piece, _ in model["vocab"]):
            from tokenizers import Tokenizer

            model["vocab"] = [
                [_UNREACHABLE + p if p in specials else p, score] for p, score in model["vocab"]
            ]
            text = Tokenizer.from_str(json.dumps(state))
        text.encode_special_tokens = True
        cached = _PREPARED[tokenizer] = (backend, text, CharTokens.for_backend(text))
    return cached[1], cached[2]


def with_special_tokens(tokenizer, contents: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each review's content token ids between [CLS] and [SEP]: the ids it scored."""
    ends = _encode_batch(tokenizer, [""], 2)[0][0]
    return [np.concatenate([ends[:1], np.asarray(c, dtype=np.int32), ends[1:]]) for c in contents]


def id_limit(tokenizer) -> int:
    """One past the largest token id (``len(tokenizer)`` falls short where a vocabulary leaves gaps)."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)


def _cut_is_exact(backend, cut: str, offsets: np.ndarray) -> bool:
    """Whether a cut text keeps the whole text's tokens: they end before its last whitespace, or in WordPiece
    the rest is longer than ``max_input_chars_per_word`` (one [UNK] either way)."""
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
    """The tokenizer's own (ids, offsets, truncated) with [CLS] and [SEP], at most ``max_length`` tokens."""
    backend, chars = _prepared(tokenizer)
    side = getattr(tokenizer, "truncation_side", "right")
    encoded = chars.encode(texts, max_length, keep_start=side == "right") if chars is not None else None
    if encoded is not None:
        return encoded
    backend.enable_truncation(max_length, direction=side)
    backend.no_padding()
    out = []
    for enc in backend.encode_batch(texts, add_special_tokens=True):
        n = len(enc)
        offsets = np.fromiter(chain.from_iterable(enc.offsets), np.int32, count=2 * n).reshape(n, 2)
        out.append((np.asarray(enc.ids, dtype=np.int32), offsets, bool(enc.overflowing)))
    return out
