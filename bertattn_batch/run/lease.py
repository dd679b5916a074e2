"""Who writes a run: on an object store, which has no locks, a lease with a stated expiry.

Usage::

    lease = Lease.take(run_uri, ttl_s=120)    # RunDirError while another process holds a live lease
    stop = lease.keep_fresh()                  # renewed from a thread of the holder's own
    lease.check()                              # before each manifest write: still ours, and live?
    stop(); lease.drop()                       # when the run closes

A killed process's lease expires, and the next run takes it over. Taking is write, wait, read back:
stores are consistent for one key, so of two takers the earlier write is refused. A holder that finds
its lease lost (taken over while it was paused, or renewals failing past its expiry) writes no more.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import storage
from .._files import lock_is_held
from ..errors import RunDirError, StorageError
from .layout import LEASE_NAME, LOCK_NAME
from .manifest import load_json

#: How long a lease lives without renewal; its holder renews it every third of that.
DEFAULT_TTL_S = 120.0
#: How long a taker waits between writing the lease and reading it back.
SETTLE_S = 1.0


@dataclass
class Lease:
    """Who holds a run on a store (``holder``: host, process and a random token) and until when."""

    uri: str  # the lease object
    holder: str
    ttl_s: float
    expires_at: float = 0.0
    lost: str | None = None  # why this holder may no longer write, once it knows
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def take(cls, run_uri: str, ttl_s: float = DEFAULT_TTL_S, settle_s: float = SETTLE_S) -> Lease:
        """Take the lease of the run at ``run_uri``; RunDirError while another holder's is live."""
        holder = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        lease = cls(storage.join(run_uri, LEASE_NAME), holder, ttl_s)
        _refuse_if_live(run_uri, lease.read())
        lease._write()
        time.sleep(settle_s)
        if (back := lease.read()) is None or back[0] != holder:
            raise RunDirError(
                f"another bertattn process took {run_uri} at the same moment; choose another --out"
            )
        return lease

    def read(self) -> tuple[str, float] | None:
        """(holder, expiry) as stored; None where there is none or it is unreadable."""
        return _read(self.uri)

    def guard(self) -> LeaseGuard:
        return LeaseGuard(self.uri, self.holder)

    def renew(self) -> None:
        """Extend the lease if this holder still holds it; else mark it lost, and write nothing."""
        with self._lock:
            if self.lost is None:
                self.lost = _taken_over(self.uri, self.holder)
            if self.lost is None and time.time() > self.expires_at:
                self.lost = "expired before it could be renewed"
            if self.lost is None:
                self._write()

    def _write(self) -> None:
        self.expires_at = time.time() + self.ttl_s
        doc = {"holder": self.holder, "expires_at": self.expires_at, "ttl_s": self.ttl_s}
        storage.write_bytes(self.uri, json.dumps(doc).encode())

    def check(self) -> None:
        """Raise unless this holder still holds a live lease."""
        if self.lost is None and time.time() > self.expires_at:
            self.lost = "expired (its renewals failed)"
        if self.lost is None:
            self.lost = _taken_over(self.uri, self.holder)
        if self.lost is not None:
            raise RunDirError(f"{self.uri}: this run's lease was {self.lost}; it stops without writing")

    def drop(self) -> None:
        """Give the lease up if this holder still holds it; another's is left alone."""
        held = self.read()
        if held is not None and held[0] == self.holder:
            storage.delete(self.uri)

    def keep_fresh(self) -> Callable[[], None]:
        """Renew the lease every third of its life from a thread; returns what stops it (waiting for a
        renewal in flight, so that none lands after :meth:`drop`)."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.ttl_s / 3):
                try:
                    self.renew()
                except (OSError, StorageError):  # a store briefly away: the next renewal, or check, says
                    continue

        thread = threading.Thread(target=loop, name="lease", daemon=True)
        thread.start()

        def stopped() -> None:
            stop.set()
            thread.join()

        return stopped


@dataclass(frozen=True)
class LeaseGuard:
    """What a part's writer (a thread, or a Ray worker: it pickles) asks before each upload: does the
    lease still name this run's holder? An upload past the check carries the holder's token in its name,
    which no other run's manifest lists."""

    uri: str
    holder: str

    @property
    def token(self) -> str:
        """The holder's random part, which its parts carry in their names."""
        return self.holder.rsplit(":", 1)[-1]

    def __call__(self) -> None:
        if (lost := _taken_over(self.uri, self.holder)) is not None:
            raise RunDirError(f"{self.uri}: this run's lease was {lost}; it stops without writing")


def refuse_if_held(run_uri: str) -> None:
    """RunDirError while another process holds a live lease on the run (asked before an engine starts)."""
    _refuse_if_live(run_uri, _read(storage.join(run_uri, LEASE_NAME)))


def _refuse_if_live(run_uri: str, held: tuple[str, float] | None) -> None:
    now = time.time()
    if held is not None and held[1] > now:
        raise RunDirError(
            f"another bertattn process ({held[0]}) is writing {run_uri} (its lease runs "
            f"{held[1] - now:.0f} s more); wait for it to end (if it was killed, rerun once its "
            "lease has run out) or choose another --out"
        )


def writer_is_live(run_dir: str | os.PathLike[str]) -> bool | None:
    """Whether a process writes the run now (its lease is live, or its lock held); None where that
    cannot be told (no locks on this file system)."""
    if storage.is_remote(run_dir):
        held = _read(storage.join(os.fspath(run_dir), LEASE_NAME))
        return held is not None and held[1] > time.time()
    return lock_is_held(Path(storage.normalize(run_dir)) / LOCK_NAME)


def status_now(run_dir: str | os.PathLike[str], status: str) -> str:
    """A run's status as a reader should say it: "running" with no process writing the run is
    "interrupted" (rerunning the extract resumes it)."""
    if status == "running" and writer_is_live(run_dir) is False:
        try:  # a job that ended since its manifest was read wrote its last status first
            now = load_json(run_dir).get("status")
        except RunDirError:
            return "interrupted"
        return "interrupted" if now == "running" else str(now)
    return status


def _taken_over(uri: str, holder: str) -> str | None:
    """Why ``holder`` no longer holds the lease at ``uri`` (None while it does), looked at twice: one
    wrong answer of a store must not stop a run."""
    for wait in (0.5, None):
        held = _read(uri)
        if held is not None and held[0] == holder:
            return None
        if wait is not None:
            time.sleep(wait)
    return f"taken over by {held[0] if held else 'another run, which has ended'}"


def _read(uri: str) -> tuple[str, float] | None:
    """(holder, expiry) of the lease at ``uri``; None where there is none or it stays unreadable. A
    failed read is tried twice more (a stale connection; a lease half rewritten where writes are not
    atomic)."""
    for wait in (0.2, 1.0, None):
        try:
            doc = json.loads(storage.read_bytes(uri))
            return str(doc["holder"]), float(doc["expires_at"])
        except StorageError:
            if not storage.is_file(uri):  # there is none (or it was dropped as we looked)
                return None
            if wait is None:
                raise
        except (ValueError, KeyError, TypeError):  # damaged: counts as none if it stays so
            if wait is None:
                return None
        time.sleep(wait)
    return None
