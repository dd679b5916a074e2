"""``--engine ray`` writes the run the local engine writes: the same review ids, predictions and attention,
from every reader; a worker process killed mid-run is retried with no duplicate or missing rows."""

from __future__ import annotations

import gzip
import importlib.util
import json
import lzma
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from helpers import RUN_COLUMNS, manifest_json, read_table
from typer.testing import CliRunner

from bertattn_batch import schema
from bertattn_batch.cli import app
from bertattn_batch.config import JobSpec, from_dict, load_job
from bertattn_batch.engines import run_job
from bertattn_batch.engines.ray import RayEngine, WindowActor, plan_placement, ray_runtime
from bertattn_batch.errors import EngineError, InputError, ModelError, SpecError, WriteError
from bertattn_batch.run import PartWriter

#: One worker runs every test that starts a Ray runtime (pytest -n with --dist loadgroup).
pytestmark = pytest.mark.xdist_group("ray")
HAS_RAY = importlib.util.find_spec("ray") is not None
#: Keys that order each table's rows identically whichever engine wrote them.
ORDER = {
    "predictions": ["row_index"],
    "cls_attention": ["doc_id", "layer", "head", "position"],
    "tokens": ["doc_id", "position"],
    "head_summary": ["doc_id", "layer", "head"],
}
FLOATS = {
    "probs",
    "pred_prob",
    "weight",
    "weight_scaled",
    "weight_norm",
    "value_zeroing",
    "weight_cls",
    "weight_sep",
    "weight_min",
    "weight_max",
}


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray runtime with 2 CPUs for this module's runs (the engine reuses it, as it would a
    cluster)."""
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install '.[ray]')")
    with ray_runtime(num_cpus=2) as ray:
        yield ray


def _spec(src, model, out, **kw) -> JobSpec:
    """A job over ``src`` with ``kw``'s keys, as a job file names them."""
    return from_dict(
        JobSpec,
        {"inputs": [str(s) for s in src], "model": str(model), "out": str(out), "progress": False, **kw},
    )


def _sorted(run: Path, table: str) -> pa.Table:
    return read_table(run, table).sort_by([(k, "ascending") for k in ORDER[table]])


def assert_same_run(ray_run: Path, local_run: Path, atol: float = 1e-5) -> None:
    """Every table holds the same rows; floats agree to ``atol``, everything else exactly."""
    for name in schema.TABLES:
        got, want = _sorted(ray_run, name), _sorted(local_run, name)
        assert got.num_rows == want.num_rows, name
        assert got.column_names == want.column_names == schema.columns(name)
        for col in (c for c in got.column_names if c not in RUN_COLUMNS):
            if col in FLOATS:
                g, w = got.column(col).to_pylist(), want.column(col).to_pylist()
                assert [x is None for x in g] == [x is None for x in w], (name, col)
                g = np.concatenate([np.ravel(x) for x in g if x is not None] or [np.zeros(0)])
                w = np.concatenate([np.ravel(x) for x in w if x is not None] or [np.zeros(0)])
                np.testing.assert_allclose(g, w, atol=atol, rtol=0, err_msg=f"{name}.{col}")
            else:
                assert got.column(col).to_pylist() == want.column(col).to_pylist(), (name, col)


def assert_parts_tile_the_rows(run: Path, n_rows: int) -> None:
    """Manifest parts are unique and cover rows [0, n) once; the folders hold exactly the listed files."""
    parts = sorted(manifest_json(run)["parts"], key=lambda p: p["start_row"])
    assert len({p["name"] for p in parts}) == len(parts)
    assert [p["start_row"] for p in parts[1:]] == [p["end_row"] for p in parts[:-1]]
    assert parts[0]["start_row"] == 0 and parts[-1]["end_row"] == n_rows
    for table in schema.TABLES:
        on_disk = sorted(f.name for f in (run / table).iterdir())
        assert on_disk == sorted(p["name"] for p in parts), table
        rows = sum(pq.ParquetFile(run / table / p["name"]).metadata.num_rows for p in parts)
        assert rows == sum(p["rows"][table] for p in parts) == read_table(run, table).num_rows


