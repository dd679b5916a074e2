"""The lease that stands for a lock on a real S3 API: one holder at a time, an expiry, a lost lease seen."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest

from bertattn_batch import storage
from bertattn_batch.errors import RunDirError
from bertattn_batch.run import Lease
from bertattn_batch.run.lease import process_id


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
            deadline = time.time() + 30
            while not storage.is_file(self.uri) and time.time() < deadline:  # until the other wrote
                time.sleep(0.01)
            return None
        return super().read()


@pytest.mark.parametrize("store", ["s3", "memory"])
def test_of_two_takers_at_the_same_moment_one_wins(bucket, store):
    """Both find no lease and write theirs. On S3 the write is conditional: the first one wins, the
    store refuses the other; elsewhere the wait before reading back lets the later write win."""
    run = f"s3://{bucket}/run" if store == "s3" else f"memory://leases-{uuid.uuid4().hex[:8]}/run"
    _ReadBeforeTheOtherWrote.looked = False
    results: dict[str, object] = {}

    def take(name: str, kind: type[Lease], delay: float) -> None:
        time.sleep(delay)
        try:
            results[name] = kind.take(run, settle_s=0.6)
        except RunDirError as e:
            results[name] = e

    threads = [
        threading.Thread(target=take, args=("a", Lease, 0.0)),
        threading.Thread(target=take, args=("b", _ReadBeforeTheOtherWrote, 0.0)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winner, loser = ("a", "b") if store == "s3" else ("b", "a")
    assert isinstance(results[loser], RunDirError) and "at the same moment" in str(results[loser])
    assert isinstance(results[winner], Lease)
    results[winner].check()


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


def test_a_drop_racing_a_takeover_leaves_the_takers_lease(run, monkeypatch):
    """A holder whose lease ran out drops it as another takes it over, its look at the lease made just
    before the other wrote: the delete is conditional on the version it wrote last, so the taker's stays."""
    from bertattn_batch.run import lease as lease_module

    paused = Lease.take(run, ttl_s=600, settle_s=0)
    looked = lease_module._read(paused.uri)
    taker = Lease(paused.uri, "taker", 600.0, conditional=True, version=paused.version)
    taker._write()  # what Lease.take writes once the paused holder's lease has run out
    monkeypatch.setattr(lease_module, "_read", lambda uri: looked)  # it still sees its own
    paused.drop()
    assert storage.is_file(paused.uri) and json.loads(storage.read_bytes(paused.uri))["holder"] == "taker"


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


@dataclass
class _ParkedRenewal(Lease):
    """A holder that stops in its first renewal, after its checks and before its write, until let go."""

    parked: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)

    def _write(self) -> None:
        if self.expires_at:  # renewing, not taking
            self.parked.set()
            assert self.go.wait(60)
        super()._write()


def test_a_holder_paused_in_its_renewal_does_not_renew_over_the_run_that_took_it_over(run):
    paused = _ParkedRenewal.take(run, ttl_s=1.0, settle_s=0)
    renewal = threading.Thread(target=paused.renew)
    renewal.start()
    assert paused.parked.wait(10)
    time.sleep(1.2)  # its lease runs out while it is paused: another run takes the run over
    other = Lease.take(run, ttl_s=600, settle_s=0)
    paused.go.set()
    renewal.join(60)
    assert paused.lost and "taken over" in paused.lost
    assert other.read().holder == other.holder
    other.check()
    with pytest.raises(RunDirError, match="taken over"):
        paused.check()


_HOLD = (
    "import sys, time\nfrom bertattn_batch.run import Lease\nLease.take(sys.argv[1], ttl_s=600, settle_s=0)\n"
)
_HOLD += "print('held', flush=True)\ntime.sleep(600)\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tells a process's start time from /proc")
def test_a_killed_holders_lease_is_taken_over_at_once_on_its_machine_only(run, caplog):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, run], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError, match="another bertattn process"):  # alive: it waits
            Lease.take(run, settle_s=0)
    finally:
        holder.kill()
        holder.wait()
    doc = json.loads(storage.read_bytes(f"{run}/_lease.json"))
    with caplog.at_level(logging.WARNING):
        taken = Lease.take(run, ttl_s=600, settle_s=0)
    assert "is gone: this run takes it over" in caplog.text and str(holder.pid) in caplog.text
    taken.check()
    # the same process on another machine, or one whose pid this machine has not seen die: it waits
    host, rest = doc["process"].split("/", 1)
    for process in (f"{host}-elsewhere/{rest}", None):
        storage.write_bytes(f"{run}/_lease.json", json.dumps({**doc, "process": process}).encode())
        with pytest.raises(RunDirError, match="another bertattn process"):
            Lease.take(run, settle_s=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tells a process's start time from /proc")
def test_a_pid_reused_since_does_not_hold_the_lease(run):
    """A lease names its holder's process with its start time: another process with the same pid is
    not its holder (this test's own process, with another start time, stands for one)."""
    me = process_id(os.getpid())
    held = Lease.take(run, ttl_s=600, settle_s=0)
    for process, live in ((me, True), (me.rsplit("/", 1)[0] + "/1", False)):
        _rewrite(held, process=process)
        if live:
            with pytest.raises(RunDirError, match="another bertattn process"):
                Lease.take(run, settle_s=0)
        else:
            Lease.take(run, settle_s=0).drop()
