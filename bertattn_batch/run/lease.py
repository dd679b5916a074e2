"""A lease object with a stated expiry: one run at a time on a store that has no locks and no rename.

Usage::

    fs, root = storage.resolve("s3://bucket/run")
    lease = take_lease(fs, root, run_id, ttl_s=600)   # RunDirError while another run holds it
    renew_lease(fs, root, run_id, ttl_s=600)          # the driver renews at each commit
    drop_lease(fs, root, run_id)                       # on finalize or failure

A killed run cannot release its lease, so the lease carries its expiry: once that passes, the next
run takes it over. A local lock file dies with its process; a lease is the object store's equivalent.
Taking it is write-then-read-back (stores are strongly consistent for a single key); two drivers
writing within the same instant both read back one winner, and the loser is refused.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from bertattn_batch.errors import RunDirError

#: The lease's object name under the run directory.
LEASE_NAME = "_lease.json"
#: How long a lease lives without renewal: long enough for a slow window, short enough to resume soon.
DEFAULT_TTL_S = 600.0


@dataclass(frozen=True)
class Lease:
    """Who holds the run directory and until when (seconds since the epoch)."""

    run_id: str
    expires_at: float

    def live(self, now: float) -> bool:
        return now < self.expires_at


def read_lease(fs, root: str) -> Lease | None:
    """The lease as stored, or None where there is none (or it is unreadable, which counts as none)."""
    import pyarrow.fs as pafs

    path = f"{root}/{LEASE_NAME}"
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    try:
        with fs.open_input_stream(path) as f:
            doc = json.loads(f.read())
        return Lease(str(doc["run_id"]), float(doc["expires_at"]))
    except (ValueError, KeyError, TypeError):
        return None


def take_lease(fs, root: str, run_id: str, ttl_s: float = DEFAULT_TTL_S, now: float | None = None) -> Lease:
    """Take (or renew) the lease for ``run_id``; RunDirError while another run's lease is live."""
    now = time.time() if now is None else now
    held = read_lease(fs, root)
    if held is not None and held.run_id != run_id and held.live(now):
        raise RunDirError(
            f"{root} is in use by run {held.run_id} (lease expires in {held.expires_at - now:.0f} s); "
            "wait for it, or for its lease to expire if it was killed"
        )
    mine = Lease(run_id, now + ttl_s)
    with fs.open_output_stream(f"{root}/{LEASE_NAME}") as f:
        f.write(json.dumps({"run_id": mine.run_id, "expires_at": mine.expires_at}).encode())
    back = read_lease(fs, root)
    if back is None or back.run_id != run_id:
        raise RunDirError(f"{root} was taken by run {back.run_id if back else '?'} at the same moment")
    return mine


renew_lease = take_lease


def drop_lease(fs, root: str, run_id: str) -> None:
    """Give the lease up if this run still holds it; another run's lease is left alone."""
    held = read_lease(fs, root)
    if held is not None and held.run_id == run_id:
        fs.delete_file(f"{root}/{LEASE_NAME}")
