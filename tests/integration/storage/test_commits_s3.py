"""A run's manifest on S3 is written by compare-and-swap (conditional writes, on a real S3 API on
loopback): a writer paused between its lease check and its commit, whose run another writer took over
and finished, has its commit refused and leaves the other's run whole."""

from __future__ import annotations

import json
import threading

import pyarrow as pa
import pytest
from helpers import RUN_HEADER
from typer.testing import CliRunner

from bertattn_batch import schema, storage
from bertattn_batch.cli import app
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.errors import RunDirError
from bertattn_batch.run import MANIFEST, StoredRunDir, read_manifest

runner = CliRunner()
HEADER = RUN_HEADER
REFUSED = "committed to this run since this one last did"


def test_the_conditional_put_writes_first_and_matching_versions_only(bucket):
    uri = f"s3://{bucket}/run/{MANIFEST}"
    assert storage.etag(uri) is None
    first = storage.put_if(uri, b"1", None)  # the first manifest: only where there is none
    assert storage.etag(uri) == first
    with pytest.raises(storage.CommitRefused):
        storage.put_if(uri, b"other first", None)
    second = storage.put_if(uri, b"2", first)  # an update of the version last read
    assert second != first and storage.etag(uri) == second
    with pytest.raises(storage.CommitRefused):
        storage.put_if(uri, b"stale", first)  # another writer committed since
    assert storage.read_bytes(uri) == b"2"


def _tables() -> dict[str, pa.Table]:
    return {t: schema.arrow(t).empty_table() for t in schema.TABLES}


