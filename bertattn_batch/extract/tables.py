"""Per-review slicing of [CLS] rows and per-head scaling, into Arrow tables cast to ``schemas/``.

Each review is sliced by its own length (content tokens are its positions 1 .. n-2). A token's id, text
and span are written once per position (``tokens``), not per layer and head. ``doc_id`` columns come
dictionary-encoded over the window's ids, which a part writer takes as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .. import schema
from ..model.encode import Encoded, id_limit
from .words import CONTINUATION, KEY, segmenter, token_words, word_rule

if TYPE_CHECKING:
    from ..config import JobSpec


@dataclass
class ScoredRow:
    """One input row after the model stage; its outputs are None where it was not scored."""

    row_index: int
    doc_id: str
    label: str | None
    status: str
    encoded: Encoded | None = None
    probs: np.ndarray | None = None  # (C,)
    cls_rows: np.ndarray | None = None  # (L, H, n): the review's own tokens only
    cls_norms: np.ndarray | None = None  # (L, H, n): norm-based weights of the same tokens
    value_zeroing: np.ndarray | None = None  # (L, n): where the run asked for it
    contributions: np.ndarray | None = None  # (n,): ALTI's R[0, :], where the run asked for it
    text: str | None = None  # as read, for the predictions table


@dataclass(frozen=True)
class TableOptions:
    """What a run's tables hold besides the model's outputs: the reviews' texts, and each token's word
    by ``words`` (``jieba`` or ``wordpiece``; None: no words) with jieba's ``user_dict`` and the tokenizer's
    ``continuation`` mark (None: it marks word starts instead)."""

    store_text: bool = True
    words: str | None = None
    user_dict: str | None = None
    continuation: str | None = CONTINUATION

    @classmethod
    def of(cls, spec: JobSpec, clf: Any) -> TableOptions:
        """A job's options, ``auto`` words resolved for its classifier; a user dictionary that jieba cannot
        read is refused here, before any window (jieba's own dictionary is loaded where windows are
        staged)."""
        words = word_rule(spec.words, clf.words, clf.word_continuation)
        user_dict = spec.user_dict if words == "jieba" else None
        if user_dict is not None:
            segmenter(user_dict)
        return cls(spec.store_text, words, user_dict, clf.word_continuation)


def vocab_array(tokenizer) -> pa.Array:
    """Token text for every id ("" where unused), so token columns are built by index."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(id_limit(tokenizer))))
    return pa.array([t if t is not None else "" for t in tokens], type=pa.string())


#: Token rows built at once (about 10 MB of columns, and temporaries of about as much); a window's
#: tables are built in chunks of whole reviews of about this size.
CHUNK_TOKEN_ROWS = 1 << 18


