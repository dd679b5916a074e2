"""``bertattn validate``: real runs validate clean; each kind of damage is reported and exits 1."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import read_table
from typer.testing import CliRunner

from bertattn_batch import schema
from bertattn_batch._files import file_lock
from bertattn_batch.analysis.validate import CHECKS, validate_run
from bertattn_batch.cli import app
from bertattn_batch.config import InputSpec, JobSpec, from_dict
from bertattn_batch.engines import run_job
from bertattn_batch.errors import RunDirError
from bertattn_batch.inputs import RowBatch, rows_digest
from bertattn_batch.run import LOCK_NAME
from bertattn_batch.schema import STATUSES

PART0 = "part-000000000000.parquet"


def _run(source: Path, model_dir: Path, out: Path) -> Path:
    spec = JobSpec(
        inputs=InputSpec([str(source)], id_col="doc_id", label_col="label"),
        model=str(model_dir),
        out=str(out),
        window=10,  # several parts
        batch_tokens=1500,
        progress=False,
    )
    run_job(spec)
    return out


@pytest.fixture(scope="module")
def en_source(drug_sample, tmp_path_factory) -> Path:
    """The English sample plus rows the reader and pipeline record but do not score."""
    rows = pq.read_table(drug_sample).to_pylist()
    rows += [
        {**rows[3], "label": "again"},  # the same doc_id again: status duplicate_id
        {"doc_id": "blank", "text": "   ", "label": None},  # empty_text
        {"doc_id": "none", "text": None, "label": None},  # null_text
    ]
    path = tmp_path_factory.mktemp("src") / "en.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def en_run(en_source, tiny_en_dir, tmp_path_factory) -> Path:
    return _run(en_source, tiny_en_dir, tmp_path_factory.mktemp("runs") / "en")


@pytest.fixture(scope="module")
def zh_run(zh_sample, tiny_zh_dir, tmp_path_factory) -> Path:
    return _run(zh_sample, tiny_zh_dir, tmp_path_factory.mktemp("runs") / "zh")


def _cli(*args: str):
    return CliRunner().invoke(app, ["validate", *args])


def _copy(run: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(run, dest)
    return dest


def _rewrite(path: Path, change: Callable[[dict], None]) -> None:
    """Read a part, let ``change`` edit its columns (as numpy/lists), write it back with the same types."""
    table = pq.read_table(path)
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    change(cols)
    pq.write_table(pa.table(cols, schema=table.schema), path)


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _save_manifest(run: Path, m: dict) -> None:
    (run / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("which", ["en_run", "zh_run"])
def test_real_run_is_clean(request, which):
    run = request.getfixturevalue(which)
    report = validate_run(run)
    assert report.ok, report.render()
    assert [c.name for c in report.checks] == list(CHECKS)
    assert {c.status for c in report.checks} == {"ok"}, report.render()
    assert report.problems == [] and report.warnings == []
    # the spans check really read the source: every scored review was compared
    preds = pq.read_table(sorted((run / "predictions").glob("part-*.parquet"))[0]).schema
    assert preds.names == schema.columns("predictions")
    n_ok = sum(
        pq.read_table(f, columns=["status"]).column("status").to_pylist().count("ok")
        for f in (run / "predictions").glob("part-*.parquet")
    )
    assert f"{n_ok} reviews checked" in report.check("spans").line()
    result = _cli(str(run))
    assert result.exit_code == 0, result.output
    assert f"clean: {len(CHECKS)} checks passed" in result.output
    for name in CHECKS:
        assert any(line.startswith(f"ok    {name}") for line in result.output.splitlines()), name


def test_header_counts_unscored_rows(en_run):
    report = validate_run(en_run)
    # 24 sample rows + duplicate id + blank + null: 3 parts of window 10
    assert "27 reviews (24 scored, duplicate_id 1, empty_text 1, null_text 1)" in report.header
    assert "3 parts" in report.header


def _drop_prediction(run: Path) -> None:
    def change(c):
        for v in c.values():
            del v[3]

    _rewrite(run / "predictions" / PART0, change)


def _drop_attention_row(run: Path) -> None:
    def change(c):
        for v in c.values():
            del v[5]

    _rewrite(run / "cls_attention" / PART0, change)


def _duplicate_part(run: Path) -> None:
    shutil.copy(run / "predictions" / PART0, run / "predictions" / "part-000000000500.parquet")


def _weight_off(run: Path) -> None:
    def change(c):
        w = c["weight"][0]
        c["weight"][0] = w + 0.25 if w < 0.5 else w - 0.25

    _rewrite(run / "cls_attention" / PART0, change)


def _scaled_too_big(run: Path) -> None:
    def change(c):
        c["weight_scaled"][7] = 1.5

    _rewrite(run / "cls_attention" / PART0, change)


def _negative_norm(run: Path) -> None:
    def change(c):
        c["weight_norm"][3] = -0.5

    _rewrite(run / "cls_attention" / PART0, change)


def _zeroing_where_none_was_asked(run: Path) -> None:
    def change(c):
        c["value_zeroing"][4] = 2.5  # outside [0, 2], in a run without --value-zeroing

    _rewrite(run / "cls_attention" / PART0, change)


def _counts_edited(run: Path) -> None:
    m = _manifest(run)
    m["counts"]["cls_attention"] += 1
    _save_manifest(run, m)


def _part_rows_edited(run: Path) -> None:
    m = _manifest(run)
    m["parts"][1]["rows"]["head_summary"] -= 4
    _save_manifest(run, m)


def _span_past_end(run: Path) -> None:
    """Row 2's token ends past the text: only the source can tell."""

    def change(c):
        c["end"][2] = 100_000

    _rewrite(run / "tokens" / PART0, change)


