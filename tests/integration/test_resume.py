"""Runs survive SIGKILL at any point, refuse to mix jobs, and rerun incrementally."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv
import pyarrow.parquet as pq
import pytest
from helpers import SORT_KEYS, read_table, same_job_table
from typer.testing import CliRunner

from bertattn_batch import schema
from bertattn_batch._files import file_lock
from bertattn_batch.analysis.validate import validate_run
from bertattn_batch.cli import app
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.errors import InputError, RunDirError, WriteError
from bertattn_batch.run import LOCK_NAME, PartWriter, RunDir

runner = CliRunner()
KILLER = Path(__file__).resolve().parents[1] / "killer.py"


@pytest.fixture(scope="module")
def corpus(drug_rows, tmp_path_factory) -> Path:
    rows = [{"doc_id": r["doc_id"], "text": r["text"][:400], "label": r["label"]} for r in drug_rows[:60]]
    path = tmp_path_factory.mktemp("resume") / "reviews.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _args(corpus: Path, model: Path, out: Path) -> list[str]:
    return [
        "extract",
        str(corpus),
        "--model",
        str(model),
        "--out",
        str(out),
        "--id-col",
        "doc_id",
        "--label-col",
        "label",
        "--window",
        "10",
        "--batch-tokens",
        "1500",
        "--no-progress",
    ]


def _tables(run_dir: Path) -> dict[str, pa.Table]:
    return {
        t: same_job_table(read_table(run_dir, t)).sort_by([(k, "ascending") for k in SORT_KEYS[t]])
        for t in schema.TABLES
    }


@pytest.fixture(scope="module")
def reference(corpus, tiny_en_dir, tmp_path_factory) -> dict[str, pa.Table]:
    out = tmp_path_factory.mktemp("ref") / "run"
    r = runner.invoke(app, _args(corpus, tiny_en_dir, out))
    assert r.exit_code == 0, r.output
    return _tables(out)


def _assert_no_partial_files(run_dir: Path) -> None:
    """Whatever a reader globs is a whole Parquet file; temporaries are hidden by their names."""
    for table in schema.TABLES:
        for f in (run_dir / table).glob("*.parquet"):
            assert f.name.startswith("part-")
            pq.read_table(f)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "n"), [("read", 25), ("forward", 3), ("write", 4), ("commit", 2), ("part", 3)]
)
def test_sigkill_then_resume_gives_the_uninterrupted_tables(
    point, n, corpus, tiny_en_dir, reference, tmp_path
):
    out = tmp_path / "run"
    args = _args(corpus, tiny_en_dir, out)
    killed = subprocess.run(
        [sys.executable, str(KILLER), point, str(n), "--", *args], capture_output=True, text=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    if out.exists():
        _assert_no_partial_files(out)
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    got = _tables(out)
    for table in schema.TABLES:
        assert got[table].equals(reference[table]), table
    ids = got["predictions"].column("doc_id")
    assert pc.count_distinct(ids).as_py() == len(ids) == 60
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["counts"]["predictions"] == 60
    _assert_no_partial_files(out)
    assert not [f for t in schema.TABLES for f in (out / t).iterdir() if f.name.startswith("_")]


@pytest.mark.parametrize(("point", "sig"), [("forward", "TERM"), ("part", "TERM"), ("part", "HUP")])
def test_sigterm_stops_cleanly_and_resumes(point, sig, corpus, tiny_en_dir, reference, tmp_path):
    """SIGHUP (the terminal or ssh session closed) left the run "running" with its temporaries: it stops
    the job as SIGTERM does."""
    out = tmp_path / "run"
    args = _args(corpus, tiny_en_dir, out)
    stopped = subprocess.run(
        [sys.executable, str(KILLER), point, "2", "--", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "KILLER_SIGNAL": sig},
    )
    assert stopped.returncode == 128 + getattr(signal, "SIG" + sig), stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == "interrupted; rerun the same command to resume"
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    _assert_no_partial_files(out)
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    got = _tables(out)
    for table in schema.TABLES:
        assert got[table].equals(reference[table]), table


@pytest.mark.parametrize("existing", [["--overwrite"], ["--on-existing", "new"]])
def test_an_interrupted_run_says_how_to_resume_where_the_same_command_would_not(
    existing, corpus, tiny_en_dir, reference, tmp_path
):
    """ "rerun the same command to resume" was said to a job with --overwrite, which then started over,
    and to one with --on-existing new, which then refused its own run."""
    out = tmp_path / "run"
    args = _args(corpus, tiny_en_dir, out)
    stopped = subprocess.run(
        [sys.executable, str(KILLER), "part", "2", "--", *args, *existing],
        capture_output=True,
        text=True,
        env={**os.environ, "KILLER_SIGNAL": "TERM"},
    )
    assert stopped.returncode == 143, stopped.stderr
    said = stopped.stderr.strip().splitlines()[-1]
    assert said.startswith("interrupted; to resume, rerun ") and "same command" not in said.split(":")[0]
    if existing == ["--overwrite"]:
        assert "rerun without --overwrite" in said
        again = args
    else:
        assert "rerun with --on-existing resume" in said
        again = [*args, "--on-existing", "resume"]
    committed = json.loads((out / "manifest.json").read_text())["parts"]
    assert committed  # something to resume from
    r = runner.invoke(app, again)
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parts"][: len(committed)] == committed  # resumed, not started over
    got = _tables(out)
    for table in schema.TABLES:
        assert got[table].equals(reference[table]), table


def test_a_run_stopped_before_its_first_part_without_table_folders_is_not_damaged(
    corpus, tiny_en_dir, reference, tmp_path
):
    """On a store a run killed before its first part has no table folders (a store has none): validate
    called it damaged, 'folder missing'."""
    out = tmp_path / "run"
    args = _args(corpus, tiny_en_dir, out)
    killed = subprocess.run(
        [sys.executable, str(KILLER), "read", "1", "--", *args], capture_output=True, text=True
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not json.loads((out / "manifest.json").read_text())["parts"]
    for table in schema.TABLES:
        (out / table).rmdir()  # empty, as the store's mirror has none
    r = runner.invoke(app, ["validate", str(out)])
    assert r.exit_code == 0 and "folder missing" not in r.output, r.output
    assert runner.invoke(app, args).exit_code == 0  # and it resumes
    got = _tables(out)
    for table in schema.TABLES:
        assert got[table].equals(reference[table]), table


def test_a_run_being_written_is_not_written_by_a_second_process(corpus, tiny_en_dir, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with file_lock(out / LOCK_NAME):  # as another process writing the run would hold it
        r = runner.invoke(app, _args(corpus, tiny_en_dir, out))
        assert r.exit_code == 1
        assert f"another bertattn process (pid {os.getpid()}) is writing {out}" in r.output
    r = runner.invoke(app, _args(corpus, tiny_en_dir, out))  # the lock is gone with its holder
    assert r.exit_code == 0, r.output
    assert json.loads((out / "manifest.json").read_text())["counts"]["predictions"] == 60


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_a_reader_asking_for_the_lock_does_not_turn_a_starting_writer_away(tmp_path):
    """validate asks whether a run's lock is held by taking it shared for an instant; a job that starts
    then tries again instead of reporting the run busy."""
    import fcntl

    lock = tmp_path / LOCK_NAME
    lock.write_text("")
    fd = os.open(lock, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a reader's probe, held longer than it ever is
    releaser = threading.Timer(0.15, os.close, [fd])
    releaser.start()
    with file_lock(lock, busy=RunDirError):
        pass
    releaser.join()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open descriptors in /proc")
def test_taking_a_lock_leaves_no_descriptor_open_when_it_fails(tmp_path, monkeypatch):
    """A Ctrl-C or SIGTERM while waiting for a lock (a job waiting for another's model training), or a
    failed write of the holder's pid, left the lock file's descriptor open."""
    from bertattn_batch._files import _take_lock

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def ctrl_c(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    path = tmp_path / "x.lock"
    held = _take_lock(path, wait=False)
    old = signal.signal(signal.SIGALRM, ctrl_c)
    try:
        before = open_fds()
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            _take_lock(path, wait=True)
        assert open_fds() == before
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.close(held)

    def full_disk(fd: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "ftruncate", full_disk)  # the pid is only for a second job's message
    before = open_fds()
    with file_lock(tmp_path / LOCK_NAME):
        assert open_fds() == before + 1
    assert open_fds() == before


def test_a_file_system_without_locks_still_gets_its_run(corpus, tiny_en_dir, tmp_path, monkeypatch, caplog):
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    out = tmp_path / "run"
    r = runner.invoke(app, _args(corpus, tiny_en_dir, out))
    assert r.exit_code == 0, r.output
    assert "cannot be locked (No locks available)" in caplog.text
    assert json.loads((out / "manifest.json").read_text())["counts"]["predictions"] == 60


def test_rerun_of_a_complete_run_writes_nothing(corpus, tiny_en_dir, tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, _args(corpus, tiny_en_dir, out)).exit_code == 0
    before = json.loads((out / "manifest.json").read_text())["parts"]
    r = runner.invoke(app, _args(corpus, tiny_en_dir, out))
    assert r.exit_code == 0, r.output
    assert "nothing new to process" in r.output
    assert json.loads((out / "manifest.json").read_text())["parts"] == before


@pytest.mark.parametrize("limit", ["30", "0"])
def test_a_resume_with_a_smaller_limit_is_refused_and_leaves_the_run_as_it_was(
    limit, corpus, tiny_en_dir, tmp_path
):
    """A --limit below the rows a run already holds cannot be honoured: it is refused before the pass
    begins, naming --limit, and the finished run keeps its manifest (it was marked interrupted)."""
    out = tmp_path / "run"
    assert runner.invoke(app, _args(corpus, tiny_en_dir, out)).exit_code == 0
    before = json.loads((out / "manifest.json").read_text())
    r = runner.invoke(app, [*_args(corpus, tiny_en_dir, out), "--limit", limit])
    assert r.exit_code == 1, r.output
    assert "--limit" in r.output and "60" in r.output
    after = json.loads((out / "manifest.json").read_text())
    assert {k: after[k] for k in ("status", "limit", "resumes", "parts")} == {
        k: before[k] for k in ("status", "limit", "resumes", "parts")
    }
    assert runner.invoke(app, ["validate", str(out)]).exit_code == 0


def test_a_run_of_other_words_is_told_how_to_go_on_with_its_own(corpus, tiny_en_dir, tmp_path):
    """A run made with no words (or before its tokenizer had them) and resumed under auto words is refused
    with the --words that goes on with the run, and goes on with it."""
    out = tmp_path / "run"
    assert runner.invoke(app, [*_args(corpus, tiny_en_dir, out), "--words", "none"]).exit_code == 0
    r = runner.invoke(app, [*_args(corpus, tiny_en_dir, out), "--incremental"])
    assert r.exit_code == 1 and "or --words none (the job key words) to go on with its words" in r.output
    r = runner.invoke(app, [*_args(corpus, tiny_en_dir, out), "--incremental", "--words", "none"])
    assert r.exit_code == 0, r.output


def test_a_model_folder_with_other_labels_tokenizer_or_config_beside_the_same_weights_is_refused(
    corpus, tiny_en_dir, tmp_path
):
    """--incremental into a run whose model folder had its labels renamed, its tokenizer changed, its
    config edited (another activation: every probability moves, and validate saw nothing) or its code
    beside the same weights mixed two models' rows silently. A key that changes no output is no other
    model."""
    model = tmp_path / "model"
    shutil.copytree(tiny_en_dir, model)
    out = tmp_path / "run"
    assert runner.invoke(app, _args(corpus, model, out)).exit_code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    config = json.loads((model / "config.json").read_text())
    renamed = {k: f"new {v}" for k, v in config["id2label"].items()}
    (model / "config.json").write_text(json.dumps({**config, "id2label": renamed}))
    r = runner.invoke(app, [*_args(corpus, model, out), "--incremental"])
    assert r.exit_code == 1 and "made by another job (labels: run has" in r.output, r.output
    for edit in ({"hidden_act": "relu"}, {"layer_norm_eps": 1e-2}):
        (model / "config.json").write_text(json.dumps({**config, **edit}))
        r = runner.invoke(app, [*_args(corpus, model, out), "--incremental"])
        assert r.exit_code == 1 and "made by another job (model_config_sha256: run has" in r.output, r.output
    inert = {"transformers_version": "9.9.9", "torch_dtype": "bfloat16", "hidden_dropout_prob": 0.3}
    (model / "config.json").write_text(json.dumps({**config, **inert}))
    r = runner.invoke(app, [*_args(corpus, model, out), "--incremental"])
    assert r.exit_code == 0 and "nothing new to process" in r.output, r.output
    (model / "config.json").write_text(json.dumps(config))
    # the folder's Python code (what auto_map imports under --trust-remote-code), added or edited: validate
    # says so, and a resume refuses it
    for code in ("x = 1\n", "x = 2\n"):
        (model / "modeling_custom.py").write_text(code)
        r = runner.invoke(app, [*_args(corpus, model, out), "--incremental"])
        assert r.exit_code == 1 and "made by another job (model_config_sha256: run has" in r.output, r.output
        r = runner.invoke(app, ["validate", str(out), "--no-source"])
        assert r.exit_code == 0 and "has another config.json or Python code than the run records" in r.output
    (model / "modeling_custom.py").unlink()
    tok_config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**tok_config, "do_lower_case": False}))
    r = runner.invoke(app, [*_args(corpus, model, out), "--incremental"])
    assert r.exit_code == 1 and "made by another job (tokenizer_sha256: run has" in r.output, r.output
    # a run an older version wrote, which recorded none of them, resumes as before
    for key in ("labels", "tokenizer_sha256", "model_config_sha256"):
        del manifest["fingerprint"][key]
    (out / "manifest.json").write_text(json.dumps(manifest))
    shutil.copy(tiny_en_dir / "tokenizer_config.json", model / "tokenizer_config.json")
    r = runner.invoke(app, [*_args(corpus, model, out), "--incremental"])
    assert r.exit_code == 0 and "nothing new to process" in r.output, r.output


def test_another_model_or_spec_is_refused(corpus, tiny_en_dir, minilm_dir, tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, _args(corpus, tiny_en_dir, out)).exit_code == 0
    r = runner.invoke(app, _args(corpus, minilm_dir, out))
    assert r.exit_code == 1 and "made by another job" in r.output and "model_sha256" in r.output
    assert "job_sha256" not in r.output  # the hash of what differs adds nothing to the message
    r = runner.invoke(app, [*_args(corpus, tiny_en_dir, out), "--layers=-1"])
    assert r.exit_code == 1 and "layers" in r.output
    no_labels = [a for a in _args(corpus, tiny_en_dir, out) if a not in ("--label-col", "label")]
    r = runner.invoke(app, no_labels)  # values as a job file spells them: null, not Python's None
    assert 'columns: run has ["text", "doc_id", "label"], job has ["text", "doc_id", null]' in r.output
    r = runner.invoke(app, [*_args(corpus, minilm_dir, out), "--overwrite"])
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["num_layers"] == 6
    manifest["schema_versions"]["predictions"] = 0
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = runner.invoke(app, _args(corpus, minilm_dir, out))
    assert r.exit_code == 1 and "another version of bertattn-batch" in r.output and "--overwrite" in r.output
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    r = runner.invoke(app, [*_args(corpus, minilm_dir, tmp_path / "notes"), "--overwrite"])
    assert r.exit_code == 1 and "not a run directory" in r.output
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_a_resume_from_another_directory_knows_the_same_inputs(corpus, tiny_en_dir, tmp_path, monkeypatch):
    """Inputs are known by their absolute paths: a run started with a relative path resumes from
    another directory that spells the same file another way; a file that only shares the relative
    spelling is the same input where it holds the same bytes (a copy, a project moved), else not. A run
    whose manifest holds relative paths (written by an earlier version) resumes from the directory it
    began in."""
    (tmp_path / "a").mkdir()
    shutil.copy(corpus, tmp_path / "reviews.parquet")
    out = tmp_path / "run"

    def run(cwd: Path, src: str, *extra: str):
        monkeypatch.chdir(cwd)
        args = _args(Path(src), tiny_en_dir, out)
        return runner.invoke(app, [*args, *extra])

    r = run(tmp_path, "reviews.parquet", "--limit", "20")  # stops after two parts, as a killed run would
    assert r.exit_code == 0, r.output
    manifest = json.loads((out / "manifest.json").read_text())  # as the version before this one wrote it
    manifest["fingerprint"]["inputs"] = ["reviews.parquet"]
    manifest["fingerprint"]["job_sha256"] = "0" * 64
    manifest["sources"][0]["path"] = "reviews.parquet"
    (out / "manifest.json").write_text(json.dumps(manifest))
    r = run(tmp_path, "reviews.parquet", "--limit", "30")  # resumed from the directory it began in
    assert r.exit_code == 0 and r.output.startswith("10 reviews"), r.output
    r = run(tmp_path / "a", "../reviews.parquet")
    assert r.exit_code == 0 and r.output.startswith("30 reviews"), r.output
    assert read_table(out, "predictions").num_rows == 60
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["fingerprint"]["inputs"] == [str(tmp_path / "reviews.parquet")]
    assert manifest["spec"]["inputs"] == ["reviews.parquet"]  # as the job that began the run gave it

    # a copy of the same file elsewhere holds the same reviews (a project moved); another file does not
    shutil.copy(tmp_path / "reviews.parquet", tmp_path / "a" / "reviews.parquet")
    r = run(tmp_path / "a", "reviews.parquet")
    assert r.exit_code == 0 and "nothing new to process" in r.output, r.output
    pq.write_table(pq.read_table(corpus).slice(0, 5), tmp_path / "a" / "reviews.parquet")
    r = run(tmp_path / "a", "reviews.parquet")
    assert r.exit_code == 1 and "the inputs changed since this run began" in r.output, r.output


def test_resume_keeps_marking_repeated_ids(drug_rows, tiny_en_dir, tmp_path):
    """An id committed before an interruption still makes its later repeats duplicate_id."""
    rows = [{"doc_id": f"r{i % 7}", "text": r["text"][:200]} for i, r in enumerate(drug_rows[:12])]
    src = tmp_path / "dups.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)

    def run(out: Path, *extra: str) -> None:
        args = ["extract", str(src), "--model", str(tiny_en_dir), "--out", str(out), "--id-col", "doc_id"]
        r = runner.invoke(app, [*args, "--window", "3", "--no-progress", *extra])
        assert r.exit_code == 0, r.output

    run(tmp_path / "whole")
    run(tmp_path / "resumed", "--limit", "6")  # stops after two parts, as a killed run would
    run(tmp_path / "resumed")
    whole, resumed = (_tables(tmp_path / name) for name in ("whole", "resumed"))
    assert resumed["predictions"].column("status").to_pylist() == ["ok"] * 7 + ["duplicate_id"] * 5
    for table in schema.TABLES:
        assert resumed[table].equals(whole[table]), table


def test_a_run_that_committed_nothing_does_not_block_the_next(corpus, tiny_en_dir, tmp_path):
    """A job that failed before its first part (here: a column that is not there) leaves nothing that
    stops the corrected job from using the same --out."""
    out = tmp_path / "run"
    r = runner.invoke(app, [*_args(corpus, tiny_en_dir, out), "--text-col", "txt"])
    assert r.exit_code == 1 and "no column 'txt'" in r.output
    with RunDir(out, {"fingerprint": {"inputs": ["elsewhere"]}}):
        pass  # a run of another job that stopped before it committed a part
    r = runner.invoke(app, _args(corpus, tiny_en_dir, out))
    assert r.exit_code == 0, r.output
    assert read_table(out, "predictions").num_rows == 60


def _incremental_pass(ids: list[str | None], texts: list[str], model: Path, tmp_path: Path) -> str:
    """Write reviews with ``ids`` as the input and run an --incremental pass over it; its output."""
    src, out = tmp_path / "in.parquet", tmp_path / "run"
    pq.write_table(pa.table({"id": ids, "text": texts[: len(ids)]}), src)
    args = ["extract", str(src), "--model", str(model), "--out", str(out), "--id-col", "id"]
    r = runner.invoke(app, [*args, "--incremental", "--no-progress"])
    assert r.exit_code == 0, r.output
    return r.output


def test_incremental_scores_a_real_id_equal_to_a_null_ids_row_number(drug_rows, tiny_en_dir, tmp_path):
    out = tmp_path / "run"
    texts = [r["text"][:100] for r in drug_rows[:4]]

    def run(ids: list[str | None]) -> str:
        return _incremental_pass(ids, texts, tiny_en_dir, tmp_path)

    run(["10", None, "11"])  # the null id's row is recorded as doc '1'
    run(["10", None, "11", "1"])  # a real id '1' is new
    preds = read_table(out, "predictions")
    scored = preds.filter(pc.equal(preds["status"], "ok")).column("doc_id").to_pylist()
    assert sorted(scored) == ["1", "10", "11"]


def test_incremental_processes_only_new_ids(drug_rows, tiny_en_dir, tmp_path):
    src = tmp_path / "in.parquet"
    rows = [{"doc_id": r["doc_id"], "text": r["text"][:300]} for r in drug_rows[:30]]
    pq.write_table(pa.Table.from_pylist(rows[:20]), src)
    out = tmp_path / "run"
    base = [
        "extract",
        str(src),
        "--model",
        str(tiny_en_dir),
        "--out",
        str(out),
        "--id-col",
        "doc_id",
        "--window",
        "8",
        "--no-progress",
        "--incremental",
    ]
    assert runner.invoke(app, base).exit_code == 0
    # the source gains 10 reviews, in front of the old ones: only those 10 are processed
    pq.write_table(pa.Table.from_pylist(rows[20:] + rows[:20]), src)
    r = runner.invoke(app, base)
    assert r.exit_code == 0, r.output
    assert r.output.startswith("10 reviews")
    preds = read_table(out, "predictions")
    assert sorted(preds.column("doc_id").to_pylist()) == sorted(r["doc_id"] for r in rows)
    r = runner.invoke(app, base)
    assert r.exit_code == 0 and "nothing new to process" in r.output
    assert read_table(out, "predictions").num_rows == 30
    # a limit takes the first rows each night, not new ones: said so, not "up to date"
    pq.write_table(pa.Table.from_pylist([*rows, {"doc_id": "new", "text": "a new review"}]), src)
    r = runner.invoke(app, [*base, "--limit", "30"])
    assert r.exit_code == 0 and "nothing new among the first 30 input rows (--limit)" in r.output


class FullDisk(PartWriter):
    """A part writer whose second part fails as a full disk would."""

    def _write_parquet(self, table, path):
        if path.name.startswith("_part-000000000010"):
            raise OSError(28, "No space left on device")
        super()._write_parquet(table, path)


class SlowFirst(PartWriter):
    """The first part is slow to write."""

    def _write_parquet(self, table, path):
        if path.name.startswith("_part-000000000000"):
            time.sleep(0.5)
        super()._write_parquet(table, path)


class SlowThenFullDisk(SlowFirst, FullDisk):
    """The first part is slow to write, and the second fails as a full disk would."""


@pytest.mark.parametrize("failure", ["write", "model"])
def test_parts_finished_before_a_failure_are_committed(failure, corpus, tiny_en_dir, tmp_path, monkeypatch):
    """Two windows: the first is still being written when the second fails (its write, or the model on
    it). The first part is finished work: it is committed before the error ends the job."""
    from bertattn_batch.errors import ModelError
    from bertattn_batch.extract import WindowJob

    if failure == "model":
        score = WindowJob.score

        def failing_score(self, window, on_batch=None):
            if window.start_row == 10:
                raise ModelError("the model failed (simulated)")
            return score(self, window, on_batch)

        monkeypatch.setattr(WindowJob, "score", failing_score)
    out = tmp_path / "run"
    spec = JobSpec(
        inputs=InputSpec([str(corpus)], id_col="doc_id", limit=20),
        model=str(tiny_en_dir),
        out=str(out),
        window=10,
        progress=False,
    )
    error = (WriteError, "No space left") if failure == "write" else (ModelError, "simulated")
    with pytest.raises(error[0], match=error[1]):
        run_job(spec, part_writer=SlowThenFullDisk if failure == "write" else SlowFirst)
    manifest = json.loads((out / "manifest.json").read_text())
    assert [p["start_row"] for p in manifest["parts"]] == [0]
    assert not list(out.glob("*/_*"))


def test_failed_write_stops_cleanly_and_resumes(corpus, tiny_en_dir, reference, tmp_path):
    out = tmp_path / "run"
    spec = JobSpec(
        inputs=InputSpec([str(corpus)], id_col="doc_id", label_col="label"),
        model=str(tiny_en_dir),
        out=str(out),
        window=10,
        batch_tokens=1500,
        progress=False,
    )
    with pytest.raises(WriteError, match="No space left on device"):
        run_job(spec, part_writer=FullDisk)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert [p["start_row"] for p in manifest["parts"]] == [0]
    assert not list(out.glob("*/_*"))
    run_job(spec)
    got = _tables(out)
    for table in schema.TABLES:
        assert got[table].equals(reference[table]), table


def test_inputs_changed_while_read_leave_the_run_interrupted(corpus, tiny_en_dir, tmp_path):
    """A file truncated while the run read it (an export still being written) must not end as a
    complete run of fewer rows, or of rows of two versions of the file."""
    rows = pq.read_table(corpus).to_pylist()
    csv = tmp_path / "reviews.csv"

    def write(n: int) -> None:
        pa.csv.write_csv(pa.Table.from_pylist(rows[:n]), csv)

    class TruncatesTheInput(PartWriter):
        def _write_parquet(self, table, path):
            write(25)
            super()._write_parquet(table, path)

    write(len(rows))
    out = tmp_path / "run"
    spec = JobSpec(
        inputs=InputSpec([str(csv)], id_col="doc_id"),
        model=str(tiny_en_dir),
        out=str(out),
        window=10,
        progress=False,
    )
    with pytest.raises(
        InputError, match=r"the inputs changed while this run read them \(.*reviews.csv changed size\)"
    ):
        run_job(spec, part_writer=TruncatesTheInput)
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    with pytest.raises(RunDirError, match="the inputs changed since this run began"):
        run_job(spec)

    # a file gone while read: one line, not a bare FileNotFoundError
    class RemovesTheInput(PartWriter):
        def _write_parquet(self, table, path):
            csv.unlink(missing_ok=True)
            super()._write_parquet(table, path)

    write(len(rows))
    with pytest.raises(InputError, match=r"reviews.csv went while this run read it .*rerun with --overwrite"):
        run_job(dataclasses.replace(spec, on_existing="overwrite"), part_writer=RemovesTheInput)

    # a pass by id (--incremental) takes what it read: a nightly file appended to meanwhile is no error
    class AppendsToTheInput(PartWriter):
        def _write_parquet(self, table, path):
            write(len(rows))
            super()._write_parquet(table, path)

    write(25)
    nightly = dataclasses.replace(spec, out=str(tmp_path / "nightly"), on_existing="incremental")
    run_job(nightly, part_writer=AppendsToTheInput)
    assert json.loads((tmp_path / "nightly" / "manifest.json").read_text())["status"] == "complete"
    run_job(nightly)  # the next night adds the rows appended during the first
    assert read_table(tmp_path / "nightly", "predictions").num_rows == len(rows)


def test_manifest_listing_a_missing_part_is_reported(corpus, tiny_en_dir, tmp_path):
    out = tmp_path / "run"
    assert runner.invoke(app, _args(corpus, tiny_en_dir, out)).exit_code == 0
    next((out / "cls_attention").glob("part-*.parquet")).unlink()
    with pytest.raises(RunDirError, match="missing"):
        RunDir(out, _header(out)).open()


def _header(run: Path) -> dict:
    """A run's header as its own job gives it: what a reopen of it compares."""
    manifest = json.loads((run / "manifest.json").read_text())
    return {k: manifest[k] for k in ("spec", "fingerprint", "model", "versions")}


def _failing_at(part_prefix: str) -> type[PartWriter]:
    """A part writer whose part named ``part_prefix…`` fails as a full disk would: a run stopped mid-pass."""

    class Failing(PartWriter):
        def _write_parquet(self, table, path):
            if path.name.startswith(f"_{part_prefix}"):
                raise OSError(28, "No space left on device")
            super()._write_parquet(table, path)

    return Failing


@pytest.mark.parametrize("stop_in_pass", [0, 1])
def test_an_interrupted_incremental_pass_resumes_to_the_uninterrupted_tables(
    stop_in_pass, drug_rows, tiny_en_dir, tmp_path
):
    """Resuming an incremental pass finishes that pass: a repeat of an id committed before the stop is
    still duplicate_id (not skipped), and rows with a null id are recorded once, not again. The same
    for a later pass stopped before it committed anything."""
    rows = [{"doc_id": f"r{i}", "text": r["text"][:200]} for i, r in enumerate(drug_rows[:24])]
    rows[17]["doc_id"] = "r3"  # repeats an id of the first part
    rows[5]["doc_id"] = rows[14]["doc_id"] = None
    src = tmp_path / "in.parquet"

    def run(out: Path, source_rows: list[dict], writer_cls: type[PartWriter] = PartWriter) -> None:
        pq.write_table(pa.Table.from_pylist(source_rows), src)  # the same bytes again: a resume goes on
        spec = JobSpec(
            inputs=InputSpec([str(src)], id_col="doc_id"),
            model=str(tiny_en_dir),
            out=str(out),
            window=6,
            on_existing="incremental",
            progress=False,
        )
        run_job(spec, part_writer=writer_cls)

    passes = [rows[:12], rows] if stop_in_pass else [rows]
    for source_rows in passes:
        run(tmp_path / "whole", source_rows)
    for source_rows in passes[:-1]:
        run(tmp_path / "resumed", source_rows)
    stop = "part-000000000012" if stop_in_pass == 0 else "part-000000000012-g1"
    with pytest.raises(WriteError):
        run(tmp_path / "resumed", passes[-1], _failing_at(stop))
    run(tmp_path / "resumed", passes[-1])
    whole, resumed = (_tables(tmp_path / name) for name in ("whole", "resumed"))
    statuses = resumed["predictions"].column("status").to_pylist()
    # one pass: r3's repeat is a duplicate; two: the second skips r3 (in the run already) and records
    # both null-id rows again, as documented
    assert (statuses.count("duplicate_id"), statuses.count("null_id")) == ((1, 2), (0, 3))[stop_in_pass]
    for table in schema.TABLES:
        assert resumed[table].equals(whole[table]), table


def test_resume_refuses_committed_parts_that_are_not_whole(corpus, tiny_en_dir, tmp_path):
    """A part cut short, a table folder gone, or a manifest that lost a part's entry stops the resume
    with a clear message instead of a run reported up to date."""
    import shutil

    base = tmp_path / "base"
    assert runner.invoke(app, _args(corpus, tiny_en_dir, base)).exit_code == 0

    def damaged(name: str, harm) -> str:
        out = tmp_path / name
        shutil.copytree(base, out)
        harm(out)
        r = runner.invoke(app, _args(corpus, tiny_en_dir, out))
        assert r.exit_code == 1 and "Traceback" not in r.output
        return r.output

    def cut(out: Path) -> None:
        f = out / "predictions" / "part-000000000010.parquet"
        f.write_bytes(f.read_bytes()[:100])

    def drop_entry(out: Path) -> None:
        manifest = json.loads((out / "manifest.json").read_text())
        del manifest["parts"][2]
        (out / "manifest.json").write_text(json.dumps(manifest))

    assert "predictions/part-000000000010.parquet cannot be read" in damaged("cut", cut)
    assert "is committed in the manifest but missing" in damaged(
        "gone", lambda out: shutil.rmtree(out / "cls_attention")
    )
    assert "rows 20..29 are in no committed part" in damaged("gap", drop_entry)
    for command in ("aggregate", "report"):  # the readers of a run say so too, not read the rest alone
        r = runner.invoke(app, [command, str(tmp_path / "gap")])
        assert r.exit_code == 1 and "rows 20..29 are in no committed part" in r.output, r.output

    def swapped(table: str):  # a restore from the wrong copy: sound files, another part's reviews
        return lambda out: shutil.copyfile(
            out / table / "part-000000000000.parquet", out / table / "part-000000000010.parquet"
        )

    assert (
        "predictions/part-000000000010.parquet holds input rows 0..9, outside its part's 10..19"
        in damaged("swapped", swapped("predictions"))
    )
    foreign = lambda out: shutil.copyfile(  # noqa: E731  (another table's file in its place)
        out / "head_summary" / "part-000000000010.parquet", out / "predictions" / "part-000000000010.parquet"
    )
    assert "predictions/part-000000000010.parquet has no row_index column" in damaged("foreign", foreign)
    swapped_rows = damaged("swapped-attention", swapped("cls_attention"))
    assert re.search(
        r"cls_attention/part-000000000010.parquet holds \d+ rows where its commit recorded", swapped_rows
    )
    assert "its list of parts is missing or malformed" in damaged(
        "list",
        lambda out: (out / "manifest.json").write_text('{"format": "bertattn-batch run", "parts": null}'),
    )


def test_incremental_records_a_null_id_again_when_its_row_number_is_a_committed_id(
    drug_rows, tiny_en_dir, tmp_path
):
    out = tmp_path / "run"
    texts = [r["text"][:100] for r in drug_rows[:3]]

    def run(ids: list[str | None]) -> str:
        return _incremental_pass(ids, texts, tiny_en_dir, tmp_path)

    run(["1", "x"])
    # row 1 now has no id: its doc id is its row number, '1', which a committed review holds as its
    # real id; it is no committed review, so this pass records it as null_id
    assert run(["1", None, "x"]).startswith("1 reviews (0 scored, 1 not scored: null_id 1)")
    preds = read_table(out, "predictions")
    rows = sorted(zip(preds["row_index"].to_pylist(), preds["status"].to_pylist(), strict=True))
    assert rows == [(0, "ok"), (1, "null_id"), (1, "ok")]


def test_a_manifest_that_cannot_be_marked_interrupted_does_not_hide_the_error(
    tiny_en_dir, tmp_path, monkeypatch
):
    """Marking a failed run interrupted is a courtesy: when that write fails too (a full disk), the
    error that stopped the run is the one reported."""
    import bertattn_batch.run.manifest as manifest_module
    from bertattn_batch.errors import InputError

    good, bad = tmp_path / "a.jsonl", tmp_path / "b.jsonl"  # b is no JSON lines file: found mid-run
    good.write_text('{"text": "good"}\n')
    bad.write_text('{"text": broken\n')
    real = manifest_module.atomic_write_text

    def full_disk_once_failed(path: Path, text: str) -> None:
        if json.loads(text).get("status") == "interrupted":
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(manifest_module, "atomic_write_text", full_disk_once_failed)
    spec = JobSpec(
        inputs=[str(good), str(bad)], model=str(tiny_en_dir), out=str(tmp_path / "run"), progress=False
    )
    with pytest.raises(InputError, match="expected a JSON object on each line"):
        run_job(spec)


def test_a_resume_refuses_inputs_that_changed_since_the_run_began(drug_rows, tiny_en_dir, tmp_path):
    """A folder that gains a file sorted in front of the old ones shifts every row number: a plain rerun
    went on by row number, wrote old reviews again and skipped the new ones, with exit status 0. It
    is refused now, the run stays complete, and --incremental adds the new reviews by id."""
    rows = [{"doc_id": f"r{i}", "text": r["text"][:200]} for i, r in enumerate(drug_rows[:30])]
    folder, out = tmp_path / "in", tmp_path / "run"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:10]), folder / "b.parquet")
    pq.write_table(pa.Table.from_pylist(rows[10:20]), folder / "c.parquet")
    args = ["extract", str(folder), "--model", str(tiny_en_dir), "--out", str(out), "--id-col", "doc_id"]
    args += ["--window", "5", "--no-progress"]
    assert runner.invoke(app, args).exit_code == 0
    assert "nothing new to process" in runner.invoke(app, args).output  # unchanged: still resumable
    pq.write_table(pa.Table.from_pylist(rows[20:]), folder / "a.parquet")
    r = runner.invoke(app, args)
    assert r.exit_code == 1, r.output
    assert "the inputs changed since this run began" in r.output and "a.parquet is new" in r.output
    assert "--incremental" in r.output
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    assert read_table(out, "predictions").num_rows == 20
    r = runner.invoke(app, [*args, "--incremental"])
    assert r.exit_code == 0, r.output
    preds = read_table(out, "predictions")
    assert sorted(preds.column("doc_id").to_pylist()) == sorted(r["doc_id"] for r in rows)
    assert set(preds.column("status").to_pylist()) == {"ok"}


