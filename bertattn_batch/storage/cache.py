"""Local copies of what a store holds (a run for the commands that read all of it, a model folder), kept
in a cache between commands and fetched again only where the store's object changed.

Usage::

    local = cache_folder("models", "s3://b/models/zh")   # $BERTATTN_CACHE or ~/.cache/bertattn
    mirror("s3://b/models/zh", local)                     # fetches what is new or changed, drops what went
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StorageError
from .objects import READ_BLOCK_BYTES, listing, open_input
from .uris import join

if TYPE_CHECKING:
    import pyarrow.fs as pafs


def cache_folder(kind: str, uri: str) -> Path:
    """Where a store's ``kind`` of thing (``runs``, ``models``) is copied on this machine:
    ``$BERTATTN_CACHE``, else ``~/.cache/bertattn``, one folder a URI (named in its ``.source``)."""
    root = Path(os.environ.get("BERTATTN_CACHE") or Path.home() / ".cache" / "bertattn")
    folder = root / kind / hashlib.sha256(uri.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".source").write_text(uri + "\n", encoding="utf-8")
    return folder


def local_files(local: Path) -> dict[str, tuple[int, int]]:
    """A local folder's files by their names below it: (size, modification time). Hidden ones, and those
    in hidden folders (a command's temporaries), are left out."""
    out = {}
    for f in local.rglob("*"):
        name = f.relative_to(local).as_posix()
        if f.is_file() and not any(part.startswith(".") for part in name.split("/")):
            st = f.stat()
            out[name] = (st.st_size, st.st_mtime_ns)
    return out


def mirror(uri: str, local: Path, skip: tuple[str, ...] = ()) -> None:
    """Bring ``local`` up to date with every object under ``uri`` but ``skip``: an object whose size and
    time its copy records is not fetched again; a copy whose object is gone is removed."""
    found = listing(uri, recursive=True)
    if not found:
        raise StorageError(f"{uri}: no such folder, or it is empty")
    remote = {n: i for n, i in found.items() if n not in skip}
    for name in set(local_files(local)) - set(remote) - set(skip):
        (local / name).unlink()
    for name, obj in remote.items():
        target = local / name
        if obj.mtime_ns and target.is_file() and stamp(target) == (obj.size, obj.mtime_ns):
            continue  # (a store that gives no time is fetched every time: size alone cannot tell)
        download(join(uri, name), target, obj)


def download(uri: str, target: Path, obj: pafs.FileInfo | None = None) -> None:
    """Copy one object to ``target`` through a temporary file of this process's own (several workers of
    one machine may copy the same model at once), stamped with the object's time."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        with open_input(uri, buffered=False) as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, READ_BLOCK_BYTES)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if obj is not None:
        stamp(target, obj)


def stamp(path: Path, obj: pafs.FileInfo | None = None) -> tuple[int, int]:
    """A copy's (size, time): with ``obj``, first set its time to the object's, so that the copy itself
    records which version of the object it holds."""
    if obj is not None and obj.mtime_ns:
        os.utime(path, ns=(obj.mtime_ns, obj.mtime_ns))
    st = path.stat()
    return (st.st_size, st.st_mtime_ns)