def _span_reversed(run: Path) -> None:
    def change(c):
        c["start"][2] = c["end"][2] + 1

    _rewrite(run / "tokens" / PART0, change)


def _wrong_type(run: Path) -> None:
    path = run / "head_summary" / PART0
    t = pq.read_table(path)
    i = t.schema.get_field_index("weight_cls")
    pq.write_table(t.set_column(i, "weight_cls", t.column(i).cast(pa.float64())), path)


def _null_weight(run: Path) -> None:
    """A weight of cls_attention null, in a file that declares the column optional (this project
    writes it required, and no statistics for it: validate counts the nulls from the data)."""
    path = run / "cls_attention" / PART0
    t = pq.read_table(path)
    i = t.schema.get_field_index("weight")
    weights = t.column(i).to_pylist()
    weights[3] = None
    field = t.schema.field(i).with_nullable(True)
    pq.write_table(t.set_column(i, field, pa.array(weights, pa.float32())), path, write_statistics=["doc_id"])


def _missing_part(run: Path) -> None:
    (run / "head_summary" / PART0).unlink()


def _leftover_in_complete_run(run: Path) -> None:
    shutil.copy(run / "predictions" / PART0, run / "predictions" / f"_{PART0}.tmp")


def _duplicate_doc_id(run: Path) -> None:
    def change(c):
        ok = [i for i, s in enumerate(c["status"]) if s == "ok"]
        c["doc_id"][ok[1]] = c["doc_id"][ok[0]]

    _rewrite(run / "predictions" / PART0, change)


def _wrong_pred_id(run: Path) -> None:
    def change(c):
        c["pred_id"][0] = (int(np.argmax(c["probs"][0])) + 1) % len(c["probs"][0])

    _rewrite(run / "predictions" / PART0, change)


def _probs_off(run: Path) -> None:
    def change(c):
        c["probs"][1] = [p * 0.5 for p in c["probs"][1]]

    _rewrite(run / "predictions" / PART0, change)


def _head_missing(run: Path) -> None:
    """A scored review loses one head in both tables (the manifest's row counts then differ too)."""

    def change(c):
        key = (c["doc_id"][0], c["layer"][0], c["head"][0])
        keep = [i for i in range(len(c["doc_id"])) if (c["doc_id"][i], c["layer"][i], c["head"][i]) != key]
        for k in c:
            c[k] = [c[k][i] for i in keep]

    _rewrite(run / "head_summary" / PART0, change)
    _rewrite(run / "cls_attention" / PART0, change)


def _wrong_position(run: Path) -> None:
    def change(c):
        c["position"][1] = c["position"][0]

    _rewrite(run / "cls_attention" / PART0, change)


def _token_row_dropped(run: Path) -> None:
    def change(c):
        for k in c:
            del c[k][3]

    _rewrite(run / "tokens" / PART0, change)


def _token_row_twice(run: Path) -> None:
    def change(c):
        for k in c:
            c[k].insert(3, c[k][3])

    _rewrite(run / "tokens" / PART0, change)


def _token_row_moved(run: Path) -> None:
    """A token row at a position no attention row holds (and its own position left without one)."""

    def change(c):
        c["position"][3] = 10_000

    _rewrite(run / "tokens" / PART0, change)


def _status_unknown(run: Path) -> None:
    def change(c):
        i = c["status"].index("empty_text") if "empty_text" in c["status"] else None
        assert i is not None
        c["status"][i] = "exploded"

    _rewrite(run / "predictions" / "part-000000000020.parquet", change)


DAMAGE = [
    ("drop a predictions row", _drop_prediction, {"counts", "row_index", "layers_heads"}),
    ("drop a cls_attention row", _drop_attention_row, {"counts", "positions", "attention_mass"}),
    ("duplicate a part under another name", _duplicate_part, {"files"}),
    ("a weight off so the head's sum is not 1", _weight_off, {"attention_mass", "scaling"}),
    ("a scaled weight of 1.5", _scaled_too_big, {"scaling"}),
    ("a negative norm-based weight", _negative_norm, {"measures"}),
    ("value zeroing out of range and not asked for", _zeroing_where_none_was_asked, {"measures"}),
    ("manifest counts edited", _counts_edited, {"counts"}),
    ("manifest part rows edited", _part_rows_edited, {"counts"}),
    ("a span past the text's end", _span_past_end, {"spans"}),
    ("a span with start > end", _span_reversed, {"spans"}),
    ("a column of the wrong type", _wrong_type, {"schema"}),
    ("a null weight", _null_weight, {"schema"}),
    ("a listed part missing", _missing_part, {"files"}),
    ("a temporary left in a complete run", _leftover_in_complete_run, {"files"}),
    ("a scored doc_id twice", _duplicate_doc_id, {"doc_id"}),
    ("pred_id not the argmax", _wrong_pred_id, {"predictions"}),
    ("probs not summing to 1", _probs_off, {"predictions"}),
    ("one head missing for a review", _head_missing, {"layers_heads", "counts"}),
    ("a position twice", _wrong_position, {"positions"}),
    ("an unknown status", _status_unknown, {"predictions"}),
    ("a tokens row dropped", _token_row_dropped, {"tokens", "counts"}),
    ("a tokens row written twice", _token_row_twice, {"tokens", "counts"}),
    ("a tokens row at a position with no attention", _token_row_moved, {"tokens"}),
]


