"""A window's scorable rows cut into batches, and where the model's outputs for them land.

Usage::

    plan = BatchPlan(window.rows, clf, batch_tokens=16384, max_batch_size=256)
    for k, outputs in enumerate(score_batches(clf, plan.batch_ids())):   # extract/score.py: the model
        plan.fill(k, outputs)

No torch here: a host process (engines/host_processes.py) plans and fills while the model runs in
another process, and only packed token ids and the outputs cross between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .batching import batch_overhead, bucket_batches
from .tables import ScoredRow

if TYPE_CHECKING:
    from ..model import Classifier, Outputs

#: A batch's token ids as one array and each review's length: sent to another process in one piece
#: (a list of an array a review took five times as long to pickle).
PackedIds = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class ModelShape:
    """What the host side of a window needs of a classifier: its tokenizer and the shapes of its
    outputs, not its weights; what a host process is sent in its place."""

    tokenizer: Any
    max_length: int
    layers: list[int]
    num_heads: int
    labels: list[str]
    value_zeroing: bool
    device_type: str  # where the model runs, which sizes its batches (batching.batch_overhead)

    @classmethod
    def of(cls, clf: Classifier) -> ModelShape:
        return cls(clf.tokenizer, clf.max_length, list(clf.layers), clf.num_heads, list(clf.labels),
                   clf.value_zeroing, clf.device_type)  # fmt: skip


def pack_ids(ids: Sequence[np.ndarray]) -> PackedIds:
    return np.concatenate(ids), np.array([len(x) for x in ids], np.int64)


def unpack_ids(packed: PackedIds) -> list[np.ndarray]:
    flat, lengths = packed
    return np.split(flat, np.cumsum(lengths)[:-1])


class BatchPlan:
    """A window's scorable rows cut into batches, and the window-wide arrays their outputs land in.

    Every row's outputs are views into arrays made for the whole window before its first batch, and
    each batch's own outputs are copied there and freed. Kept alive by views instead, the batches'
    arrays would sit in the heap among the freed buffers of later batches, which the C library then
    cannot reuse whole: on the default model the stage's peak was 60 to 130 MB higher (three
    alternating runs each on 40k reviews), handed back only at the window's end.
    """

    def __init__(
        self, rows: Sequence[ScoredRow], clf: Classifier | ModelShape, batch_tokens: int, max_batch_size: int
    ) -> None:
        todo = [r for r in rows if r.status == "ok"]
        lengths = [r.encoded.n_tokens for r in todo]
        layers, heads = len(clf.layers), clf.num_heads
        cls_rows = np.empty(layers * heads * sum(lengths), dtype=np.float32)
        cls_norms = np.empty_like(cls_rows)
        zeroing = np.empty(layers * sum(lengths), np.float32) if clf.value_zeroing else None
        probs = np.empty((len(todo), len(clf.labels)), dtype=np.float32)
        at = 0
        for i, (r, n) in enumerate(zip(todo, lengths, strict=True)):
            r.probs = probs[i]  # (C,)
            r.cls_rows = cls_rows[at : at + layers * heads * n].reshape(layers, heads, n)  # (L, H, n)
            r.cls_norms = cls_norms[at : at + layers * heads * n].reshape(r.cls_rows.shape)
            if zeroing is not None:
                start = at // heads
                r.value_zeroing = zeroing[start : start + layers * n].reshape(layers, n)  # (L, n)
            at += layers * heads * n
        self.batches = [
            [todo[i] for i in idx]
            for idx in bucket_batches(
                lengths, batch_tokens, max_batch_size, batch_overhead(batch_tokens, clf.device_type)
            )
        ]
        self.real = sum(lengths)  # tokens the model reads
        self.slots = 0  # padded slots of the batches that ran (after any halving)

    def batch_ids(self) -> list[list[np.ndarray]]:
        """Each batch's token ids, one array per review."""
        return [[r.encoded.ids for r in batch] for batch in self.batches]

    def fill(self, k: int, outputs: Sequence[Outputs]) -> None:
        """Copy batch ``k``'s outputs (one, or its halves in order) into its rows: each review's own
        tokens, no padding."""
        rows = iter(self.batches[k])
        for out in outputs:
            self.slots += out.rows.shape[0] * out.rows.shape[-1]
            for i, r in zip(range(out.rows.shape[0]), rows, strict=False):
                n = r.encoded.n_tokens
                r.probs[:] = out.probs[i]
                r.cls_rows[:] = out.rows[i, :, :, :n]
                r.cls_norms[:] = out.norms[i, :, :, :n]
                if out.value_zeroing is not None:
                    r.value_zeroing[:] = out.value_zeroing[i, :, :n]