def test_a_run_stopped_before_its_first_manifest_can_be_started_again(
    corpus, tiny_en_dir, tmp_path, monkeypatch
):
    """A full disk (or a kill) while a new run writes its first manifest left the lock, a manifest
    temporary and empty table folders: every later job with that --out, --overwrite too, was refused as
    'not a run directory'."""
    import bertattn_batch.run.manifest as manifest_module
    from bertattn_batch._files import hidden_tmp

    real = manifest_module.atomic_write_text
    calls = {"n": 0}

    def full_disk_first(path: Path, text: str) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            path.with_name(hidden_tmp(path.name)).write_text('{"form')  # cut short
            raise OSError(28, "No space left on device")
        real(path, text)

    monkeypatch.setattr(manifest_module, "atomic_write_text", full_disk_first)
    out = tmp_path / "run"
    r = runner.invoke(app, _args(corpus, tiny_en_dir, out))
    assert r.exit_code == 1 and "No space left on device" in r.output
    assert "once that is fixed, rerun the same command to resume" in r.output
    r = runner.invoke(app, _args(corpus, tiny_en_dir, out))
    assert r.exit_code == 0, r.output
    assert read_table(out, "predictions").num_rows == 60
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [".bertattn.lock"]


def test_a_manifest_write_that_fails_leaves_no_temporary(tmp_path, monkeypatch):
    from bertattn_batch import _files

    def full_disk(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_files.os, "fsync", full_disk)
    with pytest.raises(OSError):
        _files.atomic_write_text(tmp_path / "manifest.json", '{"a": 1}')
    assert list(tmp_path.iterdir()) == []