@pytest.mark.parametrize(("damage", "expected"), [(d[1], d[2]) for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_damage_is_reported(en_run, tmp_path, damage, expected):
    run = _copy(en_run, tmp_path)
    damage(run)
    report = validate_run(run)
    assert not report.ok
    failed = {c.name for c in report.checks if c.problems}
    assert expected <= failed, report.render()
    for name in expected:
        assert any(p.check == name for p in report.problems)
    result = _cli(str(run))
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    for name in expected:
        assert any(line.startswith(f"FAIL  {name}") for line in lines), result.output
    assert "damaged:" in lines[-1]


def test_problem_examples_name_the_place(en_run, tmp_path):
    run = _copy(en_run, tmp_path)
    _scaled_too_big(run)
    report = validate_run(run)
    check = report.check("scaling")
    assert check.problems == 1  # outside [0, 1]; the formula rule only judges values inside the range
    t = pq.read_table(run / "cls_attention" / PART0)
    row = t.slice(7, 1).to_pylist()[0]
    msg = next(p.message for p in report.problems if p.check == "scaling")
    assert f"doc '{row['doc_id']}' layer {row['layer']} head {row['head']} position {row['position']}" in msg
    assert "weight_scaled 1.5" in msg


def test_no_source_skips_the_text_length_check(en_run, tmp_path):
    run = _copy(en_run, tmp_path)
    _span_past_end(run)
    assert not validate_run(run).ok
    report = validate_run(run, check_source=False)
    assert report.ok
    assert report.check("spans").status == "SKIP"
    result = _cli(str(run), "--no-source")
    assert result.exit_code == 0, result.output
    assert any(line.startswith("SKIP  spans") for line in result.output.splitlines())
    # a skipped check is not a passed one
    assert f"clean: {len(CHECKS) - 2} checks passed, 2 skipped" in result.output  # spans and inputs


def test_unreadable_source_is_a_skip_not_a_failure(en_run, tmp_path):
    run = _copy(en_run, tmp_path)
    m = _manifest(run)
    m["spec"]["inputs"] = m["fingerprint"]["inputs"] = [str(tmp_path / "moved-away.parquet")]
    _save_manifest(run, m)
    report = validate_run(run)
    assert report.ok, report.render()
    spans = report.check("spans")
    assert spans.status == "SKIP" and "not readable" in spans.skipped


def test_a_stream_runs_spans_are_checked_against_the_texts_it_stored(en_run, tmp_path):
    """A run that read standard input had its span check skipped, though it stored every text."""
    run = _copy(en_run, tmp_path)
    m = _manifest(run)
    m["spec"]["inputs"] = m["fingerprint"]["inputs"] = ["-"]
    _save_manifest(run, m)
    report = validate_run(run)
    assert report.ok, report.render()
    scored = sum(s == "ok" for s in read_table(run, "predictions").column("status").to_pylist())
    assert f"{scored} reviews checked against the texts the run stored" in report.render()
    _span_past_end(run)
    report = validate_run(run)
    assert {p.check for p in report.problems} == {"spans"}, report.render()
    assert "past the stored text's length" in report.render()

    def forget_texts(c):
        c["text"] = [None] * len(c["text"])

    for part in (run / "predictions").glob("*.parquet"):  # as --no-store-text leaves them
        _rewrite(part, forget_texts)
    spans = validate_run(run).check("spans")
    assert spans.status == "SKIP" and "a stream, which cannot be read again" in spans.skipped


def test_interrupted_run_with_uncommitted_files_is_only_warned(en_run, tmp_path):
    """An interrupted run may hold a part's files that the manifest does not list yet."""
    run = _copy(en_run, tmp_path)
    _leftover_in_complete_run(run)
    _duplicate_part(run)
    m = _manifest(run)
    m["status"] = "interrupted"
    _save_manifest(run, m)
    report = validate_run(run)
    assert report.ok, report.render()
    assert report.check("files").status == "WARN"
    assert report.check("manifest").status == "WARN"
    assert report.check("files").warnings == 2
    assert any(w.check == "files" and "leftover" in w.message for w in report.warnings)
    assert any(w.check == "files" and "not listed" in w.message for w in report.warnings)
    assert _cli(str(run)).exit_code == 0


def test_a_running_run_whose_writer_is_gone_is_called_stopped(en_run, tmp_path):
    """A run killed mid-write keeps the status 'running'; validate tells it from one being written by
    asking for its lock, which a live writer holds."""
    run = _copy(en_run, tmp_path)
    _save_manifest(run, _manifest(run) | {"status": "running"})
    report = validate_run(run)
    assert any("no process is writing it: it was stopped" in w.message for w in report.warnings), (
        report.render()
    )
    with file_lock(run / LOCK_NAME):
        report = validate_run(run)
        _leftover_in_complete_run(run)  # the part the live writer has in hand: no "leftover"
        live = validate_run(run)
    assert not any("no process is writing it" in w.message for w in report.warnings), report.render()
    assert any("status 'running'" in w.message for w in report.warnings)
    assert (
        live.check("files").warnings == 0
        and "that the running extract is writing" in live.check("files").line()
    )


def test_a_run_that_completes_while_validate_reads_it_is_not_called_stopped(en_run, tmp_path, monkeypatch):
    """The job commits its last part and releases its lock between validate's read of the manifest and
    its probe of the lock: the run is complete, not stopped."""
    from bertattn_batch.run import lease

    run = _copy(en_run, tmp_path)
    complete = _manifest(run)
    _save_manifest(run, complete | {"status": "running"})

    def job_ends_meanwhile(lock):
        _save_manifest(run, complete)
        return False

    monkeypatch.setattr(lease, "lock_is_held", job_ends_meanwhile)
    report = validate_run(run)
    assert not any("no process is writing it" in w.message for w in report.warnings), report.render()
    assert "job ended (complete) while it was read; checked as it ended" in report.check("manifest").line()
    assert report.ok and report.warnings == [], report.render()  # the complete run, checked whole


def test_spec_layers_other_than_the_stored_ones_are_a_problem(en_run, tmp_path):
    run = _copy(en_run, tmp_path)
    m = _manifest(run)
    n, stored = m["model"]["num_layers"], m["model"]["layers"]
    assert m["spec"]["layers"] != stored  # counted from the end as asked, e.g. [-2] for layer n-2
    assert validate_run(run).ok
    m["spec"]["layers"] = [(stored[0] + 1) % n - n]
    _save_manifest(run, m)
    report = validate_run(run)
    assert not report.ok and "but model.layers (the layers stored) is" in report.render()


def test_known_statuses_are_the_schemas():
    """The statuses the validator accepts are the ones schemas/predictions.json documents."""
    (column,) = [c for c in schema.spec("predictions")["columns"] if c["name"] == "status"]
    listed = re.search(r"\(([^)]*)\)", column["description"]).group(1)
    assert set(STATUSES) == {"ok", *(s.strip() for s in listed.split(","))}


def test_not_a_run_directory(tmp_path):
    with pytest.raises(RunDirError):
        validate_run(tmp_path)
    result = _cli(str(tmp_path))
    assert result.exit_code == 1
    assert "not a run directory" in result.output


def test_resumed_and_incremental_runs_are_clean(en_source, tiny_en_dir, tmp_path):
    """A run stopped by --limit, resumed without it, then extended incrementally with new reviews."""
    source = tmp_path / "reviews.parquet"
    rows = pq.read_table(en_source).to_pylist()
    pq.write_table(pa.Table.from_pylist(rows[:20]), source)
    out = tmp_path / "run"
    base = {"inputs": [str(source)], "model": str(tiny_en_dir), "out": str(out), "id_col": "doc_id"}
    run_job(from_dict(JobSpec, {**base, "window": 6, "limit": 9, "progress": False}))
    assert validate_run(out).ok
    run_job(from_dict(JobSpec, {**base, "window": 6, "progress": False}))  # resumes at row 9
    report = validate_run(out)
    assert report.ok, report.render()
    assert report.warnings == []
    new = [{**r, "doc_id": f"new-{i}"} for i, r in enumerate(rows[20:26])]
    pq.write_table(pa.Table.from_pylist(rows[:20] + new), source)
    run_job(from_dict(JobSpec, {**base, "window": 6, "on_existing": "incremental", "progress": False}))
    m = _manifest(out)
    assert {p["generation"] for p in m["parts"]} == {0, 1}
    report = validate_run(out)
    assert report.ok, report.render()
    assert {c.status for c in report.checks} == {"ok"}, report.render()
    statuses = [
        s
        for f in (out / "predictions").glob("part-*.parquet")
        for s in pq.read_table(f)["status"].to_pylist()
    ]
    assert len(statuses) == 26  # rows[20:26] renamed: the duplicate id is new, the blank text stays unscored
    assert f"{statuses.count('ok')} reviews checked" in report.check("spans").line()


def test_incremental_passes_with_growing_limits_are_clean(en_source, tiny_en_dir, tmp_path):
    """Each pass reads the first ``limit`` rows: the rows past the last pass's limit were never asked for
    (validate called every one of them missing, the run damaged). A row of those it read is still named."""
    source = tmp_path / "reviews.parquet"
    pq.write_table(pq.read_table(en_source).slice(0, 20), source)
    out = tmp_path / "run"
    base = {"inputs": [str(source)], "model": str(tiny_en_dir), "out": str(out), "id_col": "doc_id"}
    for limit in (6, 12):
        run_job(
            from_dict(
                JobSpec,
                {**base, "window": 4, "limit": limit, "on_existing": "incremental", "progress": False},
            )
        )
        report = validate_run(out)
        assert report.ok, report.render()
        assert f"(limit {limit})" in report.check("inputs").line()
    _drop_prediction(out)  # a row of the first pass
    assert "1 problem" in validate_run(out).check("inputs").line()


def test_a_nightly_file_replaced_between_incremental_passes_is_not_a_warning_per_review(
    en_source, tiny_en_dir, tmp_path
):
    """Each night's file holds that day's reviews only: the first pass's rows are other reviews now.
    validate warned once for each of them, so every nightly run ended 'clean, N warnings'."""
    source = tmp_path / "day.parquet"
    rows = pq.read_table(en_source).to_pylist()
    out = tmp_path / "run"
    base = {"inputs": [str(source)], "model": str(tiny_en_dir), "out": str(out), "id_col": "doc_id"}
    for day in (rows[:10], rows[10:20]):
        pq.write_table(pa.Table.from_pylist(day), source)
        run_job(from_dict(JobSpec, {**base, "window": 6, "on_existing": "incremental", "progress": False}))
    report = validate_run(out)
    assert report.ok and report.check("spans").warnings == 0, report.render()
    assert "reviews of earlier --incremental passes not checked" in report.check("spans").line()
    # a review of the current pass that no longer matches its row is still named
    swapped = rows[10:20]
    swapped[0], swapped[1] = swapped[1], swapped[0]
    pq.write_table(pa.Table.from_pylist(swapped), source)
    assert validate_run(out).check("spans").warnings == 2


def test_a_night_with_nothing_new_or_an_edited_review_is_not_damage(en_source, tiny_en_dir, tmp_path):
    """Only the first night wrote parts, then the file was replaced (or emptied): validate counted rows
    as for a plain run and called the run damaged. A review edited since (same id, a shorter text) kept
    its first scoring, as documented, and its spans were checked against the new text."""
    source = tmp_path / "day.parquet"
    rows = pq.read_table(en_source).to_pylist()[:10]
    out = tmp_path / "run"
    base = {"inputs": [str(source)], "model": str(tiny_en_dir), "out": str(out), "id_col": "doc_id"}
    for night in (rows, rows[:0], [{**rows[0], "text": "ok"}, *rows[1:]]):
        pq.write_table(pa.Table.from_pylist(night, schema=pq.read_schema(en_source)), source)
        run_job(from_dict(JobSpec, {**base, "window": 4, "on_existing": "incremental", "progress": False}))
        report = validate_run(out)
        assert report.ok, report.render()
    assert "other texts (the inputs were replaced, reordered or edited since)" in report.check("spans").line()


@pytest.mark.parametrize(
    ("dtype", "attention", "caught"),
    [("float32", "sdpa", True), ("bfloat16", "sdpa", True), ("bfloat16", "eager", False)],
)
def test_mass_tolerance_follows_how_rows_were_computed(en_run, tmp_path, dtype, attention, caught):
    """A head 0.01 off is damage where the row is a float32 softmax, rounding in half-precision eager."""
    run = _copy(en_run, tmp_path)
    m = _manifest(run)
    m["model"].update(dtype=dtype, attention=attention)
    _save_manifest(run, m)
    t = pq.read_table(run / "head_summary" / PART0)
    i = t.schema.get_field_index("weight_cls")
    w = t.column(i).to_numpy().copy()
    w[0] += 0.01
    pq.write_table(t.set_column(i, "weight_cls", pa.array(w, pa.float32())), run / "head_summary" / PART0)
    report = validate_run(run, check_source=False)
    assert (report.check("attention_mass").problems == 1) is caught, report.render()
    if caught:
        assert report.render().endswith(f"damaged: 1 problem in 1 of {len(report.checks)} checks")


def _damage(path: Path, column: str) -> None:
    """Overwrite the middle of one column chunk's pages, as a bad disk block or a torn copy would: the
    footer and its statistics still read."""
    meta = pq.read_metadata(path).row_group(0)
    chunk = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    middle = start + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    data[middle : middle + 64] = bytes(range(64))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("table", "column"), [("tokens", "token_id"), ("predictions", "doc_id")])
def test_a_damaged_column_is_a_problem_named_with_its_file(table, column, en_run, tmp_path):
    """Every value is decoded once: a column no other check reads (token_id) is checked too, and a
    damaged one that other checks read names its file instead of stopping validate."""
    run = _copy(en_run, tmp_path)
    part = sorted((run / table).glob("part-*.parquet"))[0]
    _damage(part, column)
    with pytest.raises(Exception):  # noqa: B017 - whichever error the codec raises
        pq.read_table(part)
    report = validate_run(run, check_source=False)
    assert not report.ok
    assert any(f"{table}/{part.name}: its data cannot be decoded" in p.message for p in report.problems), (
        report.render()
    )


def test_a_part_committed_but_not_yet_renamed_is_a_warning(en_run, tmp_path):
    """A kill between a part's commit and its rename leaves a state the next resume repairs."""
    run = _copy(en_run, tmp_path)
    part = sorted((run / "head_summary").glob("part-*.parquet"))[0]
    part.rename(part.with_name(f"_{part.name}.tmp"))
    m = _manifest(run)
    _save_manifest(run, m | {"status": "interrupted"})
    report = validate_run(run, check_source=False)
    assert report.problems == [], report.render()
    assert any(
        "committed, still under its temporary name; a rerun renames it" in w.message for w in report.warnings
    )


def _flip_one_byte(path: Path, column: str) -> None:
    """One bit of one data page flipped, as a bad disk sector or a faulty copy does it."""
    meta = pq.read_metadata(path).row_group(0)
    chunk = next(meta.column(i) for i in range(meta.num_columns) if meta.column(i).path_in_schema == column)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    at = start + chunk.total_compressed_size - 2  # inside the last page's values
    data = bytearray(path.read_bytes())
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(("table", "column"), [("predictions", "label"), ("head_summary", "n_content")])
def test_a_flipped_byte_in_a_page_is_caught_by_its_checksum(table, column, en_run, tmp_path):
    """Parts carry a checksum on every page: a changed value that still decodes is named, not read."""
    run = _copy(en_run, tmp_path)
    part = sorted((run / table).glob("part-*.parquet"))[0]
    _flip_one_byte(part, column)
    report = validate_run(run, check_source=False)
    assert any(f"{table}/{part.name}" in p.message and p.check == "schema" for p in report.problems), (
        report.render()
    )


@pytest.mark.parametrize("command", ["aggregate", "report", "faithfulness", "reviews"])
def test_commands_that_read_a_whole_run_refuse_a_flipped_bit(command, en_run, tmp_path):
    """polars reads no checksums: a flipped bit in a weight was summed into the aggregates as 2e24, and
    ranked first by reviews. The commands that read whole runs check every page first and name the
    damaged file."""
    run = _copy(en_run, tmp_path)
    shutil.rmtree(run / "aggregates", ignore_errors=True)
    if command == "report":  # aggregates current: what report reads of the parts itself is checked
        assert CliRunner().invoke(app, ["aggregate", str(run)]).exit_code == 0
    table, column = ("predictions", "label") if command == "report" else ("cls_attention", "weight")
    part = sorted((run / table).glob("part-*.parquet"))[-1]
    _flip_one_byte(part, column)
    asked = ["--head", "0", "--token", "the"] if command == "reviews" else []
    result = CliRunner().invoke(app, [command, str(run), *asked])
    assert result.exit_code == 1, result.output
    assert f"{table}/{part.name} is damaged" in result.output
    assert "bertattn validate tells what else is wrong; an extract with --overwrite redoes" in result.output


@pytest.mark.parametrize("command", ["aggregate", "report", "faithfulness", "plot"])
def test_readers_refuse_a_part_that_holds_other_rows_than_its_commit(command, en_run, tmp_path):
    """A row appended to a part (or a part swapped for another's) was read into the aggregates and the
    pictures with exit status 0; the footers' row counts are checked against the commit."""
    run = _copy(en_run, tmp_path)
    shutil.rmtree(run / "aggregates", ignore_errors=True)
    table = "predictions" if command == "report" else "cls_attention"
    part = sorted((run / table).glob("part-*.parquet"))[0]
    if command == "report":
        assert CliRunner().invoke(app, ["aggregate", str(run)]).exit_code == 0
    doc = pq.read_table(run / "predictions" / part.name, columns=["doc_id"])["doc_id"][0].as_py()
    rows = pq.read_table(part)
    pq.write_table(pa.concat_tables([rows, rows.slice(0, 1)]), part)
    args = [command, str(run)] + (
        ["--doc-id", doc, "--out", str(tmp_path / "r.csv")] if command == "plot" else []
    )
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert (
        f"{table}/{part.name} holds {rows.num_rows + 1} rows where its commit recorded {rows.num_rows}"
        in (result.output)
    )


def test_a_part_that_says_it_is_of_another_schema_version_is_named(en_run, tmp_path):
    """A part's own metadata names its table and schema version; one of another version (a part copied
    in from an older run) passed as clean while its columns happened to match."""
    run = _copy(en_run, tmp_path)
    part = sorted((run / "cls_attention").glob("part-*.parquet"))[0]
    rows = pq.read_table(part)
    old = rows.replace_schema_metadata({b"table": b"cls_attention", b"schema_version": b"2"})
    pq.write_table(old, part)
    report = validate_run(run, check_source=False)
    version = schema.version("cls_attention")
    assert any(
        f"cls_attention/{part.name}: its metadata says schema_version '2' where schemas/ says '{version}'"
        in p.message
        for p in report.problems
    ), report.render()


def test_plot_refuses_a_flipped_bit_in_the_part_that_holds_its_review(en_run, tmp_path):
    """plot reads a few row groups with polars, which checks no checksums: it drew a flipped weight. The
    parts holding the review are checked; a review of a sound part still plots."""
    run = _copy(en_run, tmp_path)
    parts = sorted((run / "cls_attention").glob("part-*.parquet"))
    _flip_one_byte(parts[-1], "weight")
    damaged, sound = (
        pq.read_table(run / "predictions" / p.name, columns=["doc_id"])["doc_id"][0].as_py()
        for p in (parts[-1], parts[0])
    )
    result = CliRunner().invoke(
        app, ["plot", str(run), "--doc-id", damaged, "--out", str(tmp_path / "d.csv")]
    )
    assert result.exit_code == 1, result.output
    assert f"cls_attention/{parts[-1].name} is damaged" in result.output
    result = CliRunner().invoke(app, ["plot", str(run), "--doc-id", sound, "--out", str(tmp_path / "s.csv")])
    assert result.exit_code == 0, result.output


def test_input_rows_without_a_predictions_row_are_named(tiny_en_dir, tmp_path):
    """validate said clean after a row was appended to the input, and after a part was deleted with the
    manifest edited to match; a resume of the latter took the run for up to date."""
    src = tmp_path / "in.csv"
    src.write_text("text\n" + "".join(f"review {i}\n" for i in range(12)))
    run = tmp_path / "run"
    run_job(JobSpec(inputs=[str(src)], model=str(tiny_en_dir), out=str(run), window=4, progress=False))
    assert validate_run(run).ok
    with open(src, "a") as f:
        f.write("one more\n")
    report = validate_run(run)
    assert report.check("inputs").problems == 1, report.render()
    assert any("input rows 12..12 have no predictions row" in p.message for p in report.problems)
    assert any("in.csv changed size" in w.message for w in report.warnings)
    # a part removed with the manifest edited to match: the parts agree with each other, not the inputs
    src.write_text("text\n" + "".join(f"review {i}\n" for i in range(12)))
    m = _manifest(run)
    last = m["parts"].pop()
    for table in last["files"].values():
        (run / table).unlink()
    m["counts"] = {t: sum(p["rows"][t] for p in m["parts"]) for t in m["counts"]}
    _save_manifest(run, m)
    report = validate_run(run)
    assert any("input rows 8..11 have no predictions row" in p.message for p in report.problems), (
        report.render()
    )
    # and a manifest whose last part claims rows the inputs do not have is no run to resume
    m["parts"][-1]["end_row"] = 20
    _save_manifest(run, m)
    assert any("the run holds rows 12..19" in p.message for p in validate_run(run).problems)
    with pytest.raises(RunDirError, match=r"committed parts hold rows up to 19, but the inputs have 12 rows"):
        run_job(JobSpec(inputs=[str(src)], model=str(tiny_en_dir), out=str(run), window=4, progress=False))


def test_an_input_with_a_stray_quote_is_a_problem_not_a_clean_run(tiny_en_dir, tmp_path):
    """Arrow reads the lines after an unmatched ``"`` into its field, and a run made so was clean to
    ``validate``, which read it the same way: the rows it lost are named by the quote's line."""
    src = tmp_path / "in.csv"
    src.write_text('text\nfine\n"the rest\nlost\nlost\n"\n')  # one review of three lines
    run = tmp_path / "run"
    run_job(JobSpec(inputs=[str(src)], model=str(tiny_en_dir), out=str(run), window=4, progress=False))
    src.write_text('text\nfine\n"the rest\nlost\nlost\n')  # as Arrow read it: the same two reviews
    report = validate_run(run)
    assert not report.ok and "in.csv, line 3: a quoted field opens there" in report.render(), report.render()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id2label", {"a": "x"}),
        ("num_layers", "six"),
        ("layers", "4"),
        ("num_heads", 0),
        ("max_length", True),
    ],
)
def test_a_malformed_model_field_is_named_by_every_reader(field, value, en_run, tmp_path):
    """A reader stopped with a bare ValueError or TypeError on such a manifest; now each names the field
    in one line, and validate reports it as a problem of the manifest and goes on."""
    run = _copy(en_run, tmp_path)
    m = _manifest(run)
    m["model"][field] = value
    _save_manifest(run, m)
    for args in (
        ["aggregate", str(run)],
        ["plot", str(run), "--doc-id", "x", "--out", str(tmp_path / "x.png")],
        ["report", str(run)],
    ):
        result = CliRunner().invoke(app, args)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code != 0 and len(lines) == 1, result.output
        assert f"model.{field} is {value!r}" in lines[0] and "damaged" in lines[0], lines[0]
    report = validate_run(run, check_source=False)
    assert not report.ok
    assert any(f"model.{field} is {value!r}" in p.message for p in report.problems), report.render()


