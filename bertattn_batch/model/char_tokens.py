"""A fast path of BERT's WordPiece tokenizers for characters that are a word of their own whatever
surrounds them: CJK ideographs (the normalizer puts spaces around each) and punctuation (the
pre-tokenizer splits at each mark).

A Chinese review is mostly such characters, each one token. Each character's token is asked of the
tokenizer once and kept in a table; the stretches between table characters (Latin words, digits,
spaces) go to the tokenizer, each as a text of its own, and their tokens are put back in place. Every
word ends at a table character, so the result is the tokenizer's own, token for token and span for span.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import chain

import numpy as np

#: Table entries: a character not asked about yet, and one that is not a word of its own.
_UNSEEN, _OTHER = -2, -1
#: The letter around a character when asking whether it is a word of its own.
_PROBE = "a"
#: The share of a block's characters that must be in the table for the fast path to be taken: English
#: text splits into so many runs that the tokenizer alone is faster.
_MIN_TABLE_SHARE = 0.5
#: One (ids, offsets, truncated) per text; ids and offsets include [CLS] and [SEP].
Encoding = tuple[np.ndarray, np.ndarray, bool]


class CharTokens:
    """The table of one tokenizer's one-character words, filled as characters are met."""

    def __init__(self, backend, cls_id: int, sep_id: int, probe_id: int) -> None:
        self._backend = backend
        self._cls, self._sep, self._probe = cls_id, sep_id, probe_id
        self._table = np.full(0x110000, _UNSEEN, np.int32)

    @classmethod
    def for_backend(cls, backend) -> CharTokens | None:
        """The fast path for a Rust tokenizer, or None where it would not give the tokenizer's own tokens:
        anything but BERT's normalizer, pre-tokenizer and WordPiece, with only special added tokens and
        the template [CLS] text [SEP]."""
        state = json.loads(backend.to_str())
        kinds = [(state.get(k) or {}).get("type") for k in ("normalizer", "pre_tokenizer", "model")]
        if kinds != ["BertNormalizer", "BertPreTokenizer", "WordPiece"]:
            return None
        if not state["model"].get("continuing_subword_prefix"):
            return None  # a word's later pieces must look unlike a word's first piece (see _learn)
        if not all(t.get("special") for t in state.get("added_tokens", [])):
            return None
        _untruncated_unpadded(backend)
        empty = backend.encode("", add_special_tokens=True)
        probe = backend.encode(_PROBE, add_special_tokens=False)
        framed = backend.encode(_PROBE, add_special_tokens=True)
        if len(empty.ids) != 2 or len(probe.ids) != 1 or probe.offsets != [(0, 1)]:
            return None
        if framed.ids != [empty.ids[0], probe.ids[0], empty.ids[1]] or framed.offsets[0] != (0, 0):
            return None
        return cls(backend, empty.ids[0], empty.ids[1], probe.ids[0])

    def encode(self, texts: Sequence[str], max_length: int, keep_start: bool = True) -> list[Encoding] | None:
        """Each text's ids and character offsets with [CLS] and [SEP], truncated to ``max_length`` (keeping
        the start, or the end where not ``keep_start``), as the tokenizer gives them; None where it cannot
        say (a lone surrogate, no room for a content token) or the tokenizer alone is faster."""
        if max_length < 3:
            return None
        joined = "".join(texts)
        try:
            codes = np.frombuffer(joined.encode("utf-32-le"), np.uint32)
        except UnicodeEncodeError:
            return None
        bounds = np.zeros(len(texts) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, texts), np.int64, len(texts)), out=bounds[1:])
        ids = self._table[codes]
        unseen = ids == _UNSEEN
        if unseen.any():
            self._learn(np.unique(codes[unseen]))
            ids = self._table[codes]
        if np.count_nonzero(ids >= 0) < _MIN_TABLE_SHARE * len(ids):
            return None

        _untruncated_unpadded(self._backend)
        run_at, run_ids, run_offsets = self._runs(joined, ids < 0, bounds)
        at = np.flatnonzero(ids >= 0)  # where each token's word starts; a run's tokens all at its start
        key = np.concatenate((at, run_at))
        order = np.argsort(key, kind="stable")
        key = key[order]
        tok = np.concatenate((ids[at], run_ids))[order]
        start = np.concatenate((at, run_at + run_offsets[:, 0]))[order]
        end = np.concatenate((at + 1, run_at + run_offsets[:, 1]))[order]

        text = np.searchsorted(bounds, key, side="right") - 1
        n = np.bincount(text, minlength=len(texts))
        kept = np.minimum(n, max_length - 2)
        rank = np.arange(len(key)) - np.repeat(np.cumsum(n) - n, n)  # each token's place in its text
        dropped = 0 if keep_start else np.repeat(n - kept, n)
        keep = (rank - dropped >= 0) & (rank - dropped < np.repeat(kept, n))

        out_start = np.zeros(len(texts) + 1, np.int64)
        np.cumsum(kept + 2, out=out_start[1:])
        out_ids = np.empty(out_start[-1], np.int32)
        out_offsets = np.zeros((out_start[-1], 2), np.int32)
        out_ids[out_start[:-1]] = self._cls
        out_ids[out_start[1:] - 1] = self._sep
        where = (out_start[:-1] + 1)[text[keep]] + (rank - dropped)[keep]
        out_ids[where] = tok[keep]
        out_offsets[where, 0] = start[keep] - bounds[text[keep]]
        out_offsets[where, 1] = end[keep] - bounds[text[keep]]
        edges, truncated = out_start.tolist(), (n > kept).tolist()
        return [
            (out_ids[a:b], out_offsets[a:b], t)
            for a, b, t in zip(edges[:-1], edges[1:], truncated, strict=True)
        ]

    def _runs(self, joined: str, other: np.ndarray, bounds: np.ndarray):
        """The stretches of characters not in the table (cut where a text starts), tokenized: for each
        token, where its stretch starts in ``joined``, its id, and its span within the stretch."""
        edge = np.zeros(len(other) + 1, bool)
        edge[bounds] = True
        starts = np.flatnonzero(other & ~(np.concatenate(([False], other[:-1])) & ~edge[:-1]))
        ends = np.flatnonzero(other & ~(np.concatenate((other[1:], [False])) & ~edge[1:])) + 1
        if not len(starts):
            return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros((0, 2), np.int64)
        runs = [joined[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        encodings = self._backend.encode_batch(runs, add_special_tokens=False)
        counts = np.fromiter((len(e.ids) for e in encodings), np.int64, len(encodings))
        total = int(counts.sum())
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.int32, total)
        spans = chain.from_iterable(chain.from_iterable(e.offsets for e in encodings))
        offsets = np.fromiter(spans, np.int64, 2 * total).reshape(total, 2)
        return np.repeat(starts, counts), ids, offsets

    def _learn(self, codes: np.ndarray) -> None:
        """Ask the tokenizer about characters not seen yet: one goes in the table when it is one token alone,
        the same token between two letters and twice in a row that token twice."""
        _untruncated_unpadded(self._backend)
        chars = [chr(c) for c in codes.tolist()]
        probes = [p for c in chars for p in (c, _PROBE + c + _PROBE, c + c)]
        encodings = self._backend.encode_batch(probes, add_special_tokens=False)
        for k, c in enumerate(chars):
            alone, between, twice = encodings[3 * k : 3 * k + 3]
            token = alone.ids[0] if len(alone.ids) == 1 else None
            own_word = (
                token is not None
                and alone.offsets == [(0, 1)]
                and between.ids == [self._probe, token, self._probe]
                and between.offsets == [(0, 1), (1, 2), (2, 3)]
                and twice.ids == [token, token]
                and twice.offsets == [(0, 1), (1, 2)]
            )
            self._table[ord(c)] = token if own_word else _OTHER


def _untruncated_unpadded(backend) -> None:
    """Turn off the truncation and padding a tokenizer may carry: each run is encoded whole, truncated
    after."""
    backend.no_truncation()
    backend.no_padding()
