"""The lease that stands for a lock on a real S3 API: one holder at a time, an expiry, a lost lease seen."""

from __future__ import annotations

import json
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
    first = Lease.take(run, ttl_s=600)
    with pytest.raises(
        RunDirError, match=r"another bertattn process \(.*\) is writing .* lease runs \d+ s more"
    ):
        Lease.take(run, ttl_s=600)
    first.check()
    first.drop()
    Lease.take(run).drop()  # free again


def test_a_killed_holders_lease_expires_and_is_taken_over(run):
    killed = Lease.take(run, ttl_s=600)  # never dropped: its process was killed
    _rewrite(killed, expires_at=time.time() - 1)
    second = Lease.take(run, ttl_s=600)
    assert second.read()[0] == second.holder
    with pytest.raises(RunDirError, match="taken over"):
        killed.check()  # had it only been paused, it would stop before writing a manifest
    killed.drop()  # not its lease any more: left alone
    assert second.read() is not None


def test_keep_fresh_renews_before_expiry(run):
    lease = Lease.take(run, ttl_s=0.6)
    first = lease.read()[1]
    stop = lease.keep_fresh()
    try:
        time.sleep(0.5)
        assert lease.read()[1] > first
    finally:
        stop.set()
        lease.drop()
    assert lease.read() is None


def test_a_damaged_lease_counts_as_none(run):
    storage.write_bytes(f"{run}/_lease.json", b"{not json")
    Lease.take(run).drop()