def test_a_report_being_written_or_killed_does_not_make_a_run_damaged(en_run, tmp_path):
    """report's temporary beside the manifest (a report writing now, or one killed) made a complete
    run 'damaged' until it was six hours old."""
    run = _copy(en_run, tmp_path)
    (run / ".report.html.4242.tmp").write_text("<html>")
    report = validate_run(run)
    assert report.ok, report.render()
    assert any("temporary file of a command writing" in w.message for w in report.warnings)


def test_a_part_gone_while_validate_reads_it_is_one_line(en_run, tmp_path, monkeypatch):
    """An --overwrite removed the parts under a validate, which stopped with a bare FileNotFoundError."""
    import bertattn_batch.analysis.validate as validate

    def gone(rec, run):
        raise FileNotFoundError(2, "No such file or directory", "predictions/part-000000000000.parquet")

    monkeypatch.setattr(validate, "check_attention", gone)
    with pytest.raises(RunDirError, match=r"part-000000000000.parquet went while validate read it"):
        validate_run(_copy(en_run, tmp_path))


def _in_every_table(run: Path, change: Callable[[dict], None]) -> None:
    """``change`` applied to each table's first part, as an editor that keeps every file valid would."""
    for table in schema.TABLES:
        _rewrite(run / table / PART0, change)