# -- no Ray needed ------------------------------------------------------------------------------------
def test_spec_keys_are_checked(tmp_path):
    with pytest.raises(SpecError, match="engine must be one of local, ray"):
        JobSpec(inputs=["a"], model="m", out="o", engine="spark")
    with pytest.raises(SpecError, match="workers must be at least 1"):
        JobSpec(inputs=["a"], model="m", out="o", workers=0)
    job = tmp_path / "job.toml"
    job.write_text(
        'inputs = ["a.parquet"]\nmodel = "m"\nout = "o"\nengine = "ray"\nworkers = 3\nray_address = "auto"\n'
    )
    spec = load_job(job)
    assert (spec.engine, spec.workers, spec.ray_address) == ("ray", 3, "auto")
    assert load_job(job, engine="local", workers=2).engine == "local"


def test_placement_gives_each_worker_a_gpu_or_a_share_of_the_cpus():
    spec = JobSpec(inputs=["a"], model="m", out="o", engine="ray", workers=4)
    gpu = plan_placement(spec, cluster_cpus=64, node_cpus=16, cluster_gpus=4)
    assert (gpu.gpus, gpu.cpus, gpu.device) == (1, 1, "cuda")
    cpu = plan_placement(spec, cluster_cpus=64, node_cpus=8, cluster_gpus=0)
    assert (cpu.gpus, cpu.cpus, cpu.device) == (0, 8, "cpu")  # 16 each would not fit on a node
    assert plan_placement(spec, cluster_cpus=2, node_cpus=2, cluster_gpus=0).cpus == 1
    forced = JobSpec(inputs=["a"], model="m", out="o", engine="ray", device="cpu")
    assert plan_placement(forced, 8, 8, cluster_gpus=2).gpus == 0
    with pytest.raises(SpecError, match="--device cuda or auto"):
        plan_placement(JobSpec(inputs=["a"], model="m", out="o", device="cuda:1"), 8, 8, 2)
    with pytest.raises(SpecError, match="no GPUs"):
        plan_placement(JobSpec(inputs=["a"], model="m", out="o", device="cuda"), 8, 8, 0)


def test_without_ray_the_error_says_how_to_install(monkeypatch, tiny_en_dir, drug_sample, tmp_path):
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when it is not installed
    spec = _spec([drug_sample], tiny_en_dir, tmp_path / "run", engine="ray")
    with pytest.raises(EngineError, match=r"pip install '\.\[ray\]' in a checkout"):
        run_job(spec)
    r = CliRunner().invoke(
        app,
        [
            "extract",
            str(drug_sample),
            "--model",
            str(tiny_en_dir),
            "--out",
            str(tmp_path / "o"),
            "--engine",
            "ray",
        ],
    )
    assert r.exit_code == 1
    assert r.output.startswith("error: --engine ray needs Ray") and "pip install" in r.output
    assert not (tmp_path / "run").exists()


# -- on a local Ray runtime ---------------------------------------------------------------------------
@pytest.mark.slow
def test_two_workers_give_the_local_engines_answers(ray_local, minilm_dir, drug_sample, tmp_path):
    kw = dict(id_col="doc_id", label_col="label", window=5, batch_tokens=1200, max_batch_size=8)
    run_job(_spec([drug_sample], minilm_dir, tmp_path / "local", **kw))
    summary = run_job(_spec([drug_sample], minilm_dir, tmp_path / "ray", engine="ray", workers=2, **kw))
    assert summary.input_rows == summary.scored == 24
    assert_same_run(tmp_path / "ray", tmp_path / "local")
    assert_parts_tile_the_rows(tmp_path / "ray", 24)
    ids = pq.read_table(drug_sample).column("doc_id").to_pylist()
    assert sorted(read_table(tmp_path / "ray", "predictions").column("doc_id").to_pylist()) == sorted(ids)
    ray_m, local_m = manifest_json(tmp_path / "ray"), manifest_json(tmp_path / "local")
    assert [p["name"] for p in sorted(ray_m["parts"], key=lambda p: p["start_row"])] == [
        p["name"] for p in local_m["parts"]
    ]
    assert ray_m["fingerprint"] == local_m["fingerprint"] and ray_m["counts"] == local_m["counts"]
    assert ray_m["status"] == "complete" and ray_m["spec"]["engine"] == "ray"
    assert ray_m["last_run"]["engine"] == "ray" and ray_m["last_run"]["placement"]["cpus"] == 1
    # The local runtime listens on loopback only.
    assert {n["NodeManagerAddress"] for n in ray_local.nodes()} == {"127.0.0.1"}


