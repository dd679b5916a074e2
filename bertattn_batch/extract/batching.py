"""Pure batching helpers: length buckets inside a bounded window, packed by a token budget.

Usage::

    for idx in bucket_batches(lengths, batch_tokens=16384, max_batch_size=256):
        ...  # idx: positions into ``lengths``, similar lengths together

No torch here: these are plain generators, tested on their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of ``size`` items (the last may be shorter)."""
    it = iter(items)
    while block := list(islice(it, size)):
        yield block


#: What one more batch costs, in padded tokens: a batch is worth cutting when it saves more padding
#: than this. A share of the token budget, by device type. On a CPU, 1/64 (256 tokens of the default
#: 16384). On a GPU, 1/16 (4096 of 65536): there the host's launch of a batch is what bounds the model
#: stage (about 12 ms a bert-base batch beside an H200, as long as the device takes for some 20k
#: tokens), and bigger batches ran faster at the paddings measured, up to 6% (docs/performance.md).
#: Never below a floor, as no forward call is free.
BATCH_OVERHEAD_SHARE = {"cpu": 64, "cuda": 16}
MIN_BATCH_OVERHEAD = 32


def batch_overhead(batch_tokens: int, device_type: str = "cpu") -> int:
    """What one more batch costs on a device of this type, in padded tokens (a type not named in
    :data:`BATCH_OVERHEAD_SHARE` is taken as a CPU)."""
    share = BATCH_OVERHEAD_SHARE.get(device_type, BATCH_OVERHEAD_SHARE["cpu"])
    return max(MIN_BATCH_OVERHEAD, batch_tokens // share)


def bucket_batches(
    lengths: Sequence[int], batch_tokens: int, max_batch_size: int, overhead_tokens: int | None = None
) -> list[np.ndarray]:
    """Split positions into batches of similar length, each within ``batch_tokens`` padded tokens.

    Positions are sorted by length (stable, so ties keep input order) and cut into runs that minimise
    padded tokens + ``overhead_tokens`` per batch (default: a CPU's, :func:`batch_overhead`),
    with ``len(batch) * longest <= batch_tokens`` and ``len(batch) <= max_batch_size``. A greedy cut by
    the budget alone pads a batch of short reviews to the longest of up to 256 of them (27% padding on
    512 Chinese reviews, 15% on the English drug reviews); this cut pads 2-6% on the same reviews.
    A review longer than the budget still gets a batch of its own. Longest batches come first, so that
    an out-of-memory error shows up at the start of a window rather than at its end.

    The cut is a dynamic programme over the distinct lengths (at most max_length of them), so it
    costs milliseconds per window of thousands of reviews.
    """
    if len(lengths) == 0:
        return []
    if overhead_tokens is None:
        overhead_tokens = batch_overhead(batch_tokens)
    lens = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lens, kind="stable")  # (N,) shortest first
    values, counts = np.unique(lens[order], return_counts=True)  # (G,) distinct lengths, ascending
    bounds = np.concatenate([[0], np.cumsum(counts)])  # (G+1,) group g is order[bounds[g]:bounds[g+1]]
    cap = np.maximum(1, np.minimum(max_batch_size, batch_tokens // values))  # (G,) batch size at that length
    # cost[b]: cheapest cut of groups [0, b); a run of groups [a, b) is padded to values[b-1] and split
    # into ceil(n / cap) batches of at most cap reviews each.
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