def _rename(old: str, new: str) -> Callable[[dict], None]:
    def change(c):
        c["doc_id"] = [new if d == old else d for d in c["doc_id"]]

    return change


def test_a_review_renamed_in_every_table_is_a_problem(en_run, tmp_path):
    """One review's id replaced in all four tables: the tables agree with each other, not the inputs.
    validate warned and passed a run that lacks an input review and holds one no input row has."""
    run = _copy(en_run, tmp_path)
    doc = read_table(run, "predictions").column("doc_id")[2].as_py()
    _in_every_table(run, _rename(doc, "FORGED"))
    report = validate_run(run)
    assert report.check("inputs").problems == 1, report.render()
    msg = next(p.message for p in report.problems if p.check == "inputs")
    assert f"input row 2 is review {doc!r}, but the run's row 2 is 'FORGED'" in msg
    assert _cli(str(run)).exit_code == 1
    # the part's digest in the manifest forged too: the inputs no longer give it
    m = _manifest(run)
    stored = pq.read_table(run / "predictions" / PART0).to_pydict()
    rows = RowBatch(*(stored[c] for c in ("row_index", "doc_id", "text", "label", "status")))
    m["parts"][0]["rows_digest"] = rows_digest(rows)
    _save_manifest(run, m)
    assert validate_run(run).check("inputs").problems == 1