class FailingActor:
    """An actor that fails as a window's work can: with the project's error, or a bug."""

    def run(self, x: int):
        if x == 1:
            raise ModelError("out of memory on a single review of 512 tokens; lower --max-length")
        return {}["missing"]


def test_worker_errors_come_back_as_one_line(ray_local):
    import ray.cloudpickle

    from bertattn_batch.engines.ray import _ray_call

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

    def task():
        raise InputError("reviews.csv: no column 'text'")

    with pytest.raises(InputError) as e:
        _ray_call(lambda: ray_local.get(ray_local.remote(task).remote()))
    assert str(e.value) == "reviews.csv: no column 'text'"
    actor = ray_local.remote(FailingActor).options(num_cpus=1).remote()
    with pytest.raises(ModelError) as e:
        _ray_call(lambda: ray_local.get(actor.run.remote(1)))
    assert str(e.value) == "out of memory on a single review of 512 tokens; lower --max-length"
    with pytest.raises(EngineError, match=r"^the Ray run failed: KeyError: 'missing' \(rerun to resume"):
        _ray_call(lambda: ray_local.get(actor.run.remote(2)))
    ray_local.kill(actor)
    for _ in range(50):  # the failed runs' workers are gone: their CPUs are free for the next run
        if ray_local.available_resources().get("CPU", 0) == 2:
            break
        time.sleep(0.2)
    assert ray_local.available_resources().get("CPU", 0) == 2


class DyingActor(WindowActor):
    """Kills its own process once, after writing the part files of the window at row ``die_at`` but
    before the driver hears of them: the retry on a restarted worker must rewrite those very files."""

    flag = ""
    die_at = 8

    def run(self, rows):
        done = super().run(rows)
        if done.entry.start_row == self.die_at:
            try:
                os.unlink(self.flag)  # one claim across processes: only the first comer dies
            except FileNotFoundError:
                return done
            Path(self.flag + ".died").write_text(str(os.getpid()))
            os._exit(1)
        return done


@pytest.mark.slow
def test_a_killed_worker_is_retried_without_duplicates_or_gaps(ray_local, tiny_en_dir, drug_sample, tmp_path):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    flag = tmp_path / "die"
    flag.write_text("")
    DyingActor.flag = str(flag)
    kw = dict(id_col="doc_id", label_col="label", window=4)
    run_job(_spec([drug_sample], tiny_en_dir, tmp_path / "local", **kw))
    summary = run_job(
        _spec([drug_sample], tiny_en_dir, tmp_path / "ray", engine="ray", workers=2, **kw),
        engine=type("DyingEngine", (RayEngine,), {"actor_cls": DyingActor}),
    )
    assert not flag.exists() and Path(f"{flag}.died").is_file()  # a worker really died, once
    assert summary.input_rows == 24 and summary.parts_written == 6
    assert_same_run(tmp_path / "ray", tmp_path / "local")
    assert_parts_tile_the_rows(tmp_path / "ray", 24)
    preds = read_table(tmp_path / "ray", "predictions")
    assert sorted(preds.column("row_index").to_pylist()) == list(range(24))


class ElsewhereActor(WindowActor):
    """A worker that runs in another directory, as one on a cluster's node runs in the raylet's."""

    def __init__(self, *args, **kwargs) -> None:
        os.chdir(tempfile.mkdtemp())
        super().__init__(*args, **kwargs)


