"""A digest of input rows as they were read, so that a resume (and ``validate``) can tell that rows a run
already committed read differently now: a file edited in place keeps its size and, when the edit is in
its middle, the bytes at its ends that the input fingerprint hashes (``fingerprint.py``).

Each part of a pass by row number records the digest of its rows (their numbers, ids, texts and
labels; not their statuses, as ``duplicate_id`` depends on the rows before, but a row whose id is its
row number is told from one whose id is that number); reading the same rows again gives the same
digest. A pass by id (``--incremental``) keeps the text an id had when it was scored: not compared.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Protocol

from ..schema import ROW_NUMBER_STATUSES
from .rows import RowBatch

#: Names how rows are written into the digest: a digest of another form (a later version's) is not
#: compared, rather than taken for an edit.
FORM = "r1:"


def rows_digest(batch: RowBatch, start: int = 0, end: int | None = None) -> str:
    """The digest of rows ``[start, end)`` of ``batch`` (positions in the batch, not row numbers)."""
    h = hashlib.blake2b(digest_size=16)
    _update(h, batch, start, len(batch) if end is None else end)
    return FORM + h.hexdigest()


def _update(h: hashlib.blake2b, batch: RowBatch, start: int, end: int) -> None:
    # a row without an id of its own has its row number as doc id: none, so that it differs from a row
    # whose id is that number
    ids = [
        None if s in ROW_NUMBER_STATUSES else d
        for d, s in zip(batch.doc_id[start:end], batch.status[start:end], strict=True)
    ]
    fields = (batch.row_index[start:end], ids, batch.text[start:end], batch.label[start:end])
    rows = zip(*fields, strict=True)
    # each field as its length and itself ("-" for none): unambiguous, whatever a text holds, and the
    # same in every Python (repr escapes by the Unicode version of the Python that runs it)
    h.update("".join(_field(v) for row in rows for v in row).encode("utf-8", "surrogatepass"))


def _field(value: object) -> str:
    if value is None:
        return "-"
    text = str(value)
    return f"{len(text)}:{text}"


class DigestedPart(Protocol):
    """A committed part as a manifest lists it (``run.PartEntry``, validate's view of one)."""

    name: str
    start_row: int
    end_row: int
    rows_digest: str


class RowDigests:
    """Check rows read again against the digests that parts recorded: feed every block in row order;
    :meth:`feed` returns the parts (name, first row, end row) whose rows now give another digest."""

    def __init__(self, parts: Iterable[DigestedPart]) -> None:
        #: (name, start_row, end_row, digest), in row order; parts without a digest of this form (a
        #: pass by id, an older or later version) are not checked
        self._parts = sorted(
            (
                (p.name, p.start_row, p.end_row, p.rows_digest)
                for p in parts
                if p.rows_digest.startswith(FORM)
            ),
            key=lambda p: p[1],
        )
        self._next = 0  # the first part not yet finished
        self._hash: hashlib.blake2b | None = None  # of the part being read

    @property
    def done(self) -> bool:
        return self._next >= len(self._parts)

    def feed(self, batch: RowBatch) -> list[tuple[str, int, int]]:
        """Consecutive rows (the next ones read); the parts they finish whose digest differs."""
        changed: list[tuple[str, int, int]] = []
        i, n = 0, len(batch)
        while i < n and not self.done:
            name, a, b, digest = self._parts[self._next]
            row = batch.row_index[i]
            if row < a:  # rows of no checked part: skip to the part's first row
                i = min(n, i + (a - row))
                continue
            if self._hash is None and row > a:  # begins within rows read already (parts that overlap,
                self._next += 1  # which validate reports): it cannot be read again here
                continue
            self._hash = self._hash or hashlib.blake2b(digest_size=16)
            end = min(n, i + (b - row))
            _update(self._hash, batch, i, end)
            i = end
            if batch.row_index[end - 1] == b - 1:  # the part's last row
                if FORM + self._hash.hexdigest() != digest:
                    changed.append((name, a, b))
                self._hash, self._next = None, self._next + 1
        return changed
