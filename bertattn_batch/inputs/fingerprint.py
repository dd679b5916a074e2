"""What a resume and ``validate`` check of the inputs: each file's fingerprint (size, time, hash of its
ends), and the digest of the rows each committed part of a pass by row number read (an edit in a file's
middle keeps its fingerprint)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import storage
from ..schema import ROW_NUMBER_STATUSES
from .files import Source, read_once
from .read import RowBatch

#: Bytes at each end of an input file whose hash tells a rewritten file from a copy.
ENDS_BYTES = 1 << 16
#: Names how rows are written into a digest: one of another form (another version's) is not compared.
FORM = "r1:"


def source_files(sources: Iterable[Source]) -> list[dict[str, Any]]:
    """Each source in reading order with its size, modification time and a hash of its first and last
    ``ENDS_BYTES`` (a saved dataset: over all its files)."""
    out = []
    for src in sources:
        p = src.path
        if storage.is_remote(p):  # an object: its size and time as the store lists them
            stored = storage.info(p)
            files, stats = [p], [(stored.size, stored.mtime_ns or 0)]
        else:
            p = Path(p)
            files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
            stats = [(st.st_size, st.st_mtime_ns) for st in (f.stat() for f in files)]
        out.append(
            {
                "path": storage.absolute(src.name or str(p)),
                "bytes": sum(size for size, _ in stats),
                "mtime_ns": max((mtime for _, mtime in stats), default=0),
                "ends_sha256": _ends_sha256(files, [size for size, _ in stats]),
            }
        )
    return out


def streams_as_recorded(
    sources: list[Source], now: list[dict[str, Any]], before: list[dict[str, Any]] | None, limited: bool
) -> list[dict[str, Any]]:
    """``now`` (``source_files(sources)``) to compare with a pass's record ``before``: a stream that pass
    copied only the start of (a limit) is taken as that start."""
    if not limited or not before or len(before) != len(now):
        return now
    out = []
    for src, rec, was in zip(sources, now, before, strict=True):
        if src.name and read_once(src.name) and was["path"] == rec["path"] and was["bytes"] < rec["bytes"]:
            rec = {**rec, "bytes": was["bytes"], "ends_sha256": _ends_sha256([src.path], [was["bytes"]])}
        out.append(rec)
    return out


def _ends_sha256(files: list[Any], sizes: list[int]) -> str:
    """The hash of the first and last ``ENDS_BYTES`` of each file, read as ``sizes`` long."""
    digest = hashlib.sha256()
    for f, size in zip(files, sizes, strict=True):
        with storage.open_input(f, buffered=False) as fh:
            digest.update(fh.read(min(size, ENDS_BYTES)))
            if size > ENDS_BYTES:
                start = max(ENDS_BYTES, size - ENDS_BYTES)
                fh.seek(start)
                digest.update(fh.read(size - start))
    return digest.hexdigest()


def rows_digest(batch: RowBatch, start: int = 0, end: int | None = None) -> str:
    """The digest of rows ``[start, end)`` of ``batch`` (positions in the batch, not row numbers)."""
    return FORM + _fed(hashlib.blake2b(digest_size=16), batch, start, len(batch) if end is None else end)


def _fed(h: hashlib.blake2b, batch: RowBatch, start: int, end: int) -> str:
    """``h`` fed rows ``[start, end)`` of ``batch``; its digest so far."""
    # a row whose doc id is its row number has no id; each field as its length and itself, "-" for none
    ids = [
        None if s in ROW_NUMBER_STATUSES else d
        for d, s in zip(batch.doc_id[start:end], batch.status[start:end], strict=True)
    ]
    rows = zip(batch.row_index[start:end], ids, batch.text[start:end], batch.label[start:end], strict=True)
    text = "".join("-" if v is None else f"{len(str(v))}:{v}" for row in rows for v in row)
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class RowDigests:
    """Check rows read again against the digests that committed parts (with ``name``, ``start_row``,
    ``end_row``, ``rows_digest``) recorded: :meth:`feed` every block in row order."""

    def __init__(self, parts: Iterable[Any]) -> None:
        # (name, start_row, end_row, digest) in row order; parts without a digest of this form unchecked
        digests = ((p.name, p.start_row, p.end_row, p.rows_digest) for p in parts)
        self._parts = sorted((d for d in digests if d[3].startswith(FORM)), key=lambda d: d[1])
        self._next = 0  # the first part not yet finished
        self._hash: hashlib.blake2b | None = None  # of the part being read

    @property
    def done(self) -> bool:
        return self._next >= len(self._parts)

    def feed(self, batch: RowBatch) -> list[tuple[str, int, int]]:
        """The parts the next rows finish whose rows now give another digest, as (name, first row, end)."""
        changed: list[tuple[str, int, int]] = []
        i, n = 0, len(batch)
        while i < n and not self.done:
            name, a, b, digest = self._parts[self._next]
            row = batch.row_index[i]
            if row < a:  # rows of no checked part: skip to the part's first row
                i = min(n, i + (a - row))
            elif self._hash is None and row > a:  # begins within rows read already (overlapping parts)
                self._next += 1
            else:
                self._hash = self._hash or hashlib.blake2b(digest_size=16)
                end = min(n, i + (b - row))
                _fed(self._hash, batch, i, end)
                i = end
                if batch.row_index[end - 1] == b - 1:  # the part's last row
                    if FORM + self._hash.hexdigest() != digest:
                        changed.append((name, a, b))
                    self._hash, self._next = None, self._next + 1
        return changed