def test_relative_paths_reach_workers_that_run_in_another_directory(
    ray_local, tiny_en_dir, drug_sample, tmp_path, monkeypatch
):
    """--out and --model relative to the shell's directory failed on a cluster ("no model folder",
    "Failed to open local file"): the workers were given them as typed."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    shutil.copytree(tiny_en_dir, tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    spec = _spec([drug_sample], "model", "run", id_col="doc_id", window=8, engine="ray", workers=2)
    summary = run_job(spec, engine=type("ElsewhereEngine", (RayEngine,), {"actor_cls": ElsewhereActor}))
    assert summary.input_rows == summary.scored == 24
    assert_parts_tile_the_rows(tmp_path / "run", 24)


class SlowThenFullDisk(PartWriter):
    """The first window's part is slow to write and the second's fails as a full disk would."""

    def _write_parquet(self, table, path):
        if path.name.startswith("_part-000000000000"):
            time.sleep(1.0)
        if path.name.startswith("_part-000000000004"):
            raise OSError(28, "No space left on device")
        super()._write_parquet(table, path)


def test_parts_finished_before_a_workers_failure_are_committed(ray_local, tiny_en_dir, drug_sample, tmp_path):
    """The second window fails while the first is still being written on the other worker: the first is
    finished work and is committed, and the failure is raised once it is."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    out = tmp_path / "ray"
    spec = _spec([drug_sample], tiny_en_dir, out, id_col="doc_id", window=4, limit=8, engine="ray", workers=2)
    with pytest.raises(WriteError, match="No space left on device"):
        run_job(spec, part_writer=SlowThenFullDisk)
    manifest = manifest_json(out)
    assert manifest["status"] == "interrupted"
    assert [p["start_row"] for p in manifest["parts"]] == [0]


def test_the_drivers_own_errors_are_not_blamed_on_a_worker(
    ray_local, tiny_en_dir, drug_sample, tmp_path, monkeypatch
):
    """The driver reads the inputs: an error there came back as "the Ray run failed: OSError ... (rerun
    to resume)", as if a worker had failed, with the traceback gone. It is raised as it is, as the local
    engine raises it."""
    import bertattn_batch.engines.base as base

    real = base.iter_windows

    def input_gone(*args, **kwargs):
        windows = real(*args, **kwargs)
        yield next(windows)
        raise OSError(5, "Input/output error", str(drug_sample))

    monkeypatch.setattr(base, "iter_windows", input_gone)
    out = tmp_path / "ray"
    spec = _spec(
        [drug_sample], tiny_en_dir, out, id_col="doc_id", window=4, limit=12, engine="ray", workers=1
    )
    with pytest.raises(OSError, match="Input/output error") as e:
        run_job(spec)
    assert type(e.value) is OSError
    assert manifest_json(out)["status"] == "interrupted"


@pytest.mark.slow
def test_every_reader_and_status_matches_the_local_engine(ray_local, tiny_en_dir, drug_rows, tmp_path):
    """Parquet, JSON lines and CSV in one job: row numbers run on across files, ids repeat across files,
    texts are null, empty or not text; a limit cuts the last file. The JSON lines and CSV files are
    compressed (gzip, zstd), as the local reader reads them."""
    texts = [r["text"] for r in drug_rows[:9]]
    a = pa.table(
        {"id": ["a0", "a1", "a2", None], "text": [texts[0], None, "  ", texts[1]], "stars": [1, 2, None, 4]}
    )
    b = [{"id": "b0", "text": texts[2], "stars": 5}, {"id": "a1", "text": texts[3], "stars": 1}]
    c = pa.table({"id": ["c0", "b0", "c2", "c3", "c4"], "text": [texts[4], texts[5], "", texts[6], texts[7]]})
    c = c.append_column("stars", pa.array(["3", "2", "1", "0", "9"]))
    pq.write_table(a, tmp_path / "a.parquet")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in b).encode()))
    with pa.CompressedOutputStream(tmp_path / "c.csv.zst", "zstd") as f:
        pcsv.write_csv(c, f)
    src = [tmp_path / "a.parquet", tmp_path / "b.jsonl.gz", tmp_path / "c.csv.zst"]
    kw = dict(id_col="id", label_col="stars", window=3, limit=10)
    run_job(_spec(src, tiny_en_dir, tmp_path / "local", **kw))
    run_job(_spec(src, tiny_en_dir, tmp_path / "ray", engine="ray", workers=1, **kw))
    assert_same_run(tmp_path / "ray", tmp_path / "local")
    preds = _sorted(tmp_path / "ray", "predictions")
    assert preds.column("status").to_pylist() == [
        *["ok", "null_text", "empty_text", "null_id"],
        *["ok", "ok"],  # a1 had no text before: its review is scored
        *["ok", "duplicate_id", "empty_text", "ok"],
    ]
    assert preds.column("doc_id").to_pylist()[3] == "3"  # a null id falls back to the row number
    assert_parts_tile_the_rows(tmp_path / "ray", 10)


