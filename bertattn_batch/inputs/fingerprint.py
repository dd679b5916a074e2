"""What a resume checks of its inputs: each file's size, time and the hash of its ends."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import storage
from .discover import Source
from .streams import read_once

#: Bytes at each end of an input file whose hash tells a rewritten file from a copy (source_files).
ENDS_BYTES = 1 << 16


def source_files(sources: Iterable[Source]) -> list[dict[str, Any]]:
    """Each source as it was expanded, in reading order, with its size in bytes, its modification time
    and a hash of its first and last ``ENDS_BYTES`` (a saved dataset: over all its files).

    Why: row numbers count across the sources, so a resume must know whether a folder or glob gained
    a file, or a file changed, since the rows it skips were committed. An export rewritten in another
    row order keeps its size but not its time, nor (almost surely) its first rows or Parquet footer;
    a copy of the same file keeps its bytes but not its time.
    """
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
    """``now`` (``source_files(sources)``) to compare with the recorded pass's (``before``): where that
    pass had a limit (``limited``) and so copied only a start of a stream, the stream is given as that
    start, its size and the hash of its ends there. Why: a stream cannot be read again, so a job that
    goes on with a larger limit, or none, has it piped again whole; it is the same input if it begins
    with the same bytes. (A stream a pass read whole is compared whole: one that grew since is another.)"""
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
