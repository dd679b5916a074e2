"""A run on an object store, mirrored into a local folder for the commands that read a whole run.

Usage::

    with local_run("s3://bucket/runs/r1", write_back=True) as run:   # a local Path; a local run as it is
        aggregate(run)             # reads the parts, writes aggregates/ into the mirror...
    # ...which is then uploaded: aggregates/, report.html and faithfulness/ land on the store

Why a mirror: ``validate`` verifies every page checksum, ``aggregate`` and ``report`` read every byte
of every part, and all of them then read again; fetched once into a cache that persists between
commands (``$BERTATTN_CACHE``, else ``~/.cache/bertattn/runs``), later commands read at disk speed and
pay for no second GET. An object whose size and time are those of its cached copy is not fetched again
(parts are named by their window and written whole). ``plot``, which reads one review, and the polars
recipes read the store directly instead.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .. import storage
from .layout import LEASE_NAME, MANIFEST, TABLES

#: What a reader writes into a run, and so what is uploaded back; the tables and manifest are the
#: writer's alone, and never uploaded from a mirror.
_WRITERS_OWN = (*TABLES, MANIFEST, LEASE_NAME)
T = TypeVar("T")


@contextlib.contextmanager
def local_run(run_dir: str | Path, write_back: bool = False) -> Iterator[Path]:
    """``run_dir`` as a local folder: itself where it is local, else its mirror, brought up to date
    with the store (objects gone from the store are gone from the mirror too). With ``write_back``,
    what the block wrote outside the tables is uploaded when it ends without an error."""
    if not storage.is_remote(run_dir):
        yield Path(storage.normalize(run_dir))
        return
    uri = os.fspath(run_dir).rstrip("/")
    local = storage.cache_folder("runs", uri)
    storage.mirror(uri, local, skip=(LEASE_NAME,), fresh=(MANIFEST,))
    before = _listing(local)
    yield local
    if write_back:
        _sync_up(local, uri, before)


def _listing(local: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for f in local.rglob("*"):
        if f.is_file() and not f.name.startswith("."):
            st = f.stat()
            out[f.relative_to(local).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def _sync_up(local: Path, uri: str, before: dict[str, tuple[int, int]]) -> None:
    after = _listing(local)
    for name, stamp in after.items():
        if name.split("/", 1)[0] in _WRITERS_OWN or before.get(name) == stamp:
            continue
        storage.write_bytes(f"{uri}/{name}", (local / name).read_bytes())
        info = storage.info(f"{uri}/{name}")
        storage.stamp(local / name, info)
    for name in set(before) - set(after):
        if name.split("/", 1)[0] not in _WRITERS_OWN:
            storage.delete(f"{uri}/{name}")


def on_local_copy(write_back: bool = False) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a function whose first argument is a run directory so that it also takes a store's URI:
    it is then called with the run's local mirror (see :func:`local_run`)."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def called(run_dir: str | Path, *args: Any, **kwargs: Any) -> T:
            with local_run(run_dir, write_back) as local:
                return fn(local, *args, **kwargs)

        return called

    return wrap
