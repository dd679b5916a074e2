"""A job's model: the same job gives the same weights, a cut schedule is loud and recorded, and the
reviews held out from training are known to the run's report, which shows their accuracy apart."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from bertattn_batch.cli import app
from bertattn_batch.config import FinetuneSpec, load_job
from bertattn_batch.engines import run_job
from bertattn_batch.render.report import build_report
from bertattn_batch.train import HELDOUT_FILE, METRICS_FILE, ensure_model

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_length=64, threads=1)


def _job(tmp_path: Path, rows: list[dict], name: str, **finetune) -> Path:
    data = tmp_path / "reviews.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    table = {**TINY, "epochs": 1.0, **finetune}
    job = tmp_path / f"{name}.toml"
    job.write_text(
        f'inputs = ["{data}"]\nmodel = "{tmp_path / name}"\nout = "{tmp_path / (name + "-run")}"\n'
        'id_col = "doc_id"\nlabel_col = "label"\nlayers = [0]\nmax_length = 64\nprogress = false\n'
        "[finetune]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
    )
    return job


def _weights(model: Path) -> bytes:
    return (model / "model.safetensors").read_bytes()


def test_the_same_job_trains_the_same_model(zh_rows, tmp_path):
    rows = zh_rows[::100][:120]
    a = load_job(_job(tmp_path, rows, "a"))
    b = load_job(_job(tmp_path, rows, "b"))
    ensure_model(a, progress=False)
    ensure_model(b, progress=False)
    assert _weights(Path(a.model)) == _weights(Path(b.model))


def test_a_cut_schedule_is_loud_and_recorded(zh_rows, tmp_path, caplog):
    job = load_job(_job(tmp_path, zh_rows[::100][:120], "cut", epochs=50.0, max_train_seconds=0.5))
    with caplog.at_level(logging.WARNING):
        ensure_model(job, progress=False)
    assert "training stopped after" in caplog.text and "not the job's full schedule" in caplog.text
    assert "take max_train_seconds out of the job's [finetune] table" in caplog.text
    metrics = json.loads((Path(job.model) / METRICS_FILE).read_text())
    assert metrics["shortened"] and metrics["steps"] < metrics["planned_steps"]
    run_job(job)
    manifest = json.loads((Path(job.out) / "manifest.json").read_text())
    assert manifest["model"]["training"]["shortened"] is True
    html = build_report(job.out, examples=1, min_reviews=1).read_text(encoding="utf-8")
    assert "training was cut short" in html


def test_the_report_shows_held_out_accuracy_apart_from_training_data(zh_rows, tmp_path):
    """The report gave accuracy over every labelled review, 90% of which trained the model."""
    rows = zh_rows[::50][:200]
    job = load_job(_job(tmp_path, rows, "m", eval_fraction=0.25))
    run_job(job)
    model = Path(job.model)
    heldout = json.loads((model / HELDOUT_FILE).read_text())
    metrics = json.loads((model / METRICS_FILE).read_text())
    assert heldout["id_col"] == "doc_id" and len(heldout["doc_ids"]) == metrics["n_eval"] == 50
    assert set(heldout["doc_ids"]) <= {r["doc_id"] for r in rows}
    preds = pl.read_parquet(Path(job.out) / "predictions" / "*.parquet")
    held = preds.filter(pl.col("doc_id").is_in(heldout["doc_ids"]))
    accuracy = (held["label"] == held["pred_label"]).mean()
    assert abs(accuracy - metrics["accuracy"]) < 1e-9  # the run scores them as the training did
    html = build_report(job.out, examples=1, min_reviews=1).read_text(encoding="utf-8")
    assert f"held-out accuracy <b>{accuracy:.4f}</b>" in html and "50 reviews held out" in html
    assert "accuracy on training data" in html and "150 reviews the model was trained on" in html


def test_version_and_help_examples():
    runner = CliRunner()
    assert runner.invoke(app, ["--version"]).output.startswith("bertattn-batch ")
    shown = runner.invoke(app, ["extract", "--help"], env={"COLUMNS": "200"}).output
    assert "Examples" in shown and "Inputs" in shown and "<bool>" not in shown
    assert FinetuneSpec().min_char_count == 2  # as the shipped default job trains


def _run_report(tmp_path: Path, model: Path, data: Path, name: str, id_col: str | None = None) -> str:
    job = tmp_path / f"{name}.toml"
    ids = f'id_col = "{id_col}"\n' if id_col else ""
    job.write_text(
        f'inputs = ["{data}"]\nmodel = "{model}"\nout = "{tmp_path / name}"\n{ids}'
        'label_col = "label"\nlayers = [0]\nmax_length = 64\nprogress = false\n'
    )
    run_job(load_job(job))
    return build_report(tmp_path / name, examples=1, min_reviews=1).read_text(encoding="utf-8")


def test_row_numbers_name_held_out_reviews_only_in_a_run_over_the_training_files(zh_rows, tmp_path):
    """A model trained without an id column knows its held-out reviews by row number; a run over another
    corpus showed its rows 'held out' or 'trained on' by number alone."""
    trained, other = tmp_path / "trained.parquet", tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist(zh_rows[::140][:120]), trained)
    pq.write_table(pa.Table.from_pylist(zh_rows[70::140][:120]), other)
    model = tmp_path / "model"
    args = ["finetune", str(trained), "--out", str(model), "--epochs", "1", "--eval-fraction", "0.25"]
    args += ["--max-length", "64", "--no-progress"]
    assert CliRunner().invoke(app, args).exit_code == 0
    heldout = json.loads((model / HELDOUT_FILE).read_text())
    assert heldout["id_col"] is None and len(heldout["sources"]) == 1 and len(heldout["doc_ids"]) == 30

    same = _run_report(tmp_path, model, trained, "same")
    assert "30 reviews held out" in same and "90 reviews the model was trained on" in same
    # the same bytes under another name are the same reviews
    copy = tmp_path / "copy.parquet"
    copy.write_bytes(trained.read_bytes())
    assert "30 reviews held out" in _run_report(tmp_path, model, copy, "copy")

    elsewhere = _run_report(tmp_path, model, other, "other")
    assert "held-out accuracy" not in elsewhere and "accuracy on training data" not in elsewhere
    assert "120 over every labelled review; the model was trained on other files" in elsewhere


def test_finetune_id_col_records_held_out_reviews_by_id(zh_rows, tmp_path):
    data = tmp_path / "reviews.parquet"
    rows = zh_rows[::140][:120]
    pq.write_table(pa.Table.from_pylist(rows), data)
    model = tmp_path / "model"
    args = ["finetune", str(data), "--out", str(model), "--epochs", "1", "--eval-fraction", "0.25"]
    args += ["--max-length", "64", "--no-progress", "--id-col", "doc_id"]
    assert CliRunner().invoke(app, args).exit_code == 0
    heldout = json.loads((model / HELDOUT_FILE).read_text())
    assert heldout["id_col"] == "doc_id" and set(heldout["doc_ids"]) <= {r["doc_id"] for r in rows}
    by_id = _run_report(tmp_path, model, data, "ids", id_col="doc_id")
    assert "30 reviews held out" in by_id and "90 reviews the model was trained on" in by_id
    # another corpus: its reviews that are not held out did not train the model either
    other = tmp_path / "other.parquet"
    pq.write_table(pa.Table.from_pylist(zh_rows[70::140][:40]), other)
    elsewhere = _run_report(tmp_path, model, other, "other", id_col="doc_id")
    assert "accuracy on training data" not in elsewhere
    assert (
        "accuracy on the other reviews" in elsewhere
        and "40 reviews not held out; the run read files besides those the model was trained on" in elsewhere
    )
    unlabelled = tmp_path / "unlabelled.toml"
    unlabelled.write_text(
        f'inputs = ["{data}"]\nmodel = "{model}"\nout = "{tmp_path / "nolabels"}"\nid_col = "doc_id"\n'
        "layers = [0]\nmax_length = 64\nprogress = false\n"
    )
    run_job(load_job(unlabelled))  # its held-out reviews are there, without labels to score
    page = build_report(tmp_path / "nolabels", examples=1, min_reviews=1).read_text(encoding="utf-8")
    assert "The source had no labels: there is no accuracy to give." in page
    assert "held out from is in this run" not in page
    by_number = _run_report(tmp_path, model, data, "numbers")
    assert "held-out reviews are known by ids other than this run" in by_number
    # the folder trained again (another split): the run's model is gone, and so is its split
    assert CliRunner().invoke(app, [*args, "--seed", "5"]).exit_code == 0
    again = build_report(tmp_path / "ids", examples=1, min_reviews=1).read_text(encoding="utf-8")
    assert "held-out accuracy" not in again and "folder was trained again since this run: which" in again


def test_a_model_trained_before_files_were_recorded_gives_no_row_number_split(zh_rows, tmp_path):
    data = tmp_path / "reviews.parquet"
    pq.write_table(pa.Table.from_pylist(zh_rows[::140][:120]), data)
    model = tmp_path / "model"
    args = ["finetune", str(data), "--out", str(model), "--epochs", "1", "--eval-fraction", "0.25"]
    assert CliRunner().invoke(app, [*args, "--max-length", "64", "--no-progress"]).exit_code == 0
    heldout = json.loads((model / HELDOUT_FILE).read_text())
    del heldout["sources"]
    (model / HELDOUT_FILE).write_text(json.dumps(heldout))
    html = _run_report(tmp_path, model, data, "run")
    assert "held-out accuracy" not in html and "known by row number, but not of which files" in html
