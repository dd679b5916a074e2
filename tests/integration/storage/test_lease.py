"""The lease that stands for a lock on a real S3 API: one holder at a time, an expiry, a lost lease seen."""

from __future__ import annotations

import json
import threading
import time

import pytest

from bertattn_batch import storage
from bertattn_batch.errors import RunDirError
from bertattn_batch.run import Lease


@pytest.fixture
def run(bucket):
    return f"s3://{bucket}/run"


def _rewrite(lease: Lease, **changes) -> None:
    doc = json.loads(storage.read_bytes(lease.uri))
    storage.write_bytes(lease.uri, json.dumps({**doc, **changes}).encode())


def test_a_second_holder_is_refused_while_the_lease_is_live(run):
    first = Lease.take(run, ttl_s=600, settle_s=0)
    with pytest.raises(
        RunDirError, match=r"another bertattn process \(.*\) is writing .* lease runs \d+ s more"
    ):
        Lease.take(run, ttl_s=600, settle_s=0)
    first.check()
    first.drop()
    Lease.take(run, settle_s=0).drop()  # free again


class _ReadBeforeTheOtherWrote(Lease):
    """A taker whose first look found no lease: it looked just before the other taker wrote."""

    looked = False

    def read(self):
        if not _ReadBeforeTheOtherWrote.looked:
            _ReadBeforeTheOtherWrote.looked = True
            return None
        return super().read()


def test_of_two_takers_at_the_same_moment_one_wins(run):
    """Both find no lease and write theirs; the wait before reading back lets the later write decide."""
    results: dict[str, object] = {}

    def take(name: str, kind: type[Lease], delay: float) -> None:
        time.sleep(delay)
        try:
            results[name] = kind.take(run, settle_s=0.6)
        except RunDirError as e:
            results[name] = e

    threads = [
        threading.Thread(target=take, args=("a", Lease, 0.0)),
        threading.Thread(target=take, args=("b", _ReadBeforeTheOtherWrote, 0.2)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results["a"], RunDirError) and "at the same moment" in str(results["a"])
    assert isinstance(results["b"], Lease)
    results["b"].check()


def test_a_killed_holders_lease_expires_and_is_taken_over(run):
    killed = Lease.take(run, ttl_s=600, settle_s=0)  # never dropped: its process was killed
    _rewrite(killed, expires_at=time.time() - 1)
    second = Lease.take(run, ttl_s=600, settle_s=0)
    assert second.read()[0] == second.holder
    # had it only been paused: it neither renews the other's lease away nor writes a manifest
    killed.renew()
    assert second.read()[0] == second.holder
    with pytest.raises(RunDirError, match="taken over by"):
        killed.check()
    killed.drop()  # not its lease any more: left alone
    second.check()


def test_a_lease_past_its_expiry_stops_its_holder(run):
    lease = Lease.take(run, ttl_s=0.3, settle_s=0)
    time.sleep(0.4)  # its renewals failed (a store away): another run may take it now
    with pytest.raises(RunDirError, match="expired"):
        lease.check()


def test_keep_fresh_renews_before_expiry(run):
    # a life long enough that a busy machine's slow store call does not outlast it (0.6 s did, at times)
    lease = Lease.take(run, ttl_s=3.0, settle_s=0)
    first = lease.read()[1]
    stop = lease.keep_fresh()
    try:
        before_expiry = time.time() + 2.5  # the first renewal is due after 1 s
        while lease.read()[1] <= first and time.time() < before_expiry:
            time.sleep(0.05)
        assert lease.read()[1] > first, "not renewed within the lease's life"
        lease.check()
    finally:
        stop()
        lease.drop()
    assert lease.read() is None


def test_a_damaged_lease_counts_as_none(run):
    storage.write_bytes(f"{run}/_lease.json", b"{not json")
    Lease.take(run, settle_s=0).drop()
