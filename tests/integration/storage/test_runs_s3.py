"""Runs written to and read from a real S3 API on loopback (moto): exactly once without rename."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from conftest import free_port
from helpers import SORT_KEYS, read_table, same_job_table
from typer.testing import CliRunner

from bertattn_batch import schema, storage
from bertattn_batch.cli import app
from bertattn_batch.config import JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.errors import RunDirError
from bertattn_batch.run import Lease, committed_files, local_run, part_paths, read_manifest

runner = CliRunner()
KILLER = Path(__file__).resolve().parents[2] / "killer.py"
REPO = Path(__file__).resolve().parents[3]
RECIPE = re.compile(r"<!-- recipe: (\w+) -->\n```\w+\n(.*?)```", re.S)


@pytest.fixture(scope="module")
def corpus(drug_rows, tmp_path_factory) -> Path:
    rows = [{"doc_id": r["doc_id"], "text": r["text"][:300], "label": r["label"]} for r in drug_rows[:40]]
    path = tmp_path_factory.mktemp("s3corpus") / "reviews.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _args(inputs: str, model: Path | str, out: str, *more: str) -> list[str]:
    return [
        "extract", inputs, "--model", str(model), "--out", out, "--id-col", "doc_id",
        "--label-col", "label", "--window", "10", "--batch-tokens", "1500", "--no-progress", *more,
    ]  # fmt: skip


def _sorted(table: pa.Table, name: str) -> pa.Table:
    return same_job_table(table).sort_by([(k, "ascending") for k in SORT_KEYS[name]])


def _store_tables(run: str) -> dict[str, pa.Table]:
    """Every table as the manifest lists it, read with pyarrow over S3 (not through bertattn)."""
    fs, root = storage.resolve(run)
    manifest = json.loads(fs.open_input_file(f"{root}/manifest.json").readall())
    out = {}
    for t in schema.TABLES:
        files = [f"{root}/{p['files'][t]}" for p in manifest["parts"]]
        out[t] = _sorted(ds.dataset(files, format="parquet", filesystem=fs).to_table(), t)
    return out


@pytest.fixture(scope="module")
def reference(corpus, tiny_en_dir, tmp_path_factory) -> dict[str, pa.Table]:
    out = tmp_path_factory.mktemp("s3ref") / "run"
    r = runner.invoke(app, _args(str(corpus), tiny_en_dir, str(out)))
    assert r.exit_code == 0, r.output
    return {t: _sorted(read_table(out, t), t) for t in schema.TABLES}


def _upload(local: Path, uri: str) -> None:
    storage.write_bytes(uri, local.read_bytes())


def test_extract_to_s3_from_s3_reads_back_with_pyarrow_and_polars(bucket, corpus, tiny_en_dir, reference):
    src, run = f"s3://{bucket}/in/reviews.parquet", f"s3://{bucket}/runs/r1"
    _upload(corpus, src)
    r = runner.invoke(app, _args(src, tiny_en_dir, run))
    assert r.exit_code == 0, r.output
    got = _store_tables(run)
    for t in schema.TABLES:
        assert got[t].equals(reference[t]), t
    # polars, straight from the store, through the manifest's list (credentials from the environment)
    files = [p.files["predictions"] for p in committed_files(run, ("predictions",))]
    assert all(f.startswith(f"s3://{bucket}/runs/r1/predictions/part-") for f in files)
    preds = pl.scan_parquet(files).collect()
    assert preds.height == 40 and preds["doc_id"].n_unique() == 40
    assert read_manifest(run).status == "complete"
    names = storage.list_names(run, recursive=True)
    assert "_lease.json" not in names and not any(n.startswith("commits") for n in names)


def test_host_processes_upload_the_parts_of_a_run_on_s3(bucket, corpus, tiny_en_dir, reference):
    """Host processes upload parts under the run's lease (pickled to them with the part writer), and the
    job's process commits them: the same tables as a local run."""
    run = f"s3://{bucket}/runs/hosts"
    r = runner.invoke(app, _args(str(corpus), tiny_en_dir, run, "--host-processes", "2"))
    assert r.exit_code == 0, r.output
    got = _store_tables(run)
    for t in schema.TABLES:
        assert got[t].equals(reference[t]), t
    assert read_manifest(run).status == "complete"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tells a process's start time from /proc")