def test_a_first_run_training_without_locks_leaves_no_lock_file(tmp_path, monkeypatch):
    """Where the file system has no locks the training lock file was made but never removed."""
    import errno
    import fcntl

    from bertattn_batch.config import FinetuneSpec
    from bertattn_batch.train import api as train_api
    from bertattn_batch.train import job as train_job

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    def fake_finetune_files(inputs, out_dir, spec, *args, **kw):
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "config.json").write_text("{}")
        return {"accuracy": None}

    monkeypatch.setattr(fcntl, "flock", no_locks)
    monkeypatch.setattr(train_api, "finetune_files", fake_finetune_files)
    model = tmp_path / "models" / "m"
    spec = JobSpec(inputs=["x"], model=str(model), out=str(tmp_path / "run"), finetune=FinetuneSpec())
    train_job.ensure_model(spec, False)
    assert sorted(p.name for p in model.parent.iterdir()) == ["m"]


def test_jobs_started_together_train_their_missing_model_once(tmp_path, monkeypatch):
    """Two scheduled `bertattn run` of a job whose model is missing each trained it and replaced the
    other's folder; training is capped by time, so the weights differed and the first job's run was
    refused as another job's on every later resume. The second now waits and uses the first's model."""
    import threading
    import time

    from bertattn_batch.config import FinetuneSpec
    from bertattn_batch.train import api as train_api
    from bertattn_batch.train import job as train_job

    trained: list[str] = []

    def fake_finetune_files(inputs, out_dir, spec, *args, **kw):
        trained.append(threading.current_thread().name)
        time.sleep(0.5)
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "config.json").write_text("{}")
        return {"accuracy": None}

    monkeypatch.setattr(train_api, "finetune_files", fake_finetune_files)
    model = tmp_path / "models" / "m"
    spec = JobSpec(inputs=["x"], model=str(model), out=str(tmp_path / "run"), finetune=FinetuneSpec())
    jobs = [threading.Thread(target=train_job.ensure_model, args=(spec, False)) for _ in range(2)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    assert len(trained) == 1
    assert (model / "config.json").is_file()
    assert sorted(p.name for p in model.parent.iterdir()) == ["m"]  # no lock file left behind


def test_the_feed_plan_reads_ahead_only_where_the_model_leaves_cores_free(monkeypatch):
    """On the CPU with a torch thread on every core the reader encodes in turn on every core; on an
    accelerator, or with cores to spare, it runs ahead."""
    import torch

    from bertattn_batch.engines.local import FeedPlan, feed_plan

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert feed_plan(torch.device("cpu")) == FeedPlan(0, 8, 1)
    assert feed_plan(torch.device("cuda", 0)) == FeedPlan(2, 8, 8)  # the device's thread mostly waits
    monkeypatch.setattr(torch, "get_num_threads", lambda: 6)
    assert feed_plan(torch.device("cpu")) == FeedPlan(2, 2, 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 64)
    assert feed_plan(torch.device("cpu")) == FeedPlan(0, 8, 1)  # a tokenizer copy per thread: at most 8
    assert feed_plan(torch.device("cuda", 0)) == FeedPlan(2, 8, 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert feed_plan(torch.device("cpu")) == FeedPlan(0, 1, 1)
    assert feed_plan(torch.device("cuda", 0)) == FeedPlan(2, 1, 1)


@pytest.mark.parametrize("plan", [(2, 1, 1), (0, 3, 1), (2, 2, 3)])
def test_every_feed_plan_writes_the_same_run(plan, tiny_en_dir, drug_sample, tmp_path, monkeypatch):
    """A reader ahead on one thread, a reader in turn on three threads, and three writer threads write
    the same tables, row for row and part for part, as the plain single-thread run."""
    from bertattn_batch.engines import local

    def run(name: str) -> Path:
        out = tmp_path / name
        run_job(
            JobSpec(inputs=[str(drug_sample)], model=str(tiny_en_dir), out=str(out), window=7, progress=False)
        )
        return out

    monkeypatch.setattr(local, "feed_plan", lambda device: local.FeedPlan(1, 1, 1))
    plain = run("plain")
    monkeypatch.setattr(local, "feed_plan", lambda device: local.FeedPlan(*plan))
    other = run("other")
    names = [
        [p["name"] for p in json.loads((d / "manifest.json").read_text())["parts"]] for d in (plain, other)
    ]
    assert names[0] == names[1] and len(names[0]) > 2
    for table, keys in SORT_KEYS.items():
        order = [(k, "ascending") for k in keys]
        want, got = (same_job_table(read_table(d, table)).sort_by(order) for d in (plain, other))
        assert want.num_rows == got.num_rows > 0
        assert want.equals(got), table


def _incremental_job(src: Path, model: Path, out: Path, on_existing: str = "incremental") -> JobSpec:
    return JobSpec(
        inputs=InputSpec([str(src)], id_col="doc_id"),
        model=str(model),
        out=str(out),
        window=6,
        on_existing=on_existing,
        progress=False,
    )


def test_a_plain_rerun_after_an_incremental_pass_stopped_before_its_first_part_is_refused(
    drug_rows, tiny_en_dir, tmp_path
):
    """The stopped pass had recorded its grown inputs: a plain resume went on by the old row numbers,
    scored old reviews again as duplicate_id and left the new ones out, with exit status 0."""
    rows = [{"doc_id": f"r{i}", "text": r["text"][:200]} for i, r in enumerate(drug_rows[:18])]
    src, out = tmp_path / "in.parquet", tmp_path / "run"
    pq.write_table(pa.Table.from_pylist(rows[6:]), src)
    run_job(_incremental_job(src, tiny_en_dir, out, "resume"))
    pq.write_table(pa.Table.from_pylist(rows), src)  # six new reviews in front
    with pytest.raises(WriteError):
        run_job(_incremental_job(src, tiny_en_dir, out), part_writer=_failing_at("part-000000000000-g1"))
    assert json.loads((out / "manifest.json").read_text())["generation"] == 1
    with pytest.raises(RunDirError, match=r"was last run with --incremental .*; rerun it with --incremental"):
        run_job(_incremental_job(src, tiny_en_dir, out, "resume"))
    run_job(_incremental_job(src, tiny_en_dir, out))
    preds = read_table(out, "predictions")
    assert sorted(preds.column("doc_id").to_pylist()) == sorted(r["doc_id"] for r in rows)


def test_a_run_killed_as_it_reopens_is_still_complete(drug_rows, tiny_en_dir, tmp_path):
    """Reopening writes the manifest (its recovered parts) before the pass begins; a kill in between
    left it "running", and every later --incremental job took the finished pass for a stopped one."""
    rows = [{"doc_id": f"r{i}", "text": r["text"][:200]} for i, r in enumerate(drug_rows[:12])]
    src, out = tmp_path / "in.parquet", tmp_path / "run"
    pq.write_table(pa.Table.from_pylist(rows[:6]), src)
    run_job(_incremental_job(src, tiny_en_dir, out))
    sink = RunDir(out, _header(out))
    sink.open()
    sink.close()  # as a kill right after the reopen leaves it: no pass begun, no on_failed
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    pq.write_table(pa.Table.from_pylist(rows), src)
    run_job(_incremental_job(src, tiny_en_dir, out))
    assert read_table(out, "predictions").num_rows == 12


def test_a_resume_refuses_an_input_rewritten_to_the_same_size(tiny_en_dir, tmp_path):
    """An export rewritten in another row order keeps its size, not its first bytes; a copy of the same
    file keeps its bytes, not its time, and is the same input."""
    src, out = tmp_path / "in.txt", tmp_path / "run"
    src.write_text("great food\nslow service\nnice staff\n")
    args = ["extract", str(src), "--model", str(tiny_en_dir), "--out", str(out), "--no-progress"]
    assert runner.invoke(app, args).exit_code == 0
    assert "nothing new to process" in runner.invoke(app, args).output
    before = src.stat()
    src.write_text("nice staff\ngreat food\nslow service\n")
    os.utime(src, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and "in.txt was rewritten (same size, other bytes at its start" in r.output, (
        r.output
    )
    src.write_text("great food\nslow service\nnice staff\n")  # a copy of the original: a new time only
    assert "nothing new to process" in runner.invoke(app, args).output
    kept = src.stat()  # rewritten at the same size, its time kept (cp -p, rsync -t, touch -r)
    src.write_text("great food\nslow service\nnice stuff\n")
    os.utime(src, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and "in.txt was rewritten (same size, other bytes at its start" in r.output, (
        r.output
    )


@pytest.mark.parametrize("change", ["replaced", "grown", "limit"])
def test_an_interrupted_nightly_pass_over_a_replaced_file_goes_on_by_id(
    change, drug_rows, tiny_en_dir, tmp_path
):
    """A nightly --incremental pass stopped mid-way, then the next night's file: the pass could not go
    on by row number, and every night after was refused with advice (--overwrite) that deleted the
    run's history. A new pass now takes every id not in the run yet; nothing is lost or doubled."""
    rows = [{"doc_id": f"r{i}", "text": r["text"][:200]} for i, r in enumerate(drug_rows[:40])]
    src = tmp_path / "night.parquet"
    out = tmp_path / "run"
    spec = JobSpec(
        inputs=InputSpec([str(src)], id_col="doc_id"),
        model=str(tiny_en_dir),
        out=str(out),
        window=6,
        on_existing="incremental",
        progress=False,
    )
    pq.write_table(pa.Table.from_pylist(rows[:10]), src)
    run_job(spec)
    pq.write_table(pa.Table.from_pylist(rows[10:30]), src)  # night 2: stopped after its first part
    with pytest.raises(WriteError):
        run_job(spec, part_writer=_failing_at("part-000000000006-g1"))
    night3 = {"replaced": rows[30:40], "grown": rows[10:40], "limit": rows[10:30]}[change]
    pq.write_table(pa.Table.from_pylist(night3), src)
    limited = dataclasses.replace(spec, inputs=dataclasses.replace(spec.inputs, limit=4))
    run_job(limited if change == "limit" else spec)
    ids = read_table(out, "predictions").column("doc_id").to_pylist()
    assert len(ids) == len(set(ids))  # nothing scored twice
    kept = {"replaced": rows[:16] + rows[30:40], "grown": rows, "limit": rows[:16]}[change]
    assert set(ids) == {r["doc_id"] for r in kept}  # night 2's committed part is kept
    assert validate_run(out).ok, validate_run(out).render()


def test_a_moved_project_resumes_and_other_files_are_still_refused(
    drug_rows, tiny_en_dir, tmp_path, monkeypatch
):
    """The inputs were compared by their absolute paths: after `mv project project2` (data and runs
    together, the same relative command) every resume was refused as another job's, with --overwrite
    (the run's history gone) as the way out. The same files by new names are the same inputs."""
    rows = [{"doc_id": f"r{i}", "text": r["text"][:200]} for i, r in enumerate(drug_rows[:24])]
    project = tmp_path / "project"
    project.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), project / "reviews.parquet")
    monkeypatch.chdir(project)
    spec = JobSpec(
        inputs=InputSpec(["reviews.parquet"], id_col="doc_id"),
        model=str(tiny_en_dir),
        out="run",
        window=6,
        progress=False,
    )
    with pytest.raises(WriteError):
        run_job(spec, part_writer=_failing_at("part-000000000012"))
    moved = tmp_path / "project2"
    project.rename(moved)
    monkeypatch.chdir(moved)
    run_job(spec)  # goes on where it stopped
    ids = read_table(moved / "run", "predictions").column("doc_id").to_pylist()
    assert sorted(ids) == sorted(r["doc_id"] for r in rows) and len(ids) == len(set(ids))
    manifest = json.loads((moved / "run" / "manifest.json").read_text())
    assert manifest["fingerprint"]["inputs"] == [str(moved / "reviews.parquet")]
    assert validate_run(moved / "run").ok
    # another file under another name is not the run's input
    pq.write_table(pa.Table.from_pylist(rows[:5]), moved / "other.parquet")
    with pytest.raises(RunDirError, match="the inputs changed since this run began"):
        run_job(dataclasses.replace(spec, inputs=dataclasses.replace(spec.inputs, paths=["other.parquet"])))


def test_a_resume_refuses_rows_edited_in_the_middle_of_a_file_that_kept_its_size_and_ends(
    tiny_en_dir, tmp_path
):
    """A row fixed in place, away from the 64 KB at each end that the input fingerprint hashes, kept the
    file's size and ends: the resume went on and the run held the old text beside rows of the new file,
    and validate passed it. Each part's rows are now read again and compared before the run goes on."""
    filler = "x" * 150  # each line ~170 bytes: the edited row lies far from both ends' 64 KB
    lines = [f"review {i:04d} {filler}" for i in range(1200)]
    src, out = tmp_path / "in.txt", tmp_path / "run"
    src.write_text("\n".join(lines) + "\n")
    spec = JobSpec(inputs=[str(src)], model=str(tiny_en_dir), out=str(out), window=100, progress=False)
    with pytest.raises(WriteError):
        run_job(spec, part_writer=_failing_at("part-000000000700"))
    at = len("\n".join(lines[:500]))  # the edited row's first byte: past the first 64 KB, before the last
    assert 65536 < at < src.stat().st_size - 65536
    lines[500] = lines[500].replace("review", "REVIEW")  # same size, same ends
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunDirError, match=r"input rows 500\.\.599 read otherwise now .*part-000000000500"):
        run_job(spec)
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    report = validate_run(out)
    assert not report.ok and "input rows 500..599" in report.render(), report.render()
    lines[500] = lines[500].replace("REVIEW", "review")  # the file as it was: the run goes on
    src.write_text("\n".join(lines) + "\n")
    run_job(spec)
    assert read_table(out, "predictions").num_rows == 1200
    assert validate_run(out).ok


def _edited_middle(tmp_path: Path) -> tuple[Path, list[str]]:
    lines = [f"review {i:04d} {'x' * 150}" for i in range(1200)]  # row 500 lies past both ends' 64 KB
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    return src, lines


def test_a_complete_run_refused_for_edited_rows_keeps_its_manifest(tiny_en_dir, tmp_path):
    """The refusal came after the pass began: a complete run was left "interrupted" (its next
    --incremental job then finished it by row number, edited rows and all), its resumes counted."""
    src, lines = _edited_middle(tmp_path)
    out = tmp_path / "run"
    spec = JobSpec(inputs=[str(src)], model=str(tiny_en_dir), out=str(out), window=100, progress=False)
    run_job(spec)
    before = json.loads((out / "manifest.json").read_text())
    lines[500] = lines[500].replace("review", "REVIEW")
    src.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunDirError, match=r"input rows 500\.\.599 read otherwise now"):
        run_job(spec)
    after = json.loads((out / "manifest.json").read_text())
    assert after.pop("updated_at") >= before.pop("updated_at")
    assert after == before


