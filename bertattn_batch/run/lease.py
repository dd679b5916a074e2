"""A lease with a stated expiry: one process at a time writes a run on a store that has no locks.

Usage::

    lease = Lease.take(run_uri, ttl_s=120)    # RunDirError while another process holds a live lease
    stop = lease.keep_fresh()                  # renewed from a thread of the holder's own
    lease.check()                              # before each manifest write: still ours, and live?
    stop(); lease.drop()                       # when the run closes

A killed process cannot release its lease, so the lease carries its expiry: once that passes, the next
run takes it over (a local lock file dies with its process; a lease is the store's equivalent).

Taking is write, wait, read back: S3 and GCS are strongly consistent for one key, so of two processes
that write within ``SETTLE_S`` of each other both read back the later one, and the earlier is refused.
A holder renews only a lease it still holds, and once it finds it lost (taken over while it was paused,
or renewals failing past its expiry) it never writes again: :meth:`check` raises from then on. Expiry
compares the clocks of two hosts, which ``ttl_s`` (minutes) dwarfs.
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

#: How long a lease lives without renewal. Its holder renews it every third of that, so a run killed
#: at any point holds its --out at most this long.
DEFAULT_TTL_S = 120.0
#: How long a taker waits between writing the lease and reading it back (see the module docstring).
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
        """(holder, expiry) as stored; None where there is none, or it is unreadable (counts as none)."""
        return _read(self.uri)

    def guard(self) -> LeaseGuard:
        """What the writers of this run's parts ask before each upload (see :class:`LeaseGuard`)."""
        return LeaseGuard(self.uri, self.holder)

    def renew(self) -> None:
        """Extend the lease, if this holder still holds it; else mark it lost (and write nothing)."""
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
        """Raise unless this holder still holds a live lease: one that lost it must write nothing."""
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
        """Renew the lease every third of its life from a daemon thread; returns what stops it (and waits
        for a renewal in flight, so that none lands after :meth:`drop`)."""
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
    """Asked by a part's writer (a thread of the holder, or a Ray worker: it pickles) before it uploads:
    does the lease still name this run's holder? A writer that was paused while another run took the
    run over then stops. (An upload already past the check lands under this holder's token, a name no
    manifest of the other run lists: see ``layout.part_name``.)"""

    uri: str
    holder: str

    @property
    def token(self) -> str:
        """The holder's random part, which a part uploaded under this lease carries in its name."""
        return self.holder.rsplit(":", 1)[-1]

    def __call__(self) -> None:
        if (lost := _taken_over(self.uri, self.holder)) is not None:
            raise RunDirError(f"{self.uri}: this run's lease was {lost}; it stops without writing")


def refuse_if_held(run_uri: str) -> None:
    """RunDirError while another process holds a live lease on the run at ``run_uri``: asked by a job
    before it starts its engine too (a Ray runtime takes seconds to start, only to be refused)."""
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
    """Whether a process is writing the run now: on a store, whether its lease is live; locally, whether
    its lock is held. None where that cannot be told (no locks on this file system)."""
    if storage.is_remote(run_dir):
        held = _read(storage.join(os.fspath(run_dir), LEASE_NAME))
        return held is not None and held[1] > time.time()
    return lock_is_held(Path(storage.normalize(run_dir)) / LOCK_NAME)


def status_now(run_dir: str | os.PathLike[str], status: str) -> str:
    """A run's manifest status as a reader should say it: "running" in a manifest that no process writes
    any more (its job killed, or its last manifest write failed on a full disk) is "interrupted", as
    rerunning the extract resumes it."""
    if status == "running" and writer_is_live(run_dir) is False:
        try:  # a job that ended since its manifest was read wrote its last status first
            now = load_json(run_dir).get("status")
        except RunDirError:
            return "interrupted"
        return "interrupted" if now == "running" else str(now)
    return status


def _taken_over(uri: str, holder: str) -> str | None:
    """Why ``holder`` no longer holds the lease at ``uri`` (None while it does), looked at twice before
    saying so: losing it stops the run, and a store that answers one read wrong (a lease half rewritten
    where writes are not atomic) must not."""
    for wait in (0.5, None):
        held = _read(uri)
        if held is not None and held[0] == holder:
            return None
        if wait is not None:
            time.sleep(wait)
    return f"taken over by {held[0] if held else 'another run, which has ended'}"


def _read(uri: str) -> tuple[str, float] | None:
    """(holder, expiry) of the lease at ``uri``; None where there is none, or it stays unreadable.

    A run's every write hangs on this read, so a failed one is tried again twice: a connection left
    stale (by a process paused a while) fails once, and on a store whose writes are not atomic (HDFS,
    some fsspec ones) a reader can meet a lease half rewritten by its holder's renewal.
    """
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
