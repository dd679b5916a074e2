"""Per-review slicing of [CLS] rows and per-head scaling, into Arrow tables cast to ``schemas/``.

Usage::

    extractor = Extractor(vocab=clf.tokenizer, layers=clf.layers, num_heads=clf.num_heads)
    tables = extractor.tables(scored)   # {"predictions": ..., "cls_attention": ..., "head_summary": ...}

Every review is sliced by its own length: content tokens are positions 1 .. n-2 of that review, never
the padded batch's ``[:, 0, 1:-1]`` (that keeps padding and drops a pad instead of [SEP]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from . import schema
from .attention import minmax_scale
from .encode import Encoded


@dataclass
class ScoredRow:
    """One input row after the model stage; ``probs``/``cls_rows`` are None when not scored."""

    row_index: int
    doc_id: str
    label: str | None
    status: str
    encoded: Encoded | None = None
    probs: np.ndarray | None = None  # (C,)
    cls_rows: np.ndarray | None = None  # (L, H, n): the review's own tokens only


def vocab_array(tokenizer) -> pa.Array:
    """Token text for every id, so token columns are built by index in C++ rather than per row."""
    n = len(tokenizer)
    tokens = tokenizer.convert_ids_to_tokens(list(range(n)))
    return pa.array([t if t is not None else "" for t in tokens], type=pa.string())


class Extractor:
    """Builds the three tables of a run from scored rows; stateless apart from the vocabulary."""

    def __init__(self, vocab: pa.Array, layers: Sequence[int], num_heads: int, labels: Sequence[str]) -> None:
        self.vocab = vocab
        self.layers = np.asarray(layers, dtype=np.int16)
        self.num_heads = num_heads
        self.labels = list(labels)

    def tables(self, rows: Sequence[ScoredRow]) -> dict[str, pa.Table]:
        attention, summary = self.cls_attention(rows)
        return {"predictions": self.predictions(rows), "cls_attention": attention, "head_summary": summary}

    def predictions(self, rows: Sequence[ScoredRow]) -> pa.Table:
        pred_id = [int(np.argmax(r.probs)) if r.probs is not None else None for r in rows]
        table = pa.table(
            {
                "doc_id": [r.doc_id for r in rows],
                "row_index": pa.array([r.row_index for r in rows], pa.int64()),
                "status": [r.status for r in rows],
                "label": pa.array([r.label for r in rows], pa.string()),
                "pred_id": pa.array(pred_id, pa.int32()),
                "pred_label": pa.array(
                    [self.labels[p] if p is not None else None for p in pred_id], pa.string()
                ),
                "probs": pa.array(
                    [r.probs.astype(np.float32) if r.probs is not None else None for r in rows],
                    pa.list_(pa.float32()),
                ),
                "n_tokens": pa.array(
                    [r.encoded.n_tokens if r.probs is not None else 0 for r in rows], pa.int32()
                ),
                "truncated": pa.array([bool(r.encoded and r.encoded.truncated) for r in rows], pa.bool_()),
            }
        )
        return schema.cast(table, "predictions")

    def cls_attention(self, rows: Sequence[ScoredRow]) -> tuple[pa.Table, pa.Table]:
        """(cls_attention, head_summary) for the scored rows among ``rows``."""
        L, H = len(self.layers), self.num_heads
        scored = [r for r in rows if r.cls_rows is not None]
        doc_idx, layer, head, pos, tok, start, end, weight, scaled = ([] for _ in range(9))
        s_doc, s_n, s_cls, s_sep, s_min, s_max = ([] for _ in range(6))
        for d, r in enumerate(scored):
            n = r.encoded.n_tokens
            m = n - 2  # content tokens: positions 1 .. n-2
            full = r.cls_rows  # (L, H, n)
            content = full[:, :, 1 : n - 1]  # (L, H, m)
            sc, lo, hi = minmax_scale(content)  # (L, H, m), (L, H), (L, H)
            doc_idx.append(np.full(L * H * m, d, dtype=np.int32))
            layer.append(np.repeat(self.layers, H * m))
            head.append(np.tile(np.repeat(np.arange(H, dtype=np.int16), m), L))
            pos.append(np.tile(np.arange(1, n - 1, dtype=np.int32), L * H))
            tok.append(np.tile(r.encoded.ids[1 : n - 1], L * H))
            start.append(np.tile(r.encoded.offsets[1 : n - 1, 0], L * H))
            end.append(np.tile(r.encoded.offsets[1 : n - 1, 1], L * H))
            weight.append(content.reshape(-1))
            scaled.append(sc.reshape(-1))
            s_doc.append(np.full(L * H, d, dtype=np.int32))
            s_n.append(np.full(L * H, m, dtype=np.int32))
            s_cls.append(full[:, :, 0].reshape(-1))
            s_sep.append(full[:, :, n - 1].reshape(-1))
            s_min.append(lo.reshape(-1))
            s_max.append(hi.reshape(-1))
        docs = pa.array([r.doc_id for r in scored], pa.string())
        attn = {
            "doc_id": _take(docs, doc_idx),
            "layer": _cat(layer, np.int16),
            "head": _cat(head, np.int16),
            "position": _cat(pos, np.int32),
            "token_id": _cat(tok, np.int32),
            "token": _take(self.vocab, tok),
            "start": _cat(start, np.int32),
            "end": _cat(end, np.int32),
            "weight": _cat(weight, np.float32),
            "weight_scaled": _cat(scaled, np.float32),
        }
        summary = {
            "doc_id": _take(docs, s_doc),
            "layer": np.repeat(self.layers, H)[None, :].repeat(len(scored), 0).reshape(-1),
            "head": np.tile(np.arange(H, dtype=np.int16), L * len(scored)),
            "n_content": _cat(s_n, np.int32),
            "weight_cls": _cat(s_cls, np.float32),
            "weight_sep": _cat(s_sep, np.float32),
            "weight_min": _cat(s_min, np.float32),
            "weight_max": _cat(s_max, np.float32),
        }
        return (
            schema.cast(pa.table(attn), "cls_attention"),
            schema.cast(pa.table(summary), "head_summary"),
        )


def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)


def _take(values: pa.Array, index_parts: list[np.ndarray]) -> pa.Array:
    """values[index] as a plain string array, gathered in C++."""
    idx = _cat(index_parts, np.int32)
    return values.take(pa.array(idx, pa.int32()))
