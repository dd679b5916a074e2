"""Who writes a run: on an object store, which has no locks, a lease with a stated expiry, renewed from a
thread of its holder and checked before each manifest write. On S3 every write of the lease is a
compare-and-swap on the version its writer last saw; elsewhere taking is write, wait, read back. A killed
process's lease expires (on its own machine, at once); a holder that finds its lease lost writes no more.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from .. import storage
from .._files import lock_is_held, process_alive
from ..errors import RunDirError, StorageError
from .manifest import LEASE_NAME, LOCK_NAME, load_json

log = logging.getLogger(__name__)

#: How long a lease lives without renewal; its holder renews it every third of that.
DEFAULT_TTL_S = 120.0
#: How long a taker waits between writing the lease and reading it back (stores without conditional writes).
SETTLE_S = 1.0


class Held(NamedTuple):
    """A lease as stored: holder, expiry, the holder's :func:`process_id` and the object's ETag."""

    holder: str
    expires_at: float
    process: str | None = None
    version: str | None = None

    def live(self) -> bool:
        """Unexpired, and not held by a process of this machine (host, boot, pid namespace) that is gone."""
        mine, process = process_id(os.getpid()), self.process
        if not process or mine is None or process.rsplit("/", 2)[0] != mine.rsplit("/", 2)[0]:
            return self.expires_at > time.time()  # another machine's: its expiry decides
        pid = process.rsplit("/", 2)[1]
        now = process_id(int(pid)) if pid.isdigit() else process
        gone = now != process if now is not None else not process_alive(int(pid))
        return self.expires_at > time.time() and not gone


@dataclass
class Lease:
    """Who holds a run on a store (``holder``: host, process and a random token) and until when."""

    uri: str  # the lease object
    holder: str
    ttl_s: float
    conditional: bool = False  # whether its writes are compare-and-swaps on ``version``
    version: str | None = None  # the lease object's version this holder last read or wrote
    expires_at: float = 0.0
    lost: str | None = None  # why this holder may no longer write, once it knows
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def take(cls, run_uri: str, ttl_s: float = DEFAULT_TTL_S, settle_s: float = SETTLE_S) -> Lease:
        """Take the lease of the run at ``run_uri``; RunDirError while another holder's is live."""
        holder = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        uri = storage.join(run_uri, LEASE_NAME)
        lease = cls(uri, holder, ttl_s, conditional=storage.has_conditional_writes(run_uri))
        held = lease.read()
        _refuse_if_live(run_uri, held)
        if held is not None and held.expires_at > time.time():  # not live: its process is gone
            log.warning("%s: its writer (%s) ran on this machine and is gone: this run takes it over",
                        run_uri, held.holder)  # fmt: skip
        lease.version = held.version if held else None
        try:
            lease._write()
            if not lease.conditional:
                time.sleep(settle_s)
                if (back := lease.read()) is None or back.holder != holder:
                    raise storage.CommitRefused(uri)
        except storage.CommitRefused:
            raise RunDirError(
                f"another bertattn process took {run_uri} at the same moment; choose another --out"
            ) from None
        return lease

    def read(self) -> Held | None:
        """The lease as stored; None where there is none. A damaged one is an expired one of no holder."""
        version = storage.etag(self.uri) if self.conditional else None
        held = _read(self.uri)
        return held._replace(version=version) if held else Held("", 0.0, version=version) if version else None

    def renew(self) -> None:
        """Extend the lease if this holder still holds it; else mark it lost, and write nothing."""
        with self._lock:
            if self.lost is None and time.time() > self.expires_at:
                self.lost = "expired before it could be renewed"
            if self.lost is None and not self.conditional:
                self.lost = _taken_over(self.uri, self.holder)
            if self.lost is None:
                try:
                    self._write()
                except storage.CommitRefused:  # another holder's, or a write of ours whose answer was lost
                    if (held := self.read()) is None or held.holder != self.holder:
                        self.lost = "taken over by another run"
                    else:
                        self.version = held.version
                        self._write()

    def _write(self) -> None:
        """Write the lease, renewed, conditional on its version where the store can (CommitRefused)."""
        expires_at = time.time() + self.ttl_s
        doc = {"holder": self.holder, "expires_at": expires_at, "ttl_s": self.ttl_s,
               "process": process_id(os.getpid())}  # fmt: skip
        if self.conditional:
            try:
                self.version = storage.put_if(self.uri, json.dumps(doc).encode(), self.version)
            except storage.NoConditionalWrites:  # (the manifest's write says what that means)
                self.conditional = False
        if not self.conditional:
            storage.write_bytes(self.uri, json.dumps(doc).encode())
        self.expires_at = expires_at

    def check(self) -> None:
        """Raise unless this holder still holds a live lease."""
        if self.lost is None and time.time() > self.expires_at:
            self.lost = "expired (its renewals failed)"
        if self.lost is None:
            self.lost = _taken_over(self.uri, self.holder)
        if self.lost is not None:
            raise RunDirError(f"{self.uri}: this run's lease was {self.lost}; it stops without writing")

    def drop(self) -> None:
        """Give the lease up if this holder still holds it; another's is left alone. On S3 the delete is
        conditional on the version this holder wrote last, so a taker's lease written meanwhile stays."""
        if self.conditional and self.version is not None:
            try:
                return storage.delete_if(self.uri, self.version)
            except storage.CommitRefused:  # another holder's now
                return
            except storage.NoConditionalWrites:
                self.conditional = False
        held = _read(self.uri)
        if held is not None and held.holder == self.holder:
            storage.delete(self.uri)

    def keep_fresh(self) -> Callable[[], None]:
        """Renew the lease every third of its life from a thread; returns what stops it (and waits)."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.ttl_s / 3):
                with contextlib.suppress(OSError, StorageError):  # a store briefly away: the next one says
                    self.renew()

        thread = threading.Thread(target=loop, name="lease", daemon=True)
        thread.start()

        def stopped() -> None:
            stop.set()
            thread.join()

        return stopped


@dataclass(frozen=True)
class LeaseGuard:
    """What a part's writer (a thread, or a Ray worker: it pickles) asks before each upload: does the
    lease still name this run's holder?"""

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


