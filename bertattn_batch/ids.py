"""Sets of review ids at 16 bytes an id, for the duplicate and resume checks of an ``--id-col`` run.

Usage::

    seen = IdSet(["r-1", "r-2"])
    seen.add("r-3")
    "r-1" in seen, len(seen)          # True, 3

A Python set of id strings costs about 90 bytes an id (93 MB a million, measured), which a run of tens
of millions of reviews would hold to its end. This keeps a 128-bit digest of each id (blake2b) in a
sorted array, with the latest additions in a small set that is merged in as it grows. Two distinct ids
share a digest with a probability of about n² / 2¹²⁹: 1e-25 for ten million ids.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from itertools import islice

import numpy as np

_DIGEST = np.dtype("S16")
#: Recent additions kept as Python bytes (about 90 bytes each) before a merge into the sorted array.
_MIN_RECENT = 1 << 16


def _digest(doc_id: str) -> bytes:
    return hashlib.blake2b(doc_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class IdSet:
    """A set of strings, as far as ``in``, ``add``, ``update``, ``|`` and ``len`` go."""

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._sorted = np.empty(0, dtype=_DIGEST)
        self._recent: set[bytes] = set()
        self.update(ids)

    def __contains__(self, doc_id: str) -> bool:
        return self._has(_digest(doc_id))

    def __len__(self) -> int:
        return len(self._sorted) + len(self._recent)

    def add(self, doc_id: str) -> bool:
        """Add ``doc_id``; whether it was new."""
        d = _digest(doc_id)
        if self._has(d):
            return False
        self._recent.add(d)
        self._merge_when_due()
        return True

    def update(self, ids: Iterable[str]) -> None:
        it = iter(ids)
        while block := list(islice(it, _MIN_RECENT)):  # blocks: millions of ids are never all listed
            self.add_each(block)

    def add_each(self, ids: Sequence[str]) -> list[bool]:
        """Add the ids in turn; for each, whether it was new (in neither the set nor earlier in
        ``ids``). A block at a time: one search of the sorted array for all, which took a sixth of the
        reader's time when done id by id (docs/performance.md)."""
        recent, new = self._recent, []
        for d, is_old in self._sorted_holds(ids):
            is_new = not is_old and d not in recent
            if is_new:
                recent.add(d)
            new.append(is_new)
        self._merge_when_due()
        return new

    def contains_each(self, ids: Sequence[str]) -> list[bool]:
        """``[doc_id in self for doc_id in ids]``, with one search of the sorted array for all."""
        return [is_old or d in self._recent for d, is_old in self._sorted_holds(ids)]

    def __or__(self, other: IdSet) -> IdSet:
        out = IdSet()
        out._sorted = np.union1d(self._digests(), other._digests())
        return out

    def _has(self, d: bytes) -> bool:
        if d in self._recent:
            return True
        i = int(np.searchsorted(self._sorted, d))
        # the element's raw bytes: reading it back as bytes would strip its trailing zero bytes
        return self._sorted[i : i + 1].tobytes() == d

    def _sorted_holds(self, ids: Sequence[str]) -> list[tuple[bytes, bool]]:
        """Each id's digest, and whether the sorted array holds it: one search for all (dtype S16: every
        digest is 16 bytes, so no padding is stripped)."""
        digests = [_digest(doc_id) for doc_id in ids]
        if not len(self._sorted):
            return [(d, False) for d in digests]
        wanted = np.array(digests, dtype=_DIGEST)
        i = np.minimum(np.searchsorted(self._sorted, wanted), len(self._sorted) - 1)
        return list(zip(digests, (self._sorted[i] == wanted).tolist(), strict=True))

    def _merge_when_due(self) -> None:
        """Merge once the recent additions are an eighth of the array (at least ``_MIN_RECENT``): a
        set lookup stays cheap, and each merge copies the array rarely."""
        if len(self._recent) >= max(_MIN_RECENT, len(self._sorted) // 8):
            self._merge()

    def _digests(self) -> np.ndarray:
        self._merge()
        return self._sorted

    def _merge(self) -> None:
        """Move the recent additions (none of them in the array) into the sorted array."""
        if self._recent:
            recent = np.sort(np.array(list(self._recent), dtype=_DIGEST))
            self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, recent), recent)
            self._recent.clear()