@pytest.mark.parametrize("column", ["text", "label"])
def test_stored_texts_and_labels_other_than_the_inputs_are_named(column, en_run, tmp_path):
    """Stored texts reversed, known labels swapped (they drive the report's accuracy): validate passed
    both without a word. Each row that differs counts, the first few are named by doc id."""
    run = _copy(en_run, tmp_path)

    def change(c):
        if column == "text":
            c["text"] = [t and t[::-1] for t in c["text"]]
        else:  # each known label becomes the next one
            known = sorted({v for v in c["label"] if v})
            c["label"] = [v and known[(known.index(v) + 1) % len(known)] for v in c["label"]]

    before = read_table(run, "predictions").slice(0, 10).to_pylist()
    _rewrite(run / "predictions" / PART0, change)
    after = read_table(run, "predictions").slice(0, 10).to_pylist()
    differ = [b["doc_id"] for b, a in zip(before, after, strict=True) if b[column] != a[column]]
    report = validate_run(run)
    assert report.check("inputs").problems == len(differ) > 3, report.render()
    named = [p.message for p in report.problems if p.check == "inputs"]
    assert len(named) == 3 and all(f"{column} other than" in m for m in named), named
    assert all(f"review {d!r}" in m for d, m in zip(differ, named, strict=False))
    assert _cli(str(run)).exit_code == 1
    assert validate_run(run, check_source=False).ok  # without the inputs, nothing to compare with