def test_an_interrupted_first_incremental_pass_goes_on_by_id_over_edited_rows(tiny_en_dir, tmp_path):
    """A pass by id keeps the text an id had when it was scored: refusing the edit (as a pass by row
    number does) left a nightly job stuck, with --overwrite, which drops the run's history, as the way
    out."""
    src, lines = _edited_middle(tmp_path)
    out = tmp_path / "run"
    spec = JobSpec(inputs=[str(src)], model=str(tiny_en_dir), out=str(out), window=100, progress=False,
                   on_existing="incremental")  # fmt: skip
    with pytest.raises(WriteError):
        run_job(spec, part_writer=_failing_at("part-000000000700"))
    lines[500] = lines[500].replace("review", "REVIEW")
    src.write_text("\n".join(lines) + "\n")
    run_job(spec)
    preds = read_table(out, "predictions")
    assert preds.num_rows == 1200 and "REVIEW" not in preds.column("text")[500].as_py()
    assert validate_run(out).ok, validate_run(out).render()


def test_files_renamed_inside_an_input_folder_are_the_same_inputs(tiny_en_dir, tmp_path):
    """Renaming a file given by name, or the folder, resumed; renaming one inside a folder was refused
    as "a.txt is gone, b.txt is new", though the bytes and their order were the same."""
    folder, out = tmp_path / "in", tmp_path / "run"
    folder.mkdir()
    for name, start in (("a.txt", 0), ("c.txt", 30)):
        (folder / name).write_text("".join(f"review {i} is fine\n" for i in range(start, start + 30)))
    spec = JobSpec(
        inputs=InputSpec([str(folder)], limit=40),
        model=str(tiny_en_dir),
        out=str(out),
        window=10,
        progress=False,
    )
    run_job(spec)
    (folder / "c.txt").rename(folder / "d.txt")  # still after a.txt
    run_job(dataclasses.replace(spec, inputs=dataclasses.replace(spec.inputs, limit=None)))
    assert sorted(read_table(out, "predictions").column("row_index").to_pylist()) == list(range(60))