def test_sigkill_then_resume_on_s3_gives_the_uninterrupted_tables(
    bucket, corpus, tiny_en_dir, reference, caplog
):
    run = f"s3://{bucket}/runs/killed"
    args = _args(str(corpus), tiny_en_dir, run)
    killed = subprocess.run(
        [sys.executable, str(KILLER), "write", "3", "--", *args],
        capture_output=True,
        text=True,
        env=os.environ,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # its lease has not expired, but its process is gone, as this machine can tell: validate tells the run
    # from a live one (naming the run, not its mirror), and a rerun takes it over at once, saying so
    r = runner.invoke(app, ["validate", run, "--no-source"])
    assert r.output.startswith(f"{run}: status interrupted"), r.output
    assert (
        "status 'running', but no process is writing it: "
        "it was stopped (killed, or its last manifest write failed)" in r.output
    )
    assert json.loads(storage.read_bytes(f"{run}/_lease.json"))["expires_at"] > time.time()
    with caplog.at_level(logging.WARNING):
        r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "is gone: this run takes it over" in caplog.text
    got = _store_tables(run)
    for t in schema.TABLES:
        assert got[t].equals(reference[t]), t
    listed = {p.files[t].rsplit("/", 1)[1] for p in committed_files(run) for t in p.files}
    assert set(storage.list_names(f"{run}/predictions")) <= listed  # no stray object left


def test_a_part_no_manifest_lists_is_not_read_and_is_cleaned(bucket, corpus, tiny_en_dir):
    run = f"s3://{bucket}/runs/stray"
    r = runner.invoke(app, _args(str(corpus), tiny_en_dir, run, "--limit", "20"))
    assert r.exit_code == 0, r.output
    # a dead worker's upload, never committed, under the name its window would have
    stray = f"{run}/predictions/part-000000000020.parquet"
    storage.write_bytes(stray, storage.read_bytes(committed_files(run)[0].files["predictions"]))
    assert len(committed_files(run)) == 2
    r = runner.invoke(app, ["validate", run, "--no-source"])
    assert r.exit_code != 0 and "part-000000000020.parquet" in r.output, r.output
    agg = runner.invoke(app, ["aggregate", run])
    assert agg.exit_code == 0, agg.output
    r = runner.invoke(app, _args(str(corpus), tiny_en_dir, run))  # resume: the stray is replaced
    assert r.exit_code == 0, r.output
    assert read_manifest(run).counts["predictions"] == 40
    r = runner.invoke(app, ["validate", run, "--no-source"])
    assert r.exit_code == 0, r.output


def test_a_stored_job_that_ends_while_validate_mirrors_it_is_not_called_stopped(
    bucket, corpus, tiny_en_dir, monkeypatch
):
    """Its lease was asked after the mirror was made: a job that ended meanwhile had dropped it, and
    the mirror's manifest still said running, so a live run was called stopped (killed?)."""
    run = f"s3://{bucket}/runs/ending"
    assert runner.invoke(app, _args(str(corpus), tiny_en_dir, run, "--limit", "20")).exit_code == 0
    manifest = json.loads(storage.read_bytes(f"{run}/manifest.json"))
    storage.write_bytes(f"{run}/manifest.json", json.dumps({**manifest, "status": "running"}).encode())
    held = Lease.take(run, settle_s=0)
    mirror = storage.mirror

    def job_ends_meanwhile(*args, **kwargs):
        held.drop()
        return mirror(*args, **kwargs)

    monkeypatch.setattr(storage, "mirror", job_ends_meanwhile)
    r = runner.invoke(app, ["validate", run, "--no-source"])
    assert "no process is writing it" not in r.output and "status running" in r.output, r.output


def test_a_live_lease_refuses_a_second_run(bucket, corpus, tiny_en_dir):
    run = f"s3://{bucket}/runs/busy"
    held = Lease.take(run)
    try:
        r = runner.invoke(app, _args(str(corpus), tiny_en_dir, run))
        assert r.exit_code != 0 and "another bertattn process" in r.output, r.output
        with pytest.raises(RunDirError, match="another bertattn process"):
            Lease.take(run)

        class NotStarted:  # refused before the engine (a Ray runtime: seconds) starts
            def __init__(self, spec):
                raise AssertionError("the engine started")

        spec = JobSpec(inputs=[str(corpus)], model=str(tiny_en_dir), out=run, progress=False)
        with pytest.raises(RunDirError, match="another bertattn process"):
            run_job(spec, engine=NotStarted)
    finally:
        held.drop()


def test_missing_bucket_and_bad_credentials_are_one_line(s3_env, corpus, tiny_en_dir, monkeypatch):
    r = runner.invoke(app, _args(str(corpus), tiny_en_dir, "s3://no-such-bucket/run"))
    assert r.exit_code != 0
    # the bucket named, not the lease object the run first reads (a name the user never gave)
    assert "s3://no-such-bucket: bucket 'no-such-bucket' does not exist" in r.output, r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    r = runner.invoke(app, _args("s3://no-such-bucket/reviews/*.jsonl", tiny_en_dir, f"{corpus}-out"))
    assert r.exit_code != 0 and "bucket 'no-such-bucket' does not exist" in r.output, r.output


def test_model_plot_and_report_from_the_store(bucket, corpus, tiny_en_dir, tmp_path):
    """--model from a store's folder; plot reads one review from the store; report writes its page back."""
    model = f"s3://{bucket}/models/tiny"
    for f in tiny_en_dir.rglob("*"):
        if f.is_file():
            _upload(f, f"{model}/{f.relative_to(tiny_en_dir).as_posix()}")
    run = f"s3://{bucket}/runs/reading"
    r = runner.invoke(app, _args(str(corpus), tiny_en_dir, run, "--limit", "20"))
    assert r.exit_code == 0, r.output
    local = tmp_path / "local"
    r = runner.invoke(app, _args(str(corpus), model, str(local), "--limit", "20"))
    assert r.exit_code == 0, r.output
    assert read_manifest(str(local)).model["weights_sha256"] == read_manifest(run).model["weights_sha256"]
    doc = pl.scan_parquet(committed_files(run, ("predictions",))[0].files["predictions"]).first().collect()
    out = tmp_path / "review.csv"
    r = runner.invoke(app, ["plot", run, "--doc-id", doc["doc_id"][0], "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text(encoding="utf-8").count("\n") >= 2
    r = runner.invoke(app, ["report", run])
    assert r.exit_code == 0 and f"wrote {run}/report.html" in r.output, r.output
    page = storage.read_bytes(f"{run}/report.html").decode()
    assert "<html" in page.lower() and "token_influence.parquet" in "".join(
        storage.list_names(f"{run}/aggregates")
    )
    # named by the run's URI, not the cache folder it is mirrored into (the report advised running
    # faithfulness on the mirror, which the next mirror update undid)
    cache = str(storage.cache_folder("runs", run))
    assert "<title>bertattn run: reading</title>" in page and f"bertattn faithfulness {run}" in page
    assert cache not in page
    r = runner.invoke(app, ["aggregate", run])
    assert r.exit_code == 0 and f"wrote {run}/aggregates/token_influence.parquet" in r.output, r.output
    r = runner.invoke(app, ["plot", run, "--doc-id", "no-such-review", "--out", str(out)])
    assert r.exit_code == 1 and cache not in r.output and run in r.output, r.output
    none = f"s3://{bucket}/runs/none"
    storage.write_bytes(f"{none}/notes.txt", b"no run here")
    r = runner.invoke(app, ["aggregate", none])
    assert r.exit_code == 1 and f"{none} is not a run directory" in r.output, r.output


def test_an_endpoint_where_nothing_answers_is_one_line(s3_env, tiny_en_dir, monkeypatch):
    """The SDK's own text ("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7")
    did not say which setting to look at."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    r = runner.invoke(app, ["validate", "s3://some-bucket/run"])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1, r.output
    assert f"the store cannot be reached at {endpoint}" in r.output and "AWS_ENDPOINT_URL" in r.output, (
        r.output
    )


def test_bad_credentials_are_one_line(tmp_path, corpus, tiny_en_dir, monkeypatch):
    """A store that checks keys (moto with authentication on, in a process of its own) refuses ours."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for(port)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        r = runner.invoke(app, _args(str(corpus), tiny_en_dir, "s3://some-bucket/run"))
        assert r.exit_code != 0
        assert "refused the credentials" in r.output and len(r.output.strip().splitlines()) == 1, r.output
        r = runner.invoke(app, ["validate", "s3://some-bucket/run"])
        assert r.exit_code != 0 and "refused the credentials" in r.output, r.output
    finally:
        server.terminate()
        server.wait(10)


def _wait_for(port: int) -> None:
    import socket
    import time

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("the moto server did not start")


def _recipe(name: str, run: str) -> str:
    """A recipe of docs/storage.md, asked of ``run``."""
    found = dict(RECIPE.findall((REPO / "docs" / "storage.md").read_text(encoding="utf-8")))
    return found[name].replace("s3://runs/dianping-2026-12", run)


def test_the_docs_recipes_read_what_the_manifest_lists(bucket, corpus, tiny_en_dir, tmp_path):
    """docs/storage.md's polars recipe on S3 (a stray upload not read); its DuckDB recipe on a local run
    (offline, DuckDB cannot fetch httpfs), and the files it is handed on S3."""
    run = f"s3://{bucket}/runs/recipes"
    r = runner.invoke(app, _args(str(corpus), tiny_en_dir, run, "--limit", "20"))
    assert r.exit_code == 0, r.output
    stray = f"{run}/cls_attention/part-000000000020.parquet"
    storage.write_bytes(stray, storage.read_bytes(committed_files(run)[1].files["cls_attention"]))
    scope: dict = {}
    exec(_recipe("store_polars", run), scope)
    got = scope["attention"].collect()
    want = pl.from_arrow(read_table_via_manifest(run))
    assert got.height == want.height > 0 and "token" in got.columns
    assert part_paths(run, "cls_attention") == [p.files["cls_attention"] for p in committed_files(run)]
    local = tmp_path / "local"
    r = runner.invoke(app, _args(str(corpus), tiny_en_dir, str(local), "--limit", "20"))
    assert r.exit_code == 0, r.output
    offline = _recipe("store_duckdb", str(local)).replace(
        'con.sql("INSTALL httpfs; LOAD httpfs; CREATE SECRET (TYPE s3, PROVIDER credential_chain)")', ""
    )
    scope = {}
    exec(offline, scope)
    assert scope["counts"]["rows"].sum() == pq.read_table(local / "cls_attention").num_rows


def read_table_via_manifest(run: str) -> pa.Table:
    return pa.concat_tables(
        pq.read_table(storage.open_input(p.files["cls_attention"], buffered=False))
        for p in committed_files(run)
    )


def test_a_nightly_incremental_run_on_s3_scores_only_new_ids(bucket, drug_rows, tiny_en_dir):
    """The scheduled job of a lakehouse: the corpus prefix grows a file a night; --incremental adds
    the new reviews to the same run on the store, and the old ones are not scored again."""
    rows = [{"doc_id": f"r{i}", "text": r["text"][:200]} for i, r in enumerate(drug_rows[:24])]
    corpus, run = f"s3://{bucket}/corpus", f"s3://{bucket}/runs/nightly"

    def night(k: int) -> None:
        sink = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(rows[12 * k : 12 * k + 12]), sink)
        storage.write_bytes(f"{corpus}/day-{k}.parquet", sink.getvalue())
        args = ["extract", corpus, "--model", str(tiny_en_dir), "--out", run, "--id-col", "doc_id",
                "--window", "5", "--incremental", "--no-progress"]  # fmt: skip
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output

    night(0)
    night(1)
    manifest = read_manifest(run)
    assert manifest.generation == 1 and manifest.counts["predictions"] == 24
    ids = pl.scan_parquet([p.files["predictions"] for p in committed_files(run)]).collect()["doc_id"]
    assert sorted(ids.to_list()) == sorted(r["doc_id"] for r in rows)


def test_file_uris_name_local_runs(corpus, tiny_en_dir, tmp_path):
    run = f"file://{tmp_path}/run"
    r = runner.invoke(app, _args(f"file://{corpus}", tiny_en_dir, run, "--limit", "10"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "run" / "manifest.json").is_file()
    for args in (
        ["validate", run],
        ["aggregate", run],
        ["plot", run, "--doc-id", "0", "--out", str(tmp_path / "p.csv")],
    ):
        r = runner.invoke(app, args)
        assert r.exit_code == 0 or "not among the scored reviews" in r.output, (args, r.output)


def _stopped(pid: int, timeout: float = 60) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP), waiting for it up to ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as f:
            if any(line.startswith("State:\tT") for line in f):
                return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads a process's state from /proc")
def test_a_paused_run_whose_lease_was_taken_over_writes_nothing(bucket, corpus, tiny_en_dir, reference):
    """Two extracts on one --out: the first pauses mid-run (SIGSTOP: a frozen VM, a long GC) holding the
    lease, and the second is refused; once the lease has expired the second takes the run over and
    finishes it. Woken, the first finds its lease gone and stops without writing a manifest, a part, or
    deleting the second's: the run is the uninterrupted one."""
    run = f"s3://{bucket}/runs/paused"
    args = _args(str(corpus), tiny_en_dir, run)
    first = subprocess.Popen(
        [sys.executable, str(KILLER), "forward", "2", "--", *args],
        env={**os.environ, "KILLER_SIGNAL": "STOP"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert _stopped(first.pid), "the first extract did not reach its second batch"
        r = runner.invoke(app, args)
        assert r.exit_code != 0 and "another bertattn process" in r.output, r.output
        lease = f"{run}/_lease.json"
        doc = json.loads(storage.read_bytes(lease))
        storage.write_bytes(lease, json.dumps({**doc, "expires_at": 0}).encode())  # as if it had expired
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        manifest = storage.read_bytes(f"{run}/manifest.json")
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=120)
    assert first.returncode != 0 and "taken over" in err, err
    assert storage.read_bytes(f"{run}/manifest.json") == manifest  # not written by the first
    got = _store_tables(run)
    for t in schema.TABLES:
        assert got[t].equals(reference[t]), t
    # what it had in flight went up under its own name, which no manifest lists: named by validate,
    # never read, and swept by the next run on this --out
    listed = {f for p in committed_files(run) for f in p.files.values()}
    strays = [
        f"{run}/{n}" for n in storage.list_names(run, recursive=True) if n.split("/")[0] in schema.TABLES
    ]
    strays = [f for f in strays if f not in listed]
    r = runner.invoke(app, ["validate", run, "--no-source"])
    assert all(f.rsplit("/", 1)[1] in r.output for f in strays), r.output
    assert r.exit_code == (1 if strays else 0), r.output
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["validate", run, "--no-source"])
    assert r.exit_code == 0, r.output


def test_commands_on_one_machine_take_a_stored_runs_mirror_in_turn(bucket, tmp_path):
    """Two commands updating one mirror at once deleted each other's files: the second now waits."""
    uri = f"s3://{bucket}/runs/r"
    storage.write_bytes(f"{uri}/aggregates/x.txt", b"x")
    done = tmp_path / "done"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import pathlib, time\nfrom bertattn_batch.run import local_run\n"
         f"with local_run({uri!r}):\n    print('in', flush=True)\n    time.sleep(3)\n"
         f"    pathlib.Path({str(done)!r}).touch()\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "in"
        with local_run(uri) as local:
            assert done.exists(), "entered the mirror while another process held it"
            assert (local / "aggregates" / "x.txt").read_bytes() == b"x"
            (local / "report.html").write_text("r")
            with local_run(uri + "/", write_back=True) as again:  # the same thread may enter again...
                assert again == local and (local / "report.html").is_file()  # ...and finds it as it was
    finally:
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
    assert holder.returncode == 0