def test_a_run_without_stored_texts_still_has_its_ids_and_labels_compared(en_run, tmp_path):
    run = _copy(en_run, tmp_path)

    def forget_texts(c):
        c["text"] = [None] * len(c["text"])

    for part in (run / "predictions").glob("*.parquet"):  # as --no-store-text leaves them
        _rewrite(part, forget_texts)
    assert validate_run(run).ok, validate_run(run).render()
    doc = read_table(run, "predictions").column("doc_id")[4].as_py()
    _in_every_table(run, _rename(doc, "FORGED"))
    assert validate_run(run).check("inputs").problems == 1


def test_an_incremental_pass_holding_a_review_no_input_row_has_is_a_problem(en_source, tiny_en_dir, tmp_path):
    source = tmp_path / "reviews.parquet"
    pq.write_table(pq.read_table(en_source).slice(0, 12), source)
    out = tmp_path / "run"
    inputs = InputSpec([str(source)], id_col="doc_id")
    run_job(JobSpec(inputs, str(tiny_en_dir), str(out), window=6, on_existing="incremental", progress=False))
    assert validate_run(out).ok
    doc = read_table(out, "predictions").column("doc_id")[1].as_py()
    _in_every_table(out, _rename(doc, "FORGED"))
    report = validate_run(out)
    assert report.check("inputs").problems == 1, report.render()
    assert "'FORGED'" in report.render()


