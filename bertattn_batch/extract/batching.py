"""A window's reviews cut into batches of similar length within a token budget, and the window-wide
arrays the model's outputs for them land in. No torch: a host process plans and fills them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

if TYPE_CHECKING:
    from ..model import Classifier, Outputs
    from .tables import ScoredRow

T = TypeVar("T")


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while block := list(islice(it, size)):
        yield block


def batch_overhead(batch_tokens: int, device_type: str = "cpu") -> int:
    """What one more batch costs, in padded tokens: a share of the budget, larger on a GPU, where the host's
    launch of a batch bounds the model stage (docs/performance.md)."""
    return max(32, batch_tokens // (16 if device_type == "cuda" else 64))


def bucket_batches(
    lengths: Sequence[int], batch_tokens: int, max_batch_size: int, overhead_tokens: int | None = None
) -> list[np.ndarray]:
    """Split positions into batches of similar length, each within ``batch_tokens`` padded tokens (a longer
    review alone) and ``max_batch_size``, cut by a dynamic programme over the distinct lengths to minimise
    padded tokens + ``overhead_tokens`` a batch. Longest first, so that running out of memory shows early."""
    if len(lengths) == 0:
        return []
    if overhead_tokens is None:
        overhead_tokens = batch_overhead(batch_tokens)
    lens = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lens, kind="stable")  # (N,) shortest first
    values, counts = np.unique(lens[order], return_counts=True)  # (G,) distinct lengths, ascending
    bounds = np.concatenate([[0], np.cumsum(counts)])  # (G+1,) group g is order[bounds[g]:bounds[g+1]]
    cap = np.maximum(1, np.minimum(max_batch_size, batch_tokens // values))  # (G,) batch size at that length
    # cost[b]: cheapest cut of groups [0, b); a run [a, b) is padded to values[b-1], in ceil(n / cap) batches
    cost = np.zeros(len(values) + 1)
    start = np.zeros(len(values) + 1, dtype=np.int64)
    for b in range(1, len(values) + 1):
        n = bounds[b] - bounds[:b]  # (b,) reviews in runs [a, b) for every a < b
        run = cost[:b] + n * values[b - 1] + np.ceil(n / cap[b - 1]) * overhead_tokens
        start[b] = int(np.argmin(run))
        cost[b] = run[start[b]]
    batches: list[np.ndarray] = []
    b = len(values)
    while b > 0:
        a, k = start[b], int(cap[b - 1])
        run_idx = order[bounds[a] : bounds[b]]  # shortest first
        for hi in range(len(run_idx), 0, -k):  # from the longest end: each batch padded to its own longest
            batches.append(run_idx[max(0, hi - k) : hi])
        b = a
    return batches


class BatchPlan:
    """A window's scorable rows cut into batches, and the window-wide arrays their outputs are copied into
    (views into each batch's own would fragment the heap: docs/performance.md)."""

    def __init__(
        self, rows: Sequence[ScoredRow], clf: Classifier | Any, batch_tokens: int, max_batch_size: int
    ) -> None:
        todo = [r for r in rows if r.status == "ok"]
        lengths = [r.encoded.n_tokens for r in todo]
        layers, heads = len(clf.layers), clf.num_heads
        cls_rows = np.empty(layers * heads * sum(lengths), dtype=np.float32)
        cls_norms = np.empty_like(cls_rows)
        zeroing = np.empty(layers * sum(lengths), np.float32) if clf.value_zeroing else None
        probs = np.empty((len(todo), len(clf.labels)), dtype=np.float32)
        contributions = np.empty(sum(lengths), np.float32) if clf.contributions else None
        at = 0
        for i, (r, n) in enumerate(zip(todo, lengths, strict=True)):
            r.probs = probs[i]  # (C,)
            r.cls_rows = cls_rows[at : at + layers * heads * n].reshape(layers, heads, n)  # (L, H, n)
            r.cls_norms = cls_norms[at : at + layers * heads * n].reshape(r.cls_rows.shape)
            if zeroing is not None:  # every (L, n) and (n,) block starts where its (L, H, n) one does
                r.value_zeroing = zeroing[at // heads :][: layers * n].reshape(layers, n)
            if contributions is not None:
                r.contributions = contributions[at // (layers * heads) :][:n]
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
        """Copy batch ``k``'s outputs (one, or its halves) into its rows, each review's own tokens."""
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
                if out.contributions is not None:
                    r.contributions[:] = out.contributions[i, :n]
