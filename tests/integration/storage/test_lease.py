"""The run-directory lease on a real S3 API: a second run is refused, a killed run's lease expires."""

from __future__ import annotations

import pytest

from bertattn_batch.errors import RunDirError
from bertattn_batch.run.lease import drop_lease, read_lease, renew_lease, take_lease
from bertattn_batch.storage import resolve


@pytest.fixture
def store(bucket):
    return resolve(f"s3://{bucket}/run")


def test_second_run_is_refused_while_the_lease_is_live(store):
    fs, root = store
    take_lease(fs, root, "run-a", ttl_s=600, now=1000.0)
    with pytest.raises(RunDirError, match=r"in use by run run-a \(lease expires in 590 s\)"):
        take_lease(fs, root, "run-b", ttl_s=600, now=1010.0)
    assert read_lease(fs, root).run_id == "run-a"


def test_a_killed_runs_lease_expires_and_is_taken_over(store):
    fs, root = store
    take_lease(fs, root, "run-a", ttl_s=60, now=1000.0)  # run-a is killed: it never drops the lease
    lease = take_lease(fs, root, "run-b", ttl_s=60, now=1061.0)
    assert lease.run_id == "run-b" and read_lease(fs, root).expires_at == 1121.0


def test_renewal_extends_and_drop_releases(store):
    fs, root = store
    take_lease(fs, root, "run-a", ttl_s=60, now=1000.0)
    renew_lease(fs, root, "run-a", ttl_s=60, now=1050.0)
    with pytest.raises(RunDirError):
        take_lease(fs, root, "run-b", now=1070.0)  # past the first expiry, not the renewed one
    drop_lease(fs, root, "run-b")  # not its lease: left alone
    assert read_lease(fs, root).run_id == "run-a"
    drop_lease(fs, root, "run-a")
    assert read_lease(fs, root) is None
    assert take_lease(fs, root, "run-b", now=1071.0).run_id == "run-b"


def test_a_damaged_lease_counts_as_none(store):
    fs, root = store
    with fs.open_output_stream(f"{root}/_lease.json") as f:
        f.write(b"{not json")
    assert read_lease(fs, root) is None
    assert take_lease(fs, root, "run-b", now=1.0).run_id == "run-b"