def _refuse_if_live(run_uri: str, held: Held | None) -> None:
    if held is not None and held.live():
        raise RunDirError(
            f"another bertattn process ({held.holder}) is writing {run_uri} (its lease runs "
            f"{held.expires_at - time.time():.0f} s more); wait for it to end (if it was killed on another "
            "machine, rerun once its lease has run out) or choose another --out"
        )


def writer_is_live(run_dir: str | os.PathLike[str]) -> bool | None:
    """Whether a process writes the run now (a live lease, a held lock); None where that cannot be told."""
    if storage.is_remote(run_dir):
        held = _read(storage.join(os.fspath(run_dir), LEASE_NAME))
        return held is not None and held.live()
    return lock_is_held(Path(storage.normalize(run_dir)) / LOCK_NAME)


def status_now(run_dir: str | os.PathLike[str], status: str) -> str:
    """A run's status as a reader should say it: "running" with no process writing it is "interrupted"."""
    if status == "running" and writer_is_live(run_dir) is False:
        try:  # a job that ended since its manifest was read wrote its last status first
            now = load_json(run_dir).get("status")
        except RunDirError:
            return "interrupted"
        return "interrupted" if now == "running" else str(now)
    return status


def process_id(pid: int) -> str | None:
    """Process ``pid`` as told apart on this machine (host, boot, pid namespace, pid, start time); None
    where /proc cannot tell."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
        started = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
    return f"{socket.gethostname()}/{boot}/{namespace}/{pid}/{started}"


def _taken_over(uri: str, holder: str) -> str | None:
    """Why ``holder`` no longer holds the lease at ``uri`` (None while it does), looked at twice."""
    for wait in (0.5, None):
        held = _read(uri)
        if held is not None and held.holder == holder:
            return None
        if wait is not None:
            time.sleep(wait)
    return f"taken over by {held.holder if held else 'another run, which has ended'}"


def _read(uri: str) -> Held | None:
    """The lease at ``uri``; None where there is none or it stays unreadable (after two more tries)."""
    for wait in (0.2, 1.0, None):
        try:
            doc = json.loads(storage.read_bytes(uri))
            return Held(str(doc["holder"]), float(doc["expires_at"]), doc.get("process"))
        except StorageError:
            if not storage.is_file(uri):  # there is none (or it was dropped as we looked)
                return None
            if wait is None:
                raise
        except (ValueError, KeyError, TypeError, AttributeError):  # damaged: counts as none if it stays so
            if wait is None:
                return None
        time.sleep(wait)
    return None
