"""The run directory on a store without rename or locks, exercised on fsspec's in-memory filesystem
(the S3 tests run the same protocol against a real S3 API): the manifest is the commit point, parts
have their final names from the start, uploads no manifest lists are swept, one holder at a time. A
store without conditional writes takes a run only with ``unsafe_store_commits``."""

from __future__ import annotations

import json
import uuid

import pyarrow as pa
import pytest
from helpers import RUN_HEADER

from bertattn_batch import schema, storage
from bertattn_batch.errors import RunDirError
from bertattn_batch.run import MANIFEST, RunDir, StoredRunDir, committed_files, read_manifest, run_dir_class

HEADER = RUN_HEADER


@pytest.fixture
def run(monkeypatch) -> str:
    monkeypatch.setattr(StoredRunDir, "lease_settle_s", 0.0)  # one process here: no race to settle
    return f"memory://runs-{uuid.uuid4().hex[:8]}/r1"


def _tables() -> dict[str, pa.Table]:
    return {t: schema.arrow(t).empty_table() for t in schema.TABLES}


def test_the_class_follows_the_uri():
    assert run_dir_class("s3://b/r") is StoredRunDir and run_dir_class("memory://b/r") is StoredRunDir
    assert run_dir_class("runs/r1") is RunDir and run_dir_class("/abs/r") is RunDir


def test_a_store_without_conditional_writes_is_refused_unless_the_risk_is_accepted(run):
    with pytest.raises(RunDirError, match=r"has no conditional writes.*--unsafe-store-commits"):
        StoredRunDir(run, HEADER).open()
    assert storage.list_names(run, recursive=True) == []  # not even a lease


def test_each_commit_rewrites_the_manifest_and_parts_keep_their_names(run):
    with StoredRunDir(run, HEADER, unsafe_store_commits=True) as rd:
        rd.begin_pass(0)
        entry = rd.part_writer.stage(0, 10, _tables())
        # uploaded under its final name (its window's, and its writer's), yet unread until listed
        name = f"part-000000000000-{rd.part_writer.lease.token}.parquet"
        assert entry.name == name and name in storage.list_names(f"{run}/predictions")
        assert read_manifest(run).parts == [] and committed_files(run) == []
        rd.commit(entry)
        assert [p.name for p in read_manifest(run).parts] == [name]
        assert [p.name for p in committed_files(run)] == [name]
        assert "_lease.json" in storage.list_names(run)
        rd.finalize({})
    names = storage.list_names(run, recursive=True)
    assert "_lease.json" not in names and not any(n.startswith(("commits", "_")) for n in names)
    assert json.loads(storage.read_bytes(f"{run}/{MANIFEST}"))["status"] == "complete"


def test_an_upload_no_manifest_lists_is_swept_on_reopening_and_on_failure(run):
    with StoredRunDir(run, HEADER, unsafe_store_commits=True) as rd:
        rd.begin_pass(0)
        first = rd.part_writer.stage(0, 10, _tables())
        rd.commit(first)
        rd.part_writer.stage(10, 20, _tables())  # a worker's upload; its process dies before the commit
    assert len(storage.list_names(f"{run}/tokens")) == 2
    with StoredRunDir(run, HEADER, unsafe_store_commits=True) as rd:
        assert [p.start_row for p in rd.parts] == [0]
        assert storage.list_names(f"{run}/tokens") == [first.name]
    with pytest.raises(ValueError), StoredRunDir(run, HEADER, unsafe_store_commits=True) as rd:
        rd.begin_pass(0)
        rd.part_writer.stage(10, 20, _tables())
        raise ValueError("the job stops")
    assert storage.list_names(f"{run}/tokens") == [first.name]
    assert read_manifest(run).status == "interrupted"


def test_a_second_holder_is_refused_and_overwrite_clears(run):
    with StoredRunDir(run, HEADER, unsafe_store_commits=True) as rd:
        rd.begin_pass(0)
        rd.commit(rd.part_writer.stage(0, 10, _tables()))
        with pytest.raises(RunDirError, match="another bertattn process"):
            StoredRunDir(run, HEADER, unsafe_store_commits=True).open()
        rd.finalize({})
    storage.write_bytes(f"{run}/aggregates/token_influence.parquet", b"x")
    storage.write_bytes(f"{run}/faithfulness/head_faithfulness.parquet", b"x")
    with StoredRunDir(run, HEADER, on_existing="overwrite", unsafe_store_commits=True) as rd:
        assert rd.parts == []
    assert storage.list_names(run, recursive=True) == [MANIFEST]


def test_a_prefix_holding_other_objects_is_refused(run):
    storage.write_bytes(f"{run}/notes.txt", b"mine")
    with pytest.raises(RunDirError, match="is not empty and is not a run directory"):
        StoredRunDir(run, HEADER, unsafe_store_commits=True).open()
    assert storage.list_names(run) == ["notes.txt"]


def test_a_run_on_an_fsspec_store_reads_back_like_a_local_one(run, drug_sample, tiny_en_dir, tmp_path):
    """A scheme neither pyarrow nor polars serves itself (fsspec's in-memory store): the parts are read
    through a pyarrow dataset, and validate reads the run's mirror."""
    from bertattn_batch.analysis.validate import validate_run
    from bertattn_batch.config import InputSpec, JobSpec
    from bertattn_batch.engines import run_job
    from bertattn_batch.run import scan_attention

    def job(out: str) -> JobSpec:
        return JobSpec(
            inputs=InputSpec([str(drug_sample)], limit=20),
            model=str(tiny_en_dir),
            out=out,
            window=7,
            progress=False,
            unsafe_store_commits=True,
        )

    run_job(job(run))
    run_job(job(str(tmp_path / "local")))
    order = ["doc_id", "layer", "head", "position"]
    stored = scan_attention(run).collect().drop("run_id", strict=False).sort(order)
    local = scan_attention(tmp_path / "local").collect().drop("run_id", strict=False).sort(order)
    assert stored.height > 0 and stored.equals(local)
    report = validate_run(run, check_source=False)
    assert not report.problems and report.run_dir == run
