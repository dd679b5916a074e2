"""Both engines cut the same windows from the inputs alone: the same part names, row ranges and rows,
across file boundaries, and a run stopped on one engine resumes on the other."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest
from helpers import RUN_COLUMNS, SORT_KEYS, manifest_json, read_table

from bertattn_batch import schema
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.engines.ray import ray_runtime
from bertattn_batch.errors import WriteError
from bertattn_batch.run import PartWriter

#: One worker runs every test that starts a Ray runtime (pytest -n with --dist loadgroup).
pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="module")
def ray_local():
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install '.[ray]')")
    with ray_runtime(num_cpus=2) as ray:
        yield ray


@pytest.fixture
def inputs(drug_rows, tmp_path) -> list[Path]:
    """Three files of 7, 5 and 9 reviews in three formats: windows of 4 rows cross every boundary."""
    rows = [
        {"doc_id": f"r{i}", "text": " ".join(r["text"].split())[:300]} for i, r in enumerate(drug_rows[:21])
    ]
    a, b, c = tmp_path / "a.parquet", tmp_path / "b.jsonl", tmp_path / "c.csv"
    pq.write_table(pa.Table.from_pylist(rows[:7]), a)
    b.write_text("".join(json.dumps(r) + "\n" for r in rows[7:12]))
    pa.csv.write_csv(pa.Table.from_pylist(rows[12:]), c)
    return [a, b, c]


def _spec(inputs, model, out, **kw) -> JobSpec:
    return JobSpec(
        inputs=InputSpec([str(p) for p in inputs], id_col="doc_id"),
        model=str(model),
        out=str(out),
        window=4,
        progress=False,
        **kw,
    )


def _parts(run: Path) -> list[tuple[str, int, int, dict]]:
    return [(p["name"], p["start_row"], p["end_row"], p["rows"]) for p in manifest_json(run)["parts"]]


def _same_tables(a: Path, b: Path) -> None:
    for table, keys in SORT_KEYS.items():
        order = [(k, "ascending") for k in keys]
        got, want = read_table(a, table).sort_by(order), read_table(b, table).sort_by(order)
        assert got.num_rows == want.num_rows > 0, table
        for column in (c for c in schema.columns(table) if c not in RUN_COLUMNS):
            g, w = got.column(column).to_pylist(), want.column(column).to_pylist()
            if column in (
                "probs",
                "pred_prob",
                "weight",
                "weight_scaled",
                "weight_cls",
                "weight_sep",
                "weight_min",
                "weight_max",
            ):
                assert pa.array(g).equals(pa.array(w)) or _close(g, w), (table, column)
            else:
                assert g == w, (table, column)


def _close(g: list, w: list, tol: float = 1e-5) -> bool:
    import numpy as np

    flat = [np.ravel(np.asarray(x, dtype=np.float64)) for x in (g, w)]
    return flat[0].shape == flat[1].shape and bool(np.allclose(*flat, atol=tol, rtol=0))


def test_windows_cross_file_boundaries_on_one_grid(inputs, tiny_en_dir, tmp_path):
    run_job(_spec(inputs, tiny_en_dir, tmp_path / "local"))
    parts = _parts(tmp_path / "local")
    assert [(start, end) for _, start, end, _ in parts] == [
        (0, 4),
        (4, 8),
        (8, 12),
        (12, 16),
        (16, 20),
        (20, 21),
    ]
    assert [name for name, *_ in parts] == [f"part-{s:012d}.parquet" for s in range(0, 21, 4)]


@pytest.mark.slow
def test_both_engines_write_the_same_parts(ray_local, inputs, tiny_en_dir, tmp_path):
    """Value zeroing on, so that every column is computed on the workers too."""
    run_job(_spec(inputs, tiny_en_dir, tmp_path / "local", value_zeroing=True))
    run_job(_spec(inputs, tiny_en_dir, tmp_path / "ray", engine="ray", workers=2, value_zeroing=True))
    assert pq.read_table(tmp_path / "ray" / "cls_attention").column("value_zeroing").null_count == 0

    assert _parts(tmp_path / "ray") == _parts(tmp_path / "local")
    for table in schema.TABLES:
        for name, *_ in _parts(tmp_path / "local"):
            got = pq.read_table(tmp_path / "ray" / table / name)
            want = pq.read_table(tmp_path / "local" / table / name)
            assert got.num_rows == want.num_rows and got.column("doc_id").equals(want.column("doc_id"))
    _same_tables(tmp_path / "ray", tmp_path / "local")


class FailsAtRow12(PartWriter):
    """A full disk at the part of rows 12..15: the run stops there, parts 0..11 committed."""

    def _write_parquet(self, table, path):
        if path.name.startswith("_part-000000000012"):
            raise OSError(28, "No space left on device")
        super()._write_parquet(table, path)


@pytest.mark.slow
@pytest.mark.parametrize(("first", "then"), [("local", "ray"), ("ray", "local")])
def test_a_run_stopped_on_one_engine_resumes_on_the_other(
    first, then, ray_local, inputs, tiny_en_dir, tmp_path
):
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    run_job(_spec(inputs, tiny_en_dir, tmp_path / "whole"))
    out = tmp_path / "run"
    with pytest.raises(WriteError, match="No space left on device"):
        run_job(_spec(inputs, tiny_en_dir, out, engine=first, workers=2), part_writer=FailsAtRow12)
    committed = [start for _, start, *_ in _parts(out)]  # Ray: the parts before the failure that came back
    assert committed == list(range(0, 4 * len(committed), 4)) and len(committed) <= 3
    summary = run_job(_spec(inputs, tiny_en_dir, out, engine=then, workers=2))
    assert summary.skipped_committed == 4 * len(committed) and summary.input_rows == 21 - 4 * len(committed)
    assert _parts(out) == _parts(tmp_path / "whole")
    _same_tables(out, tmp_path / "whole")


@pytest.mark.slow
def test_parquet_files_whose_id_types_differ_read_alike_on_both_engines(
    ray_local, drug_rows, tiny_en_dir, tmp_path
):
    """Ray Data merged the files' schemas and refused ``id`` as int64 in one file and string in the
    next; both engines now read each file with its own schema and turn ids into text first."""
    texts = [" ".join(r["text"].split())[:200] for r in drug_rows[:9]]
    pq.write_table(
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "text": texts[:3]}), tmp_path / "a.parquet"
    )
    pq.write_table(pa.table({"id": ["x", "y", "3.5"], "text": texts[3:6]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": pa.array([7.0, 8.5, None]), "text": texts[6:]}), tmp_path / "c.parquet")
    inputs = [tmp_path / f"{n}.parquet" for n in "abc"]
    for engine in ("local", "ray"):
        spec = _spec(inputs, tiny_en_dir, tmp_path / engine, engine=engine, workers=2)
        run_job(dataclasses.replace(spec, inputs=dataclasses.replace(spec.inputs, id_col="id")))
    _same_tables(tmp_path / "ray", tmp_path / "local")
    preds = read_table(tmp_path / "ray", "predictions")
    assert preds.column("doc_id").to_pylist() == ["1", "2", "3", "x", "y", "3.5", "7", "8.5", "8"]
    assert preds.column("status").to_pylist() == ["ok"] * 8 + ["null_id"]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["local", "ray"])
def test_parts_are_committed_while_later_windows_are_still_unread(
    engine, request, drug_rows, tiny_en_dir, tmp_path, monkeypatch
):
    """Both engines stream: the first parts are committed long before the reader reaches the end of the
    inputs, and the windows read but not yet committed (what Ray's object store holds) stay a few,
    whatever the corpus's length."""
    import bertattn_batch.engines.base as base
    from bertattn_batch.engines.ray import IN_FLIGHT_PER_WORKER
    from bertattn_batch.run import RunDir

    if engine == "ray":
        request.getfixturevalue("ray_local")
    src = tmp_path / "reviews.parquet"
    rows = [
        {"doc_id": f"r{i}", "text": " ".join(r["text"].split())[:200]} for i, r in enumerate(drug_rows[:40])
    ]
    pq.write_table(pa.Table.from_pylist(rows), src)
    read = {"windows": 0}
    seen_at_commit: list[int] = []
    real_windows, real_commit = base.iter_windows, RunDir.commit

    def counted(*args, **kwargs):
        for window in real_windows(*args, **kwargs):
            read["windows"] += 1
            yield window

    def commit(self, entry):
        seen_at_commit.append(read["windows"])
        real_commit(self, entry)

    monkeypatch.setattr(base, "iter_windows", counted)
    monkeypatch.setattr(RunDir, "commit", commit)
    run_job(dataclasses.replace(_spec([src], tiny_en_dir, tmp_path / "run", engine=engine), window=2))
    assert len(seen_at_commit) == read["windows"] == 20
    # read and not committed: the windows in flight, at most the executor's bound (Threads.in_flight
    # for the CPU's plan locally; on Ray, those in the one worker's hands)
    if engine == "ray":
        bound = IN_FLIGHT_PER_WORKER
    else:
        import torch

        from bertattn_batch.engines.local import feed_plan

        plan = feed_plan(torch.device("cpu"))
        bound = plan.ahead + plan.stage_threads + 2
    assert all(read_then - k <= bound for k, read_then in enumerate(seen_at_commit)), seen_at_commit
    assert seen_at_commit[0] <= bound < 20
