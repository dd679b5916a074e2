"""Sets of review ids at 16 bytes an id (a Python set of strings costs about 90), for the duplicate and
resume checks of an ``--id-col`` run: a 128-bit blake2b digest of each id in a sorted array, recent
additions in a small set merged in as it grows. Two ids share a digest with a probability of about
n² / 2¹²⁹ (1e-25 for ten million ids)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from itertools import islice

import numpy as np

_DIGEST = np.dtype("S16")
#: Recent additions kept as a Python set before a merge into the sorted array.
_MIN_RECENT = 1 << 16


def _digest(doc_id: str) -> bytes:
    return hashlib.blake2b(doc_id.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class IdSet:
    """A set of strings, as far as ``in``, ``add``, ``update``, ``|`` and ``len`` go; ``add_each`` and
    ``contains_each`` answer for a block of ids with one search of the array."""

    def __init__(self, ids: Iterable[str] = ()) -> None:
        self._sorted = np.empty(0, dtype=_DIGEST)
        self._recent: set[bytes] = set()
        self.update(ids)

    def __len__(self) -> int:
        return len(self._sorted) + len(self._recent)

    def __contains__(self, doc_id: str) -> bool:
        return self.contains_each([doc_id])[0]

    def __or__(self, other: IdSet) -> IdSet:
        self._merge()
        other._merge()
        out = IdSet()
        out._sorted = np.union1d(self._sorted, other._sorted)
        return out

    def add(self, doc_id: str) -> bool:
        """Add ``doc_id``; whether it was new."""
        return self.add_each([doc_id])[0]

    def update(self, ids: Iterable[str]) -> None:
        it = iter(ids)
        while block := list(islice(it, _MIN_RECENT)):
            self.add_each(block)

    def add_each(self, ids: Sequence[str]) -> list[bool]:
        """Add the ids in turn; for each, whether it was new (in neither the set nor earlier in ``ids``)."""
        new = []
        for d, old in self._search(ids):
            is_new = not old and d not in self._recent
            if is_new:
                self._recent.add(d)
            new.append(is_new)
        if len(self._recent) >= max(_MIN_RECENT, len(self._sorted) // 8):  # rare copies, cheap lookups
            self._merge()
        return new

    def contains_each(self, ids: Sequence[str]) -> list[bool]:
        """``[doc_id in self for doc_id in ids]``."""
        return [old or d in self._recent for d, old in self._search(ids)]

    def _search(self, ids: Sequence[str]) -> list[tuple[bytes, bool]]:
        """Each id's digest, and whether the sorted array holds it (S16 keeps trailing zero bytes)."""
        digests = [_digest(doc_id) for doc_id in ids]
        if not len(self._sorted):
            return [(d, False) for d in digests]
        wanted = np.array(digests, dtype=_DIGEST)
        i = np.minimum(np.searchsorted(self._sorted, wanted), len(self._sorted) - 1)
        return list(zip(digests, (self._sorted[i] == wanted).tolist(), strict=True))

    def _merge(self) -> None:
        """Move the recent additions (none of them in the array) into the sorted array."""
        if self._recent:
            recent = np.sort(np.array(list(self._recent), dtype=_DIGEST))
            self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, recent), recent)
            self._recent.clear()
