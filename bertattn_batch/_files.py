"""Files the commands write: atomic replacement, one lock helper, and the leftovers of killed processes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import WriteError

log = logging.getLogger(__name__)

#: Age after which a temporary whose lock cannot tell is taken to be a killed process's, and removed.
STALE_SECONDS = 6 * 3600
#: The lock that the process working in a temporary folder holds in it (:func:`claim_dir`).
DIR_LOCK = ".claimed"


def hidden_tmp(name: str) -> str:
    """Where a file is written before it replaces ``name`` (readers pass over dot files)."""
    return f".{name}.tmp"


@contextlib.contextmanager
def atomic_path(path: Path, fsync: bool = False, unique: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` that replaces ``path`` in one step when the block succeeds,
    and is removed when it fails. ``unique``: a temporary of this process's own, for a file that two
    commands may write at once; those of killed processes are removed first."""
    tmp = path.with_name(hidden_tmp(path.name))
    if unique:
        for left in path.parent.glob(f".{path.name}.*.tmp"):
            owner = left.name[len(path.name) + 2 : -len(".tmp")]
            if owner.isdigit() and not process_alive(int(owner)):
                left.unlink(missing_ok=True)
        remove_stale(path.parent, f".{path.name}.*.tmp")  # a process id since reused
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        if fsync:
            fsync_file(tmp)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    with atomic_path(path, fsync=True) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a new temporary folder beside ``path`` that takes its place when the block succeeds and is
    removed when it fails (the caller holds a lock on ``path``); a killed process's leftovers go first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if aside and not path.exists():
        with contextlib.suppress(OSError):
            aside[-1].rename(path)
    for pattern in (f".{path.name}.partial-*", f".{path.name}.old-*"):
        remove_stale(path.parent, pattern)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    claim = claim_dir(tmp)
    try:
        yield tmp
        (tmp / DIR_LOCK).unlink(missing_ok=True)  # not part of what it holds
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        if had := path.exists():
            path.rename(old)
        tmp.rename(path)
        if had:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if claim is not None:
            os.close(claim)


def remove_tree(folder: Path, tries: int = 5) -> None:
    """Remove ``folder`` while another process may add and remove files in it: a file gone meanwhile
    is no error, and a folder that gained one is cleared again."""
    for _ in range(tries):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            return
        time.sleep(0.1)
    shutil.rmtree(folder)  # raises what stands in the way


def remove_stale(parent: Path, pattern: str) -> None:
    """Remove what matches ``pattern`` in ``parent`` and was left behind: a folder claimed with
    :func:`claim_dir` once no process holds its lock, anything else once older than ``STALE_SECONDS``."""
    for stale in parent.glob(pattern):
        with contextlib.suppress(OSError):  # another process may remove it first
            held = lock_is_held(stale / DIR_LOCK) if (folder := stale.is_dir()) else None
            if held is False or (held is None and time.time() - stale.stat().st_mtime > STALE_SECONDS):
                if folder:
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink()


def claim_dir(path: Path) -> int | None:
    """Hold a lock in the new folder ``path`` while this process runs (or until the returned descriptor
    is closed), so that :func:`remove_stale` removes it once its process is gone; None where it cannot."""
    new = path / f"{DIR_LOCK}.new"
    try:
        fd = os.open(new, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        new.rename(path / DIR_LOCK)
    except OSError:
        os.close(fd)
        new.unlink(missing_ok=True)
        return None
    return fd


def _take_lock(path: Path, wait: bool, tries: int = 1) -> int | None:
    """An exclusive ``flock`` on ``path``: its descriptor, or None where the file system has no locks;
    BlockingIOError while another process holds it and not ``wait`` (after ``tries`` 0.1 s apart)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for _ in range(tries - 1):
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            time.sleep(0.1)
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BaseException as e:  # a stop signal while waiting too: the descriptor goes with it
        os.close(fd)
        if isinstance(e, BlockingIOError) or not isinstance(e, OSError):
            raise
        log.warning("%s cannot be locked (%s); make sure no other job uses it", path, e.strerror or e)
        return None
    return fd


def lock_is_held(path: Path) -> bool | None:
    """Whether a process holds the :func:`file_lock` on ``path``; None where that cannot be told. Creates
    nothing; takes a shared lock for an instant."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as e:
        return True if isinstance(e, BlockingIOError) else None
    finally:
        os.close(fd)


@contextlib.contextmanager
def file_lock(path: Path, busy: Callable[[str], BaseException] | None = None, waiting: str | None = None,
              remove: bool = False) -> Iterator[None]:  # fmt: skip
    """Hold an exclusive lock on ``path`` (recording the holder's pid) for the block. Where another
    process holds it: raise ``busy(" (pid N)")``, or without ``busy`` wait, logging ``waiting``."""
    try:
        fd = _take_lock(path, wait=False, tries=5 if busy is not None else 1)
    except BlockingIOError:
        if busy is not None:
            holder = ""
            with contextlib.suppress(OSError):
                holder = path.read_text(errors="replace").strip()
            raise busy(f" (pid {holder})" if holder.isdigit() else "") from None
        if waiting:
            log.warning("%s", waiting)
        fd = _take_lock(path, wait=True)
    try:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        if remove:
            path.unlink(missing_ok=True)
        if fd is not None:
            os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        pass
    return True


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def check_writable(folder: Path, what: str) -> None:
    """Raise WriteError unless a file can be made in ``folder``: asked before long work that writes there."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as e:
        raise WriteError(f"cannot write {what} into {folder}: {e.strerror or e}") from None


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """A command's output file: an OSError writing it becomes one line that says to write elsewhere."""
    try:
        yield
    except OSError as e:
        raise WriteError(f"cannot write {path}: {e.strerror or e}; choose another place with --out") from None


def json_text(value: Any, **options: Any) -> str:
    """``value`` as JSON in valid UTF-8: escaped where it holds a file name that is no UTF-8."""
    text = json.dumps(value, ensure_ascii=False, **options)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True, **options)
    return text
