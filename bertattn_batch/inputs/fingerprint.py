"""What a resume checks of its inputs: each file's size, time and the hash of its ends."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import storage
from .discover import Source

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
        digest = hashlib.sha256()
        for f, (size, _) in zip(files, stats, strict=True):
            with storage.open_input(f, buffered=False) as fh:
                digest.update(fh.read(ENDS_BYTES))
                if size > ENDS_BYTES:
                    fh.seek(max(ENDS_BYTES, size - ENDS_BYTES))
                    digest.update(fh.read(ENDS_BYTES))
        out.append(
            {
                "path": storage.absolute(src.name or str(p)),
                "bytes": sum(size for size, _ in stats),
                "mtime_ns": max((mtime for _, mtime in stats), default=0),
                "ends_sha256": digest.hexdigest(),
            }
        )
    return out