@pytest.mark.slow
def test_date_like_json_strings_and_files_without_rows_match_the_local_engine(
    ray_local, tiny_en_dir, tmp_path
):
    """Arrow reads a JSON key whose every value looks like a date as timestamps: ids, labels and texts
    must stay the strings they are. A CSV header alone and a file of empty lines hold no rows (Ray's
    CSV reader rejects both)."""
    rows = [
        {"id": "2024-01-01", "text": "2020-05-01", "label": ["2023-12-31"]},
        {"id": "2024-01-02T10:00:00Z", "text": "good since 2021", "label": ["2023-12-31", "2024-01-01"]},
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "n.jsonl").write_text('{"id": 5, "text": "a number for an id here", "label": [1]}\n')
    (tmp_path / "header.csv").write_text("id,text,label")
    (tmp_path / "blank.csv").write_text("\n\n")
    src = [tmp_path / n for n in ("header.csv", "d.jsonl", "n.jsonl", "blank.csv")]
    kw = dict(id_col="id", label_col="label")
    run_job(_spec(src, tiny_en_dir, tmp_path / "local", **kw))
    run_job(_spec(src, tiny_en_dir, tmp_path / "ray", engine="ray", workers=1, **kw))
    assert_same_run(tmp_path / "ray", tmp_path / "local")
    preds = _sorted(tmp_path / "ray", "predictions")
    assert preds.column("doc_id").to_pylist() == ["2024-01-01", "2024-01-02T10:00:00Z", "5"]
    assert preds.column("label").to_pylist() == ['["2023-12-31"]', '["2023-12-31", "2024-01-01"]', "[1]"]
    assert preds.column("status").to_pylist() == ["ok", "ok", "ok"]


def test_a_json_array_is_read_by_ray_as_the_local_engine_reads_it(ray_local, tiny_en_dir, tmp_path):
    path = tmp_path / "a.json"
    path.write_text('[{"text": "good"}, {"text": "bad"}]\n')
    assert run_job(_spec([path], tiny_en_dir, tmp_path / "out", engine="ray")).scored == 2
    path.write_text('["good"]\n')
    spec = _spec([path], tiny_en_dir, tmp_path / "out2", engine="ray")
    with pytest.raises(InputError, match=r"a.json:1: expected a JSON object in each element of the array"):
        run_job(spec)