@pytest.fixture(scope="module")
def alti_run(en_source, tiny_en_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "alti"
    run_job(
        JobSpec(
            InputSpec([str(en_source)], id_col="doc_id"),
            str(tiny_en_dir),
            str(out),
            window=10,
            contributions="alti",
            progress=False,
        )
    )
    return out


def test_a_contributions_table_is_checked_clean(alti_run):
    report = validate_run(alti_run)
    assert report.ok, report.render()
    counts = next(c for c in report.checks if c.name == "counts")
    assert any("contributions" in note for note in counts.notes), report.render()


def _alti_out_of_range(run: Path) -> None:
    def change(c):
        c["alti"][2] = 1.5

    _rewrite(run / "contributions" / PART0, change)


def _alti_row_dropped(run: Path) -> None:
    def change(c):
        for v in c.values():
            del v[1]

    _rewrite(run / "contributions" / PART0, change)


def _alti_wrong_type(run: Path) -> None:
    t = pq.read_table(run / "contributions" / PART0)
    pq.write_table(
        t.set_column(2, "alti", t.column("alti").cast(pa.float64())), run / "contributions" / PART0
    )


def _alti_part_missing(run: Path) -> None:
    (run / "contributions" / PART0).unlink()


def _alti_unlisted(run: Path) -> None:
    m = _manifest(run)
    for part in m["parts"]:
        part["files"].pop("contributions")
        part["rows"].pop("contributions")
    _save_manifest(run, m)
    (run / "commits.jsonl").unlink(missing_ok=True)


ALTI_DAMAGE = [
    ("alti outside [0, 1]", _alti_out_of_range, {"measures"}),
    ("a contributions row dropped", _alti_row_dropped, {"measures", "counts"}),
    ("alti of the wrong type", _alti_wrong_type, {"schema"}),
    ("a contributions part missing", _alti_part_missing, {"files"}),
    ("parts without the table the job asked for", _alti_unlisted, {"files"}),
]


@pytest.mark.parametrize(
    ("damage", "expected"), [(d[1], d[2]) for d in ALTI_DAMAGE], ids=[d[0] for d in ALTI_DAMAGE]
)
def test_contributions_table_damage_is_reported(alti_run, tmp_path, damage, expected):
    run = _copy(alti_run, tmp_path)
    damage(run)
    report = validate_run(run)
    failed = {c.name for c in report.checks if c.problems}
    assert expected <= failed, report.render()
