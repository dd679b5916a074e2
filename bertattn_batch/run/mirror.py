"""A run on an object store, mirrored into a local cache (kept between commands; an unchanged object is
not fetched again) for the commands that read all of it (``local_run``, ``on_local_copy``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .. import storage
from .._files import file_lock
from ..errors import BertAttnError
from .manifest import ALL_TABLES, LEASE_NAME, MANIFEST

#: What the writer of a run owns, never uploaded from a mirror.
_WRITERS_OWN = (*ALL_TABLES, MANIFEST, LEASE_NAME)
#: The store URI of each mirror folder (resolved) this process made, for :func:`display_path`.
_URIS: dict[Path, str] = {}
#: The mirror folders the current thread holds (:func:`_only_user`).
_HELD = threading.local()
T = TypeVar("T")


@contextlib.contextmanager
def local_run(run_dir: str | Path, write_back: bool = False) -> Iterator[Path]:
    """``run_dir`` as a local folder: itself, or its mirror brought up to date; ``write_back``: what the
    block wrote outside the tables is uploaded when it succeeds."""
    if not storage.is_remote(run_dir):
        yield Path(storage.normalize(run_dir))
        return
    uri = os.fspath(run_dir).rstrip("/")
    local = storage.cache_folder("runs", uri)
    _URIS[local.resolve()] = uri
    with _only_user(local, uri) as outermost:
        if not outermost:  # the outer block brought it up to date, and uploads what is written
            yield local
            return
        if storage.is_file(storage.join(uri, MANIFEST)):
            # first: every part it lists was uploaded before it, so the listing below holds them all
            storage.download(storage.join(uri, MANIFEST), local / MANIFEST)
        storage.mirror(uri, local, skip=(LEASE_NAME, MANIFEST))
        before = storage.local_files(local)
        try:
            yield local
        except BertAttnError as e:  # said of the run, not of a cache folder the user never named
            e.args = (str(e).replace(str(local), uri),)
            raise
        if not write_back:
            return
        after = storage.local_files(local)
        for name, stamp in after.items():
            if name.split("/", 1)[0] not in _WRITERS_OWN and before.get(name) != stamp:
                storage.write_bytes(storage.join(uri, name), (local / name).read_bytes())
                storage.stamp(local / name, storage.info(storage.join(uri, name)))
        for name in set(before) - set(after):
            if name.split("/", 1)[0] not in _WRITERS_OWN:
                storage.delete(storage.join(uri, name))


@contextlib.contextmanager
def _only_user(local: Path, uri: str) -> Iterator[bool]:
    """Hold the mirror for one command of this machine at a time; the thread holding it may enter again,
    told so by the False it gets."""
    held: set[Path] = vars(_HELD).setdefault("mirrors", set())
    if local in held:
        yield False
        return
    with file_lock(local / ".lock", waiting=f"waiting for another command on this machine that reads {uri}"):
        held.add(local)
        try:
            yield True
        finally:
            held.discard(local)


def display_path(path: str | Path) -> str:
    """How to name ``path`` to the user: a file or folder of a run's mirror as its URI on the store."""
    if isinstance(path, Path):
        resolved = path.resolve()
        for local, uri in _URIS.items():
            if resolved.is_relative_to(local):
                rel = resolved.relative_to(local).as_posix()
                return uri if rel == "." else storage.join(uri, rel)
    return os.fspath(path)


def on_local_copy(write_back: bool = False) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Let a function whose first argument is a run directory take a store's URI: it is called with the
    run's mirror (:func:`local_run`), and a path it returns inside it becomes the URI."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def called(run_dir: str | Path, *args: Any, **kwargs: Any) -> T:
            with local_run(run_dir, write_back) as local:
                result = fn(local, *args, **kwargs)
            if storage.is_remote(run_dir) and isinstance(result, Path) and result.is_relative_to(local):
                return storage.join(run_dir, result.relative_to(local).as_posix())  # type: ignore[return-value]
            return result

        return called

    return wrap