def test_a_row_blanked_in_place_in_the_last_part_keeps_a_complete_run_complete(tiny_en_dir, tmp_path):
    """A row of the last part blanked in place (a JSONL reader skips blank lines): the inputs had one
    row fewer, the last part's rows never all came back to be compared, and the refusal marked the
    complete run "interrupted", after which --incremental could only fail the same way."""
    rows = [json.dumps({"doc_id": f"r{i}", "text": f"review {i} " + "y" * 2000}) for i in range(300)]
    src, out = tmp_path / "in.jsonl", tmp_path / "run"
    src.write_text("\n".join(rows) + "\n")
    spec = JobSpec(
        inputs=InputSpec([str(src)], id_col="doc_id"),
        model=str(tiny_en_dir),
        out=str(out),
        window=128,
        max_length=16,
        progress=False,
    )
    run_job(spec)
    before = json.loads((out / "manifest.json").read_text())
    rows[260] = " " * len(rows[260])  # past the first 64 KB, before the last
    src.write_text("\n".join(rows) + "\n")
    with pytest.raises(RunDirError, match="hold rows up to 299, but the inputs have 299 rows"):
        run_job(spec)
    after = json.loads((out / "manifest.json").read_text())
    assert after.pop("updated_at") >= before.pop("updated_at")
    assert after == before
    run_job(dataclasses.replace(spec, on_existing="incremental"))  # a new pass by id: nothing new
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
