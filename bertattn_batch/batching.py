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


def bucket_batches(lengths: Sequence[int], batch_tokens: int, max_batch_size: int) -> list[np.ndarray]:
    """Split positions into batches of similar length whose padded size fits ``batch_tokens``.

    Positions are sorted by length (stable, so ties keep input order) and cut greedily: a batch grows
    while ``len(batch) * longest <= batch_tokens`` and ``len(batch) <= max_batch_size``. A review longer
    than the budget still gets a batch of its own. Longest batches come first, so that an
    out-of-memory error shows up at the start of a window rather than at its end.
    """
    if len(lengths) == 0:
        return []
    order = np.argsort(np.asarray(lengths), kind="stable")  # (N,) shortest first
    batches: list[np.ndarray] = []
    start = 0
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]
        if end - start > 1 and ((end - start) * longest > batch_tokens or end - start > max_batch_size):
            batches.append(order[start : end - 1])
            start = end - 1
    batches.append(order[start:])
    return batches[::-1]


def padded_share(lengths: Sequence[int], batches: Sequence[np.ndarray]) -> tuple[int, int]:
    """(real tokens, padded slots) that ``batches`` feed the model."""
    lens = np.asarray(lengths)
    real = int(sum(lens[b].sum() for b in batches))
    slots = int(sum(len(b) * lens[b].max() for b in batches))
    return real, slots