class _Parked(StoredRunDir):
    """A writer that stops between its lease check and its ``park_at``-th manifest write until let go."""

    lease_settle_s = 0.0
    lease_ttl_s = 600.0

    def __init__(self, *args, park_at: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.park_at, self.writes = park_at, 0
        self.parked, self.go = threading.Event(), threading.Event()

    def _write_manifest(self) -> None:
        self.writes += 1
        if self.writes == self.park_at:
            self.parked.set()
            assert self.go.wait(60)
        super()._write_manifest()


def _write(rd: StoredRunDir, until: int) -> None:
    """What a job does with a run: a pass whose parts of 10 rows follow the committed ones, finalized."""
    rd.begin_pass(0)
    start = max((p.end_row for p in rd.parts), default=0)
    for row in range(start, until, 10):
        rd.commit(rd.part_writer.stage(row, row + 10, _tables()))
    rd.finalize({})


def _expire_lease(run: str) -> None:
    lease = f"{run}/_lease.json"
    storage.write_bytes(
        lease, json.dumps({**json.loads(storage.read_bytes(lease)), "expires_at": 0}).encode()
    )


def _writing(writer: _Parked, rows: int) -> tuple[threading.Thread, list[BaseException]]:
    """``writer`` writing ``rows`` rows on a thread of its own, started; the list gets what it raised."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            with writer:
                _write(writer, rows)
        except BaseException as e:
            failed.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, failed


# A's manifest writes: opening the run, beginning the pass, committing part 1, part 2, finalizing
@pytest.mark.parametrize("park_at", [1, 2, 3, 4, 5])
def test_a_writer_paused_before_any_commit_is_refused_and_the_run_it_lost_stays_whole(bucket, park_at):
    run = f"s3://{bucket}/run-{park_at}"  # (the bucket's name, cut short, is the same for each)
    a = _Parked(run, HEADER, park_at=park_at)
    thread, failed = _writing(a, 20)
    assert a.parked.wait(60), f"writer A never reached its commit: {failed}"
    _expire_lease(run)  # A's lease ran out while it was paused: B takes the run over and finishes it
    b = _Parked(run, HEADER, park_at=0)
    with b:
        _write(b, 40)
    taken_over = storage.read_bytes(f"{run}/{MANIFEST}")
    listed = {t: {p.name for p in read_manifest(run).parts} for t in schema.TABLES}
    a.go.set()
    thread.join(60)
    assert len(failed) == 1 and isinstance(failed[0], RunDirError) and REFUSED in str(failed[0]), failed
    assert storage.read_bytes(f"{run}/{MANIFEST}") == taken_over  # A wrote nothing more
    manifest = read_manifest(run)
    assert manifest.status == "complete" and [(p.start_row, p.end_row) for p in manifest.parts] == [
        (r, r + 10) for r in range(0, 40, 10)
    ]
    for t, names in listed.items():
        assert names <= set(storage.list_names(f"{run}/{t}")), t
    # the documented resume on B's run: A's uploads are swept, B's parts are kept
    with StoredRunDir(run, HEADER) as c:
        assert c.parts == manifest.parts
        _write(c, 40)
    for t, names in listed.items():
        assert set(storage.list_names(f"{run}/{t}")) == names, t
    assert read_manifest(run).resumes == manifest.resumes + 1  # the resume committed, as its own


class _ParkedClear(_Parked):
    """An --overwrite that stops as it begins to clear the run out, or (``park_at`` 1) between its lease
    check and the manifest write that replaces the old run, until let go."""

    def _clear(self) -> None:
        if self.park_at == 0:
            self.parked.set()
            assert self.go.wait(60)
        super()._clear()


@pytest.mark.parametrize("park_at", [0, 1])
def test_an_overwrite_paused_before_it_clears_deletes_nothing_of_the_run_that_took_it_over(bucket, park_at):
    run = f"s3://{bucket}/run-over-{park_at}"
    with StoredRunDir(run, HEADER) as first:
        _write(first, 20)
    a = _ParkedClear(run, HEADER, "overwrite", park_at=park_at)
    thread, failed = _writing(a, 20)
    assert a.parked.wait(60), f"writer A never reached its clear-out: {failed}"
    _expire_lease(run)
    with _Parked(run, HEADER, park_at=0) as b:  # resumes the run and finishes it
        _write(b, 40)
    taken_over = storage.read_bytes(f"{run}/{MANIFEST}")
    objects = storage.list_names(run, recursive=True)
    a.go.set()
    thread.join(60)
    assert len(failed) == 1 and isinstance(failed[0], RunDirError), failed
    assert storage.read_bytes(f"{run}/{MANIFEST}") == taken_over
    assert storage.list_names(run, recursive=True) == objects
    assert [(p.start_row, p.end_row) for p in read_manifest(run).parts] == [
        (r, r + 10) for r in range(0, 40, 10)
    ]


def test_an_extract_paused_mid_run_leaves_the_run_that_took_it_over_whole(
    bucket, drug_rows, tiny_en_dir, tmp_path, monkeypatch
):
    """The whole job: extract A parks before committing its second part, B takes the run over and
    finishes it, A wakes and is refused; validate finds B's run clean, and the same command again
    keeps B's parts."""
    import pyarrow.parquet as pq

    rows = [{"doc_id": r["doc_id"], "text": r["text"][:200]} for r in drug_rows[:30]]
    corpus = tmp_path / "reviews.parquet"
    pq.write_table(pa.Table.from_pylist(rows), corpus)
    run = f"s3://{bucket}/runs/paused"
    spec = JobSpec(inputs=InputSpec([str(corpus)], id_col="doc_id"), model=str(tiny_en_dir), out=run,
                   window=10, batch_tokens=1500, progress=False)  # fmt: skip
    monkeypatch.setattr(StoredRunDir, "lease_settle_s", 0.0)
    parked, go, writes = threading.Event(), threading.Event(), []
    write_manifest = StoredRunDir._write_manifest

    def park_a(self: StoredRunDir) -> None:
        if threading.current_thread().name == "a":
            writes.append(1)
            if len(writes) == 4:  # opening, beginning the pass, part 1: then before part 2's commit
                parked.set()
                assert go.wait(120)
        write_manifest(self)

    monkeypatch.setattr(StoredRunDir, "_write_manifest", park_a)
    failed: list[BaseException] = []

    def writer_a() -> None:
        try:
            run_job(spec)
        except BaseException as e:
            failed.append(e)

    thread = threading.Thread(target=writer_a, name="a")
    thread.start()
    assert parked.wait(300), "extract A never reached its second commit"
    _expire_lease(run)
    run_job(spec)
    taken_over = read_manifest(run)
    go.set()
    thread.join(300)
    assert len(failed) == 1 and isinstance(failed[0], RunDirError) and REFUSED in str(failed[0]), failed
    assert read_manifest(run).to_dict() == taken_over.to_dict()
    assert taken_over.status == "complete" and taken_over.counts["predictions"] == 30
    listed = {p.files["predictions"] for p in taken_over.parts}
    r = runner.invoke(app, ["validate", run, "--no-source"])
    strays = [n for n in storage.list_names(f"{run}/predictions") if f"predictions/{n}" not in listed]
    assert r.exit_code == (1 if strays else 0), r.output
    args = ["extract", str(corpus), "--model", str(tiny_en_dir), "--out", run, "--id-col", "doc_id",
            "--window", "10", "--batch-tokens", "1500", "--no-progress"]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert {f"predictions/{n}" for n in storage.list_names(f"{run}/predictions")} == listed
    assert [p.name for p in read_manifest(run).parts] == [p.name for p in taken_over.parts]
    r = runner.invoke(app, ["validate", run])
    assert r.exit_code == 0, r.output