class Extractor:
    """Builds the tables of a run from scored rows; stateless apart from the vocabulary."""

    def __init__(self, vocab: pa.Array, layers: Sequence[int], num_heads: int, labels: Sequence[str],
                 run_id: str = "", options: TableOptions = TableOptions(),
                 contributions: bool = False) -> None:  # fmt: skip
        self.vocab = vocab
        self.layers = np.asarray(layers, dtype=np.int16)
        self.num_heads = num_heads
        self.labels = list(labels)
        self.run_id = run_id
        self.options = options
        self.contributions = contributions  # also the contributions table

    def tables(self, rows: Sequence[ScoredRow]) -> dict[str, pa.Table]:
        attention, summary, tokens = self.cls_attention(rows)
        out = {"predictions": self.predictions(rows), "cls_attention": attention, "head_summary": summary,
               "tokens": tokens}  # fmt: skip
        if self.contributions:
            out["contributions"] = contributions_table(rows, tokens)
        return out

    def predictions(self, rows: Sequence[ScoredRow]) -> pa.Table:
        pred = [int(np.argmax(r.probs)) if r.probs is not None else None for r in rows]
        table = pa.table({  # typed by the cast below
            "doc_id": [r.doc_id for r in rows], "row_index": [r.row_index for r in rows],
            "status": [r.status for r in rows], "label": [r.label for r in rows], "pred_id": pred,
            "pred_label": [self.labels[p] if p is not None else None for p in pred],
            "pred_prob": [
                float(r.probs[p]) if p is not None else None for r, p in zip(rows, pred, strict=True)
            ],
            "probs": [r.probs for r in rows],
            "n_tokens": [r.encoded.n_tokens if r.probs is not None else 0 for r in rows],
            "truncated": [bool(r.encoded and r.encoded.truncated) for r in rows],
            "text": [r.text if self.options.store_text else None for r in rows],
            "run_id": [self.run_id] * len(rows),
        })  # fmt: skip
        return schema.cast(table, "predictions")

    def cls_attention(self, rows: Sequence[ScoredRow]) -> tuple[pa.Table, pa.Table, pa.Table]:
        """(cls_attention, head_summary, tokens) for the scored rows among ``rows``, built in chunks of whole
        reviews of about ``CHUNK_TOKEN_ROWS`` token rows, so that temporaries stay a few MB."""
        scored = [r for r in rows if r.cls_rows is not None]
        per_review = len(self.layers) * self.num_heads
        starts, size = [0], 0
        for i, r in enumerate(scored):
            rows_i = per_review * (r.encoded.n_tokens - 2)
            if size + rows_i > CHUNK_TOKEN_ROWS and i > starts[-1]:
                starts.append(i)
                size = 0
            size += rows_i
        # every chunk's doc_id columns index one dictionary of the window's ids: a Parquet writer takes
        # it whole, where ids spelled out on every row would each be hashed (run.parts.write_table)
        docs = pa.array([r.doc_id for r in scored], pa.string())
        ends = [*starts[1:], len(scored)]
        built = [self._cls_chunk(scored[a:b], docs, a) for a, b in zip(starts, ends, strict=True)]
        attention, summary, tokens = (pa.concat_tables(tables) for tables in zip(*built, strict=True))
        return attention, summary, tokens

    def _cls_chunk(
        self, scored: Sequence[ScoredRow], docs: pa.Array, first: int
    ) -> tuple[pa.Table, pa.Table, pa.Table]:
        """The three tables for a chunk of scored reviews (ids from ``docs[first]`` on), vectorised over
        their content tokens; rows in (review, layer, head, position) order, each (review, layer, head) a
        segment."""
        L, H = len(self.layers), self.num_heads
        n = np.array([r.encoded.n_tokens for r in scored], dtype=np.int64)
        m = n - 2  # content tokens: positions 1 .. n-2
        if (m < 1).any():
            raise ValueError("a scored review must have at least one content token")
        # every review's whole rows, [CLS] and [SEP] included, joined in one copy each
        rows = _cat([r.cls_rows.reshape(-1) for r in scored], np.float32)  # segments of n_i tokens
        norms = _cat([r.cls_norms.reshape(-1) for r in scored], np.float32)
        index = np.int32 if len(rows) < 2**31 else np.int64
        whole = np.repeat(n, L * H).astype(index)  # one segment per (review, layer, head)
        whole_start = (np.cumsum(whole) - whole).astype(index)
        at = np.arange(len(rows), dtype=index) - np.repeat(whole_start, whole)  # position in its review
        content = (at > 0) & (at < np.repeat(whole - 1, whole))
        weight, weight_norm = rows[content], norms[content]
        position = at[content].astype(np.int32, copy=False)  # each attention row's token
        del at, content
        seg = whole - 2  # the content tokens of each segment
        scaled, lo, hi = minmax_scale(weight, seg)
        lh = np.tile(np.arange(L * H, dtype=np.int32), len(scored))  # each segment's (layer, head)
        seg_layer, seg_head = self.layers[lh // H], (lh % H).astype(np.int16)
        ids = _cat([r.encoded.ids[1:-1] for r in scored], np.int32)  # every content token, once
        offsets = np.concatenate([r.encoded.offsets[1:-1] for r in scored] or [np.zeros((0, 2), np.int32)])
        review = np.arange(first, first + len(scored), dtype=np.int32)  # each review's index in ``docs``
        review_of_seg = np.repeat(review, L * H)

        def doc_ids(review_of_row: np.ndarray) -> pa.DictionaryArray:
            return pa.DictionaryArray.from_arrays(pa.array(review_of_row), docs)

        attn = {
            "doc_id": doc_ids(np.repeat(review_of_seg, seg)),
            "layer": np.repeat(seg_layer, seg),
            "head": np.repeat(seg_head, seg),
            "position": position,
            "weight": weight,
            "weight_scaled": scaled,
            "weight_norm": weight_norm,
            "value_zeroing": _zeroing(scored, H, len(weight)),
        }
        first_token = (np.cumsum(m) - m).astype(np.int32)  # each review's first content token in ``ids``
        tokens = {
            "doc_id": doc_ids(np.repeat(review, m)),
            "position": np.arange(len(ids), dtype=np.int32) - np.repeat(first_token, m) + 1,
            "token_id": ids,
            "token": self.vocab.take(pa.array(ids)),
            "start": offsets[:, 0].astype(np.int32, copy=False),
            "end": offsets[:, 1].astype(np.int32, copy=False),
            "word": pa.nulls(len(ids), pa.int32()),
            "word_text": pa.nulls(len(ids), pa.string()),
        }
        if (words := self.options.words) is not None:
            tokens[KEY] = np.repeat(np.arange(len(scored)), m)
            texts = [r.text or "" for r in scored]
            tokens["word"], tokens["word_text"] = token_words(
                tokens, texts, words, self.options.user_dict, self.options.continuation
            )
        summary = {
            "doc_id": doc_ids(review_of_seg),
            "layer": seg_layer,
            "head": seg_head,
            "n_content": seg.astype(np.int32, copy=False),
            "weight_cls": rows[whole_start],
            "weight_sep": rows[whole_start + whole - 1],
            "weight_min": lo,
            "weight_max": hi,
        }
        return (
            schema.cast(pa.table(attn), "cls_attention", keep_dictionaries=True),
            schema.cast(pa.table(summary), "head_summary", keep_dictionaries=True),
            schema.cast(pa.table(tokens), "tokens", keep_dictionaries=True),
        )


def contributions_table(rows: Sequence[ScoredRow], tokens: pa.Table) -> pa.Table:
    """Each content token's contribution to [CLS] after the last layer, in ``tokens``' order."""
    scored = [r for r in rows if r.cls_rows is not None]
    alti = _cat([r.contributions[1 : r.encoded.n_tokens - 1] for r in scored], np.float32)  # content tokens
    table = pa.table({"doc_id": tokens["doc_id"], "position": tokens["position"], "alti": alti})
    return schema.cast(table, "contributions", keep_dictionaries=True)


def _zeroing(scored: Sequence[ScoredRow], heads: int, rows: int) -> pa.Array:
    """The value_zeroing column: each (layer, token)'s distance for every head; nulls where not computed."""
    if not scored or scored[0].value_zeroing is None:
        return pa.nulls(rows, pa.float32())

    parts = [
        np.repeat(r.value_zeroing[:, None, 1 : r.encoded.n_tokens - 1], heads, axis=1).ravel() for r in scored
    ]
    return pa.array(_cat(parts, np.float32))


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def minmax_scale(weights: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Min-max scaling to [0, 1] of each segment (``lengths`` (S,), each at least 1) of ``weights`` (N,), as
    MinMaxScaler per head: (scaled (N,), min (S,), max (S,)); a segment with no range scales to 0."""
    if len(weights) == 0:
        return weights.astype(np.float32), weights, weights
    starts = np.cumsum(lengths) - lengths
    lo = np.minimum.reduceat(weights, starts)
    hi = np.maximum.reduceat(weights, starts)
    span = np.repeat(hi - lo, lengths)
    shifted = weights - np.repeat(lo, lengths)
    scaled = np.divide(shifted, span, out=np.zeros_like(weights), where=span > 0)
    return scaled.astype(np.float32, copy=False), lo, hi
