"""A lease with a stated expiry: one process at a time writes a run on a store that has no locks.

Usage::

    lease = Lease.take(run_uri, ttl_s=120)    # RunDirError while another process holds a live lease
    lease.renew()                              # kept fresh by a thread of the holder's own
    lease.check()                              # before each manifest write: still ours?
    lease.drop()                               # when the run closes

A killed process cannot release its lease, so the lease carries its expiry: once that passes, the next
run takes it over (a local lock file dies with its process; a lease is the store's equivalent). Taking
is write, then read back: S3 and GCS are strongly consistent for one key, so of two processes writing
at the same instant both read back one winner, and the loser is refused. A holder that was paused past
its expiry finds, at its next :meth:`check`, that another run took over, and stops before it writes.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from .. import storage
from ..errors import RunDirError
from .layout import LEASE_NAME

#: How long a lease lives without renewal. Its holder renews it every third of that, so a run killed
#: at any point holds its --out at most this long.
DEFAULT_TTL_S = 120.0


@dataclass
class Lease:
    """Who holds a run on a store (``holder``: host, process and a random token) and until when."""

    uri: str  # the lease object
    holder: str
    ttl_s: float
    expires_at: float = 0.0

    @classmethod
    def take(cls, run_uri: str, ttl_s: float = DEFAULT_TTL_S) -> Lease:
        """Take the lease of the run at ``run_uri``; RunDirError while another holder's is live."""
        holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        lease = cls(storage.join(run_uri, LEASE_NAME), holder, ttl_s)
        held = lease.read()
        now = time.time()
        if held is not None and held[1] > now:
            raise RunDirError(
                f"another bertattn process ({held[0]}) is writing {run_uri} (its lease runs "
                f"{held[1] - now:.0f} s more); wait for it to end or choose another --out"
            )
        lease.renew()
        if (back := lease.read()) is None or back[0] != holder:
            raise RunDirError(
                f"another bertattn process took {run_uri} at the same moment; choose another --out"
            )
        return lease

    def read(self) -> tuple[str, float] | None:
        """(holder, expiry) as stored; None where there is none, or it is unreadable (counts as none)."""
        if not storage.is_file(self.uri):
            return None
        try:
            doc = json.loads(storage.read_bytes(self.uri))
            return str(doc["holder"]), float(doc["expires_at"])
        except (ValueError, KeyError, TypeError):
            return None

    def renew(self) -> None:
        self.expires_at = time.time() + self.ttl_s
        doc = {"holder": self.holder, "expires_at": self.expires_at, "ttl_s": self.ttl_s}
        storage.write_bytes(self.uri, json.dumps(doc).encode())

    def check(self) -> None:
        """Raise unless this holder still holds the lease: one that lost it must not write the manifest."""
        held = self.read()
        if held is None or held[0] != self.holder:
            raise RunDirError(
                f"{self.uri} was taken over by {held[0] if held else 'nobody'} while this run was paused "
                "past its lease; this run stops without writing"
            )

    def drop(self) -> None:
        """Give the lease up if this holder still holds it; another's is left alone."""
        held = self.read()
        if held is not None and held[0] == self.holder:
            storage.delete(self.uri)

    def keep_fresh(self) -> threading.Event:
        """Renew the lease every third of its life from a daemon thread, until the returned event is set."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.ttl_s / 3):
                try:
                    self.renew()
                except Exception:  # the next check (before a manifest write) says what is wrong
                    continue

        threading.Thread(target=loop, name="lease", daemon=True).start()
        return stop
