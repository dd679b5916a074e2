"""Small helpers every stage shares: atomic writes, one file lock, stale temporaries, human sizes.

Usage::

    with atomic_path(out / "report.html") as tmp:      # write tmp; it replaces the file on success
        tmp.write_text(html)
    atomic_write_text(run / "manifest.json", text)    # the same, fsynced, for a few bytes of text
    with file_lock(run / ".bertattn.lock", busy=lambda who: RunDirError(f"held by {who}")):
        ...                                           # one process at a time; the lock dies with it
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import WriteError

log = logging.getLogger(__name__)

#: Age after which a temporary file or folder is taken to be left by a process that was killed, not one
#: still running, and removed by the next of its kind (where its lock cannot tell: see ``claim_dir``).
STALE_SECONDS = 6 * 3600


def lazy_exports(
    package: str, exports: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` that import each name's module (``exports``: name ->
    module relative to ``package``, or ``module:attribute`` where the name differs) when the name is
    first asked for.

    So that importing one light module of a package does not import its heavy siblings: a host process
    (engines/host_processes.py) encodes and writes without torch or the model's code.
    """

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = exports[name].partition(":")
        value = getattr(importlib.import_module(f".{module}", package), attribute or name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted([*vars(sys.modules[package]), *exports])

    return __getattr__, __dir__


def hidden_tmp(name: str) -> str:
    """Where a file is written before it replaces ``name`` atomically (readers pass over dot files)."""
    return f".{name}.tmp"


@contextlib.contextmanager
def atomic_path(path: Path, fsync: bool = False, unique: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends without an error it replaces ``path``
    in one step (readers see the old file or the new one), else it is removed. ``unique``: a temporary
    of this process's own, for a file that two commands may write at once (two ``aggregate`` of one
    run wrote into one temporary, and the first to finish published both writes mixed)."""
    tmp = path.with_name(hidden_tmp(path.name))
    if unique:
        for left in path.parent.glob(f".{path.name}.*.tmp"):  # by a process that was killed: gone at once
            owner = left.name[len(path.name) + 2 : -len(".tmp")]
            if owner.isdigit() and not process_alive(int(owner)):
                left.unlink(missing_ok=True)
        remove_stale(path.parent, f".{path.name}.*.tmp")  # the rest once stale (a process id reused)
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


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """An output file a command writes: a failure (a read-only place, a full disk) as one line that
    says where to write instead, not an OSError."""
    try:
        yield
    except OSError as e:
        raise WriteError(f"cannot write {path}: {e.strerror or e}; choose another place with --out") from None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)  # signal 0: only whether it could be sent
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # it runs, as another user; no pid: not ours to remove
        pass
    return True


def check_writable(folder: Path, what: str) -> None:
    """Raise WriteError unless a file can be made in ``folder`` (made where missing): asked before long
    work whose result goes there, not after it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as e:
        raise WriteError(f"cannot write {what} into {folder}: {e.strerror or e}") from None


def fsync_file(path: Path) -> None:
    """Wait until ``path``'s data is on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, fsynced: a write that fails (a full disk) takes its temporary with it."""
    with atomic_path(path, fsync=True) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextlib.contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a new temporary folder beside ``path``; on success it takes ``path``'s place (an old folder
    there is moved aside first and removed), on failure it is removed. Temporaries that a killed
    process left beside ``path`` are removed once they are stale; an old folder that one left aside
    between its two renames goes back to ``path``. The caller holds a lock on ``path`` (one writer)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    restore_moved_aside(path)
    for pattern in (f".{path.name}.partial-*", f".{path.name}.old-*"):
        remove_stale(path.parent, pattern)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    claim = claim_dir(tmp)
    try:
        yield tmp
        (tmp / DIR_LOCK).unlink(missing_ok=True)  # not part of what it holds; now told by its age
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            path.rename(old)
            tmp.rename(path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if claim is not None:
            os.close(claim)


def restore_moved_aside(path: Path) -> None:
    """Put back the folder that :func:`atomic_dir` moved aside, where its process was killed before the
    new one took ``path``'s place: ``path`` would be missing, its old contents hidden, and removed as a
    stale temporary by the next writer."""
    if path.exists():
        return
    aside = sorted(path.parent.glob(f".{path.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if aside:
        with contextlib.suppress(OSError):
            aside[-1].rename(path)


def remove_tree(folder: Path, tries: int = 5) -> None:
    """Remove ``folder`` while another process may work in it (an ``aggregate`` adding and removing its
    work files as an ``--overwrite`` clears the run): a file gone meanwhile is no error, and a folder
    that gained one is cleared again."""

    def gone_is_fine(function: Any, path: str, error: Any) -> None:
        error = error if isinstance(error, BaseException) else error[1]  # onerror passes exc_info
        if not isinstance(error, FileNotFoundError):
            raise error

    # onexc from Python 3.12, where onerror is deprecated
    handler = {"onexc" if sys.version_info >= (3, 12) else "onerror": gone_is_fine}
    for attempt in range(tries):
        try:
            shutil.rmtree(folder, **handler)
            return
        except OSError as e:
            if e.errno != errno.ENOTEMPTY or attempt == tries - 1:
                raise
            time.sleep(0.1)


def remove_stale(parent: Path, pattern: str) -> None:
    """Remove the files and folders in ``parent`` matching ``pattern`` that were left behind: a folder
    claimed with :func:`claim_dir` as soon as no process holds its lock, anything else once it is older
    than ``STALE_SECONDS``."""
    for stale in parent.glob(pattern):
        with contextlib.suppress(OSError):  # another process may remove it first
            held = lock_is_held(stale / DIR_LOCK) if stale.is_dir() else None
            if held is False or (held is None and time.time() - stale.stat().st_mtime > STALE_SECONDS):
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink()


#: The lock that the process working in a temporary folder holds in it (:func:`claim_dir`).
DIR_LOCK = ".claimed"


def claim_dir(path: Path) -> int | None:
    """Hold a lock in the (new) folder ``path`` for as long as this process runs or until the returned
    descriptor is closed, so that ``remove_stale`` removes the folder at once when its process was killed
    (a ``kill -9`` runs no cleanup) instead of hours later. The lock file gets its name only once held:
    a folder whose lock is there but free is surely left behind. None where no lock can be taken (no
    locks on this file system, a full disk): the folder is then told by its age, and holds no lock file."""
    if sys.platform == "win32":
        return None
    import fcntl

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
    """An exclusive ``flock`` on ``path`` (created if missing): its descriptor, or None where the platform
    or the file system has no locks (some network mounts; a warning says so). Raises BlockingIOError
    while another process holds it and not ``wait`` (after ``tries`` attempts 0.1 s apart: a reader
    asking ``lock_is_held`` holds it for an instant), and OSError when the file cannot be created."""
    if sys.platform == "win32":
        return None
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for attempt in range(tries):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                break
            except BlockingIOError:
                if attempt == tries - 1:
                    raise
                time.sleep(0.1)
    except BaseException as e:  # a Ctrl-C or SIGTERM while waiting too: the descriptor goes with it
        os.close(fd)
        if isinstance(e, BlockingIOError) or not isinstance(e, OSError):
            raise
        log.warning("%s cannot be locked (%s); make sure no other job uses it", path, e.strerror or e)
        return None
    return fd


def lock_is_held(path: Path) -> bool | None:
    """Whether a process holds the ``file_lock`` on ``path`` now; None where that cannot be told (no
    such file, no locks on this platform or file system). Creates nothing; takes a shared lock for an
    instant, which a writer starting then waits out (``file_lock`` tries again before it gives up)."""
    if sys.platform == "win32":
        return None
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # also lets go of the lock taken
    return False


@contextlib.contextmanager
def file_lock(
    path: Path,
    busy: Callable[[str], BaseException] | None = None,
    waiting: str | None = None,
    remove: bool = False,
) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` for the block. It dies with its process, so no stale lock is
    ever left to clear; the file records the holder's pid for the message of the next one.

    Where another process holds it: with ``busy``, raise ``busy(holder)`` (holder: ``" (pid N)"`` or
    ``""``); else wait for it, logging ``waiting`` once. ``remove``: delete the file when done (a lock
    for a one-off task, such as a training). An OSError taking it comes back as is.
    """
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
            with contextlib.suppress(OSError):  # a full disk fails the holder's own writes instead
                os.ftruncate(fd, 0)
                os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        if remove:
            path.unlink(missing_ok=True)
        if fd is not None:
            os.close(fd)


def bar_size() -> dict[str, Any]:
    """tqdm's size options for a progress bar on standard error: the terminal's width as it changes, or
    a fixed size where the terminal reports none (0 columns or rows: a pseudo-terminal opened without
    one, as ``script`` and ``docker run -t`` open them), on which tqdm draws nothing at all."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # not a terminal: no bar is shown there anyway
        return {"dynamic_ncols": True}
    if size.columns and size.lines:
        return {"dynamic_ncols": True}
    return {"ncols": size.columns or 100, "nrows": size.lines or 24}


def json_text(value: Any, **options: Any) -> str:
    """``value`` as JSON that is valid UTF-8: its text as it is (Chinese stays readable), except where
    it holds a file name that is no UTF-8 (``os`` spells its bytes as lone surrogates, which no UTF-8
    file may hold): then escaped, which ``json.loads`` reads back to the same name."""
    text = json.dumps(value, ensure_ascii=False, **options)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True, **options)
    return text


def human_bytes(n: float) -> str:
    """Bytes in decimal units (1 MB = 1,000,000 bytes), as the docs and object stores count them."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB"):
        n /= 1000
        if round(n, 1) < 1000:  # 999,999 bytes: 1.0 MB, not 1000.0 KB
            return f"{n:.1f} {unit}"
    return f"{n / 1000:.1f} GB"