@pytest.mark.slow
def test_sigterm_still_reaches_the_cli_once_ray_has_started(tmp_path):
    """ray.init installs a native SIGTERM handler that aborts the process (exit 134); the CLI's own,
    which commits the part in hand and exits 143, must stay in place."""
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install '.[ray]')")
    marker = tmp_path / "handled"
    code = f"""
import os, signal, sys
from bertattn_batch.engines.ray import ray_runtime
signal.signal(signal.SIGTERM, lambda *_: (open({str(marker)!r}, "w").close(), sys.exit(143)))
with ray_runtime(num_cpus=1):
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert marker.exists()


def test_sigterm_while_ray_starts_is_an_interrupt_and_stops_what_started(monkeypatch):
    """Ray's own SIGTERM handler, in place while it starts, exited 15 without a word and left its agents
    running."""
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install '.[ray]')")
    import ray

    from bertattn_batch.errors import Terminated

    stopped = []

    def init(**_options):  # what Ray's handler does with a SIGTERM in its start
        raise SystemExit(15)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append(True))
    with pytest.raises(Terminated), ray_runtime(num_cpus=1):
        pass
    assert stopped == [True]


def test_a_cluster_address_where_nothing_listens_is_refused_at_once():
    """ray.init would retry such an address for minutes without a word."""
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        with (
            pytest.raises(
                EngineError, match=rf"cannot join the Ray cluster at {address}: nothing answers there"
            ),
            ray_runtime(address),
        ):
            pass


def test_a_cluster_on_this_machines_loopback_is_joined_there(ray_local):
    """A cluster started on loopback (as this module's runtime is) was looked for at the machine's
    outward address, which Ray retried for about 14 minutes without a word."""
    address = ray_local.get_runtime_context().gcs_address
    assert address.startswith("127.0.0.1:")
    code = (
        "from bertattn_batch.engines.ray import ray_runtime\n"
        f"with ray_runtime({address!r}) as ray: print(ray.cluster_resources()['CPU'])"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"RAY_AUTH_MODE": "token"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) == 2.0  # the fixture's runtime, not a new one


def test_the_readers_warnings_reach_the_driver(ray_local, tiny_en_dir, tmp_path, caplog):
    """The warnings of the readers that Ray tasks run are given by the driver, as the local engine gives
    them: CSV rows with the wrong number of fields file by file, by their row numbers across all inputs
    (their doc ids), none that a limit leaves unread; a JSON line cut short by its line number. An
    option of the local engine is warned of once (the workers' copy of the spec warned again)."""
    (tmp_path / "a.csv").write_text("text\ngood\nx,y\nfine\n")
    (tmp_path / "b.jsonl").write_text('{"text": "good"}\n\n{"text": "cut\n')
    (tmp_path / "c.csv").write_text("text\n" + "p,q\n" * 6 + "ok\n" + "r,s\n" * 3)
    inputs = [tmp_path / n for n in ("a.csv", "b.jsonl", "c.csv")]
    spec = _spec(inputs, tiny_en_dir, tmp_path / "out", window=4, limit=14, engine="ray", host_processes=2)
    assert run_job(spec).input_rows == 14
    assert caplog.text.count("host_processes is the local engine's") == 1
    assert "a.csv: 1 row has another number of fields than the header (row 1)" in caplog.text
    assert "b.jsonl: 1 line is not a JSON object (line 3); recorded with status not_json" in caplog.text
    assert (
        "c.csv: 8 rows have another number of fields than the header (rows 5, 6, 7, 8, 9, ...)" in caplog.text
    )


@pytest.mark.slow
def test_malformed_rows_get_the_local_engines_statuses(ray_local, tiny_en_dir, drug_rows, tmp_path):
    """Rows that Ray Data's own readers would fail a whole file on keep their place with the local
    engine's status: a CSV row with too many or too few fields, a JSON line cut short, a lone surrogate
    escape, invalid UTF-8 in a text file, a lone carriage return ending a text line; an xz file is read
    too."""
    texts = [r["text"] for r in drug_rows[:6]]
    (tmp_path / "a.csv").write_text(f'id,text\na0,"{texts[0]}"\na1,x,y\na2\na3,"{texts[1]}"\n')
    lines = [
        json.dumps({"id": "b0", "text": texts[2]}),
        '{"id": "b1", "text": "cut sh',
        '{"id": "b2", "text": "\\udc80 lone"}',
        '{"id": "b3", "text": "first", "text": "' + texts[3] + '"}',
    ]
    (tmp_path / "b.jsonl.xz").write_bytes(lzma.compress("\n".join(lines).encode() + b"\n"))
    (tmp_path / "c.txt").write_bytes(texts[4].encode() + b"\nbad \xff byte\nin\rone\n" + texts[5].encode())
    src = [tmp_path / "a.csv", tmp_path / "b.jsonl.xz"]
    run_job(_spec(src, tiny_en_dir, tmp_path / "local", id_col="id"))
    run_job(_spec(src, tiny_en_dir, tmp_path / "ray", id_col="id", engine="ray", workers=1))
    assert_same_run(tmp_path / "ray", tmp_path / "local")
    preds = _sorted(tmp_path / "ray", "predictions")
    assert preds.column("status").to_pylist() == [
        *["ok", "wrong_field_count", "wrong_field_count", "ok"],
        *["ok", "not_json", "invalid_utf8", "ok"],
    ]
    assert preds.column("doc_id").to_pylist() == ["a0", "1", "2", "a3", "b0", "5", "b2", "b3"]
    run_job(_spec([tmp_path / "c.txt"], tiny_en_dir, tmp_path / "local-text"))
    run_job(_spec([tmp_path / "c.txt"], tiny_en_dir, tmp_path / "ray-text", engine="ray", workers=1))
    assert_same_run(tmp_path / "ray-text", tmp_path / "local-text")
    preds = _sorted(tmp_path / "ray-text", "predictions")
    assert preds.column("status").to_pylist() == ["ok", "invalid_utf8", "ok", "ok", "ok"]
    assert preds.column("text").to_pylist()[2:4] == ["in", "one"]


def test_a_saved_dataset_with_class_labels_matches_the_local_engine(
    ray_local, tiny_en_dir, drug_rows, tmp_path
):
    import datasets

    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
    )
    texts = [r["text"][:120] for r in drug_rows[:5]]
    datasets.Dataset.from_dict({"text": texts, "label": [1, 0, -1, 1, 0]}, features=features).save_to_disk(
        str(tmp_path / "saved")
    )
    src = [tmp_path / "saved"]
    run_job(_spec(src, tiny_en_dir, tmp_path / "local", label_col="label"))
    run_job(_spec(src, tiny_en_dir, tmp_path / "ray", label_col="label", engine="ray", workers=1))
    assert_same_run(tmp_path / "ray", tmp_path / "local")
    assert _sorted(tmp_path / "ray", "predictions").column("label").to_pylist() == [
        "pos",
        "neg",
        None,
        "pos",
        "neg",
    ]


@pytest.mark.slow
def test_cli_text_files_and_resume(ray_local, tiny_en_dir, drug_rows, tmp_path):
    lines = [" ".join(r["text"].split()) for r in drug_rows[:7]]  # no line breaks of any kind
    (tmp_path / "a.txt").write_text("\n".join(lines[:3]) + "\n")
    (tmp_path / "b.txt").write_text("\n".join(lines[3:]) + "\n\n")  # an empty line is a row too
    runner = CliRunner()
    args = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "--model", str(tiny_en_dir), "--no-progress"]
    r = runner.invoke(app, ["extract", *args, "--out", str(tmp_path / "local")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(
        app, ["extract", *args, "--out", str(tmp_path / "ray"), "--engine", "ray", "--workers", "2"]
    )
    assert r.exit_code == 0, r.output
    assert "8 reviews (7 scored, 1 not scored: empty_text 1)" in r.output
    assert_same_run(tmp_path / "ray", tmp_path / "local")
    r = runner.invoke(app, ["extract", *args, "--out", str(tmp_path / "ray"), "--engine", "ray"])
    assert r.exit_code == 0, r.output
    assert "nothing new to process" in r.output
    assert manifest_json(tmp_path / "ray")["resumes"] == 1
    with open(tmp_path / "b.txt", "a") as f:  # one more review: --incremental scores only it
        f.write(" ".join(drug_rows[7]["text"].split()) + "\n")
    for engine in ("local", "ray"):
        r = runner.invoke(
            app, ["extract", *args, "--out", str(tmp_path / engine), "--engine", engine, "--incremental"]
        )
        assert r.exit_code == 0, r.output
        # a line of its own: Ray may print a log line of its workers' before it (seen once in CI)
        assert any(line.startswith("1 reviews (1 scored") for line in r.output.splitlines()), r.output
    assert_same_run(tmp_path / "ray", tmp_path / "local")
    assert manifest_json(tmp_path / "ray")["parts"][-1]["name"] == "part-000000000008-g1.parquet"
    assert_parts_tile_the_rows(tmp_path / "ray", 9)
