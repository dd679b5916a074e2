"""Committing a part costs the same however many parts came before: it appends one line to the commit
log, durable, and the manifest is written whole only when a pass begins, ends or fails."""

from __future__ import annotations

import json

import pyarrow as pa

from bertattn_batch import schema
from bertattn_batch.run import COMMIT_LOG, MANIFEST, RunDir, read_manifest

FINGERPRINT = {
    "inputs": ["/x"],
    "input_format": "auto",
    "encoding": "utf-8",
    "delimiter": None,
    "store_text": True,
}
HEADER = {"spec": {}, "fingerprint": FINGERPRINT, "model": {}, "versions": {}}


def _tables() -> dict[str, pa.Table]:
    return {t: schema.arrow(t).empty_table() for t in schema.TABLES}


def test_commits_append_to_the_log_and_the_end_folds_it_into_the_manifest(tmp_path):
    run = tmp_path / "run"
    with RunDir(run, HEADER) as rd:
        rd.begin_pass(0)
        before = (run / MANIFEST).read_bytes()
        for k in range(50):
            rd.commit(rd.part_writer.stage(10 * k, 10 * k + 10, _tables()))
        assert (run / MANIFEST).read_bytes() == before  # not rewritten by any commit
        lines = (run / COMMIT_LOG).read_text().splitlines()
        assert len(lines) == 50 and json.loads(lines[-1])["start_row"] == 490
        # a reader meanwhile sees every committed part
        assert [p.start_row for p in read_manifest(run).parts] == list(range(0, 500, 10))
        rd.finalize({})
    assert not (run / COMMIT_LOG).exists()
    assert len(json.loads((run / MANIFEST).read_text())["parts"]) == 50


def test_a_line_cut_short_was_never_committed(tmp_path):
    run = tmp_path / "run"
    with RunDir(run, HEADER) as rd:
        rd.begin_pass(0)
        rd.commit(rd.part_writer.stage(0, 10, _tables()))
        staged = rd.part_writer.stage(10, 20, _tables())  # staged, then killed as its line was written
    with open(run / COMMIT_LOG, "a") as f:
        f.write(json.dumps(staged.to_dict())[:40])
    assert [p.start_row for p in read_manifest(run).parts] == [0]
    with RunDir(run, HEADER) as rd:  # the reopen removes its files and folds the log in
        assert [p.start_row for p in rd.parts] == [0]
    assert not list(run.glob("*/_*.tmp")) and not (run / COMMIT_LOG).exists()


def test_a_manifest_written_before_its_log_was_dropped_reads_once(tmp_path):
    """A crash between writing the whole manifest and removing the log: entries in both are one part."""
    run = tmp_path / "run"
    with RunDir(run, HEADER) as rd:
        rd.begin_pass(0)
        entry = rd.part_writer.stage(0, 10, _tables())
        rd.commit(entry)
        log = (run / COMMIT_LOG).read_text()
        rd.finalize({})
    (run / COMMIT_LOG).write_text(log)
    assert [p.name for p in read_manifest(run).parts] == [entry.name]
