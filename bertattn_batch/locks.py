"""Exclusive file locks (``flock``) that die with their process, so no stale lock is ever left to clear.

Usage::

    fd = take_lock(run_dir / ".bertattn.lock")        # BlockingIOError while another process holds it
    fd = take_lock(path, wait=True)                   # or wait for it

Used for a run directory's one writer and for a job's first-run model training.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def take_lock(path: Path, wait: bool = False) -> int | None:
    """An exclusive lock on ``path`` (created if missing); its descriptor, to ``os.close`` when done.

    None where the platform or the file system has no locks (some network mounts): the caller goes on
    unguarded, with a warning. Raises BlockingIOError while another process holds it and not ``wait``,
    and OSError when the file cannot be created.
    """
    if sys.platform == "win32":
        return None
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BaseException as e:  # a Ctrl-C or SIGTERM while waiting too: the descriptor goes with it
        os.close(fd)
        if isinstance(e, BlockingIOError) or not isinstance(e, OSError):
            raise
        log.warning("%s cannot be locked (%s); make sure no other job uses it", path, e.strerror or e)
        return None
    return fd
