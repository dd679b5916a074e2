"""Job specs: typed, unknown keys and wrong types refused, CLI-equivalent."""

from __future__ import annotations

import pytest

from bertattn_batch.config import FinetuneSpec, InputSpec, JobSpec, from_dict, load_job
from bertattn_batch.errors import SpecError


def _write(tmp_path, text: str):
    p = tmp_path / "job.toml"
    p.write_text(text)
    return p


def test_shipped_jobs_load():
    for name in ("jobs/default.toml", "jobs/en-drug-reviews.toml"):
        spec = load_job(name)
        assert spec.layers == [-2]
        assert isinstance(spec.finetune, FinetuneSpec)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\nlayer = [-2]\n', "unknown key(s) layer"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\nmax_length = "long"\n', "max_length: expected int"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\nlayers = [-2.5]\n', "layers[0]: expected int"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\nprogress = 1\n', "progress: expected bool"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\ndtype = "fp8"\n', "dtype must be one of"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\nencoding = "cp0"\n', "'cp0' is not one Python knows"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\nencoding = "rot13"\n', "'rot13' is no text encoding"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\nencoding = "hex"\n', "'hex' is no text encoding"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nepoch = 2\n', "unknown key(s) epoch"),
        ('inputs = ["a"]\nmodel = "m"\n', "missing key(s) out"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\nlayers = []\n', "at least one layer"),
        ('inputs = ["a"\n', "not valid TOML"),
        ('inputs = ["a"]\nmodel = "m"\nout = ""\n', "out and model must name a folder"),
        (
            'inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nepochs = inf\n',
            "epochs must be a positive number",
        ),
        (
            'inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nlearning_rate = nan\n',
            "learning_rate must be",
        ),
        (
            'inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nmax_train_seconds = -5\n',
            "max_train_seconds must",
        ),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nthreads = 0\n', "threads must be at least 1"),
        (  # named as the repeat it is, not as too few labels
            'inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nlabels = ["a", "a", "b"]\n',
            "finetune.labels names 'a' twice",
        ),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nlabels = ["a"]\n', "at least two labels"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nseed = -1\n', "seed must be in"),
        ('inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nwarmup_ratio = 1.5\n', "warmup_ratio must be"),
        (
            'inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nmin_char_count = 0\n',
            "min_char_count must be at",
        ),
        (
            'inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nnum_layers = 1\n',
            "out of range for the 1-layer",
        ),
    ],
)
def test_bad_specs_are_refused(tmp_path, body, message):
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_job(_write(tmp_path, body))


def test_overrides_and_int_to_float(tmp_path):
    p = _write(tmp_path, 'inputs = ["a"]\nmodel = "m"\nout = "o"\n[finetune]\nepochs = 2\n')
    spec = load_job(p, out="elsewhere", limit=None)
    assert spec.out == "elsewhere" and spec.inputs.limit is None
    assert spec.finetune.epochs == 2.0 and isinstance(spec.finetune.epochs, float)


def test_direct_construction_validates():
    with pytest.raises(SpecError, match="device"):
        JobSpec(inputs=["a"], model="m", out="o", device="tpu")
    with pytest.raises(SpecError, match="repeated"):
        JobSpec(inputs=["a"], model="m", out="o", layers=[-2, -2])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"inputs": lambda: InputSpec(["a"], limit=30.0)}, "limit: expected int, got float 30.0"),
        ({"layers": -2}, "layers: expected a list, got int -2"),
        ({"model": None}, "model: expected str, got NoneType None"),
        ({"progress": 1}, "progress: expected bool, got int 1"),
        ({"finetune": {"epochs": "3"}}, "finetune.epochs: expected float, got str '3'"),
    ],
)
def test_a_spec_built_in_python_is_type_checked_as_one_read_from_toml(options, message):
    """limit=30.0 failed as a TypeError after the model had loaded and the run folder was made."""
    with pytest.raises(SpecError) as e:
        JobSpec(
            **{
                "inputs": ["a"],
                "model": "m",
                "out": "o",
                **{k: v() if callable(v) else v for k, v in options.items()},
            }
        )
    assert str(e.value) == message


def test_what_python_hands_a_spec_is_taken_where_nothing_is_lost():
    import numpy as np

    spec = JobSpec(inputs=InputSpec(["a"], limit=np.int64(5)), model="m", out="o", layers=(-2, -1))
    assert (spec.inputs.limit, type(spec.inputs.limit), spec.layers) == (5, int, [-2, -1])


def test_a_byte_order_mark_is_read_past(tmp_path):
    p = tmp_path / "job.toml"
    p.write_bytes('\ufeffinputs = ["a"]\nmodel = "m"\nout = "o"\n'.encode())
    assert load_job(p).out == "o"


def test_a_folder_given_as_the_job_spec_is_named_as_one(tmp_path):
    with pytest.raises(SpecError, match="is a folder"):
        load_job(tmp_path)


def test_paths_are_accepted_as_in_a_notebook(tmp_path):
    spec = JobSpec(inputs=tmp_path / "a.parquet", model=tmp_path / "m", out=tmp_path / "o")
    assert spec.inputs.paths == [str(tmp_path / "a.parquet")] and spec.model == str(tmp_path / "m")
    assert JobSpec(inputs=[tmp_path / "a", "b"], model="m", out="o").inputs.paths == [
        str(tmp_path / "a"),
        "b",
    ]


def test_finetune_limits_apply_only_to_the_model_it_would_train(tmp_path):
    """[finetune] trains the model only when its folder is not there: a folder that is there is the
    model, and its own depth and positions count (extract checks them when it loads it)."""
    body = (
        'inputs = ["a"]\nmodel = "{m}"\nout = "o"\nlayers = [-5]\nmax_length = 512\n'
        "[finetune]\nnum_layers = 2\n"
    )
    with pytest.raises(SpecError, match="out of range for the 2-layer"):
        load_job(_write(tmp_path, body.format(m=tmp_path / "missing")))
    (tmp_path / "there").mkdir()
    assert load_job(_write(tmp_path, body.format(m=tmp_path / "there"))).layers == [-5]


@pytest.mark.parametrize(
    ("out", "on_existing", "message"),
    [
        ("file", "resume", "is a file, not a folder"),
        ("other", "resume", "is not empty and is not a run directory"),
        ("run", "new", "already holds a run"),
    ],
)
def test_an_out_that_would_be_refused_stops_the_job_before_it_trains_its_model(
    tmp_path, out, on_existing, message
):
    import json

    from bertattn_batch import schema
    from bertattn_batch.config import FinetuneSpec
    from bertattn_batch.errors import RunDirError
    from bertattn_batch.run import FORMAT, MANIFEST
    from bertattn_batch.train import ensure_model

    path = tmp_path / out
    if out == "file":
        path.write_text("not a run")
    else:
        path.mkdir()
        if out == "other":
            (path / "notes.txt").write_text("someone's notes")
        else:  # a run that committed a part
            files = {t: f"{t}/part-000000000000.parquet" for t in schema.TABLES}
            rows = dict.fromkeys(schema.TABLES, 1)
            part = {"name": "part-000000000000", "start_row": 0, "end_row": 1, "files": files, "rows": rows}
            (path / MANIFEST).write_text(json.dumps({"format": FORMAT, "parts": [part]}))
    spec = JobSpec(
        inputs=["a"],
        model=str(tmp_path / "m"),
        out=str(path),
        on_existing=on_existing,
        finetune=FinetuneSpec(),
    )
    with pytest.raises(RunDirError, match=message):
        ensure_model(spec, progress=False)
    assert not (tmp_path / "m").exists()


@pytest.mark.skipif(__import__("torch").backends.mps.is_available(), reason="this machine has MPS")
def test_a_device_that_is_not_there_or_unknown_is_named_in_one_line():
    from bertattn_batch.model import resolve_device

    with pytest.raises(SpecError, match="no Apple MPS device is available; use --device cpu"):
        resolve_device("mps")
    with pytest.raises(SpecError, match="device 'tpu' is not one torch knows"):
        resolve_device("tpu")


def test_batch_sizes_left_out_are_the_devices_and_given_ones_are_kept():
    """A GPU wants big batches, a CPU small ones (config.BATCH_DEFAULTS); what a job gives is its own."""
    spec = JobSpec(inputs=["x"], model="m", out="o")
    assert spec.batch_budget("cpu") == (16384, 256)
    assert spec.batch_budget("cuda") == (65536, 1024)
    assert spec.batch_budget("mps") == (16384, 256)  # any other device: the CPU's
    given = JobSpec(inputs=["x"], model="m", out="o", batch_tokens=4096)
    assert given.batch_budget("cuda") == (4096, 1024)
    with pytest.raises(SpecError, match="max_batch_size must be at least 1"):
        JobSpec(inputs=["x"], model="m", out="o", max_batch_size=0)
    # past 2**63 - 1 an OverflowError that named no option came from numpy
    for name in ("batch_tokens", "max_batch_size", "window", "workers", "host_processes"):
        with pytest.raises(SpecError, match=f"{name} must be at most 9,223,372,036,854,775,807, got 10"):
            JobSpec(inputs=["x"], model="m", out="o", **{name: 10**20})
    with pytest.raises(SpecError, match="limit must be at most 9,223,372,036,854,775,807, got 10"):
        InputSpec(["x"], limit=10**20)


def test_a_layer_out_of_range_says_which_there_are():
    """On a one-layer model the default -2 was refused without saying what to give instead."""
    from bertattn_batch.model.classifier import resolve_layers

    assert resolve_layers([-1, 0], 2) == [1, 0]
    with pytest.raises(SpecError, match=r"model with 1 layer\(s\): give one of -1 to 0 \(--layers\)"):
        resolve_layers([-2], 1)
    with pytest.raises(SpecError, match="same layer twice"):
        resolve_layers([-1, 1], 2)


def test_host_processes_on_the_ray_engine_are_said_to_be_unused(caplog):
    JobSpec(inputs=["x"], model="m", out="o", engine="ray", host_processes=2)
    assert "host_processes is the local engine's" in caplog.text


def test_ray_settings_on_the_local_engine_are_said_to_be_unused(caplog):
    JobSpec(inputs=["x.csv"], model="m", out="o", workers=4)
    assert "workers and ray_address are the ray engine's" in caplog.text
    caplog.clear()
    JobSpec(inputs=["x.csv"], model="m", out="o", engine="ray", workers=4)
    assert not caplog.text


def test_finetune_labels_lose_their_spaces_as_labels_read_from_a_file_do():
    """A job's labels = ["positive ", ...] matched no row once labels were read without their spaces."""
    assert FinetuneSpec(labels=["positive ", " negative"]).labels == ["positive", "negative"]
    with pytest.raises(SpecError, match="names 'a' twice"):
        FinetuneSpec(labels=["a", "a ", "b"])


def test_a_job_files_flat_input_keys_make_its_input_spec_and_are_recorded_flat(tmp_path):
    """Job files keep their flat keys (inputs, text_col ... limit); the manifest records the spec as a
    job file spells it, so a run made before reads and resumes the same."""
    body = (
        'inputs = ["a.csv"]\nmodel = "m"\nout = "o"\ntext_col = "body"\nid_col = "doc_id"\n'
        'input_format = "csv"\nencoding = "gb18030"\ndelimiter = ";"\nlimit = 5\n'
    )
    spec = load_job(_write(tmp_path, body))
    assert spec.inputs == InputSpec(
        ["a.csv"], text_col="body", id_col="doc_id", format="csv", encoding="gb18030", delimiter=";", limit=5
    )
    recorded = spec.to_dict()
    assert {k: recorded[k]
            for k in ("inputs", "text_col", "id_col", "label_col", "input_format", "limit")} == {
        "inputs": ["a.csv"], "text_col": "body", "id_col": "doc_id", "label_col": None, "input_format": "csv",
        "limit": 5,
    }  # fmt: skip
    assert "paths" not in recorded and "format" not in recorded
    assert from_dict(JobSpec, recorded) == spec
    with pytest.raises(SpecError, match=r"missing key\(s\) inputs"):
        load_job(_write(tmp_path, 'model = "m"\nout = "o"\ntext_col = "t"\n'))


@pytest.mark.parametrize(
    ("table", "want"),
    [
        ("", None),  # the job's own rows: training_inputs reads them
        ('text_col = "t"\n', InputSpec(["j.csv"], text_col="t", id_col="id", label_col="l", format="csv")),
        ('inputs = []\nlabel_col = "y"\n', InputSpec(["j.csv"], id_col="id", label_col="y", format="csv")),
        (
            'inputs = ["o.parquet"]\n',
            InputSpec(["o.parquet"], label_col="l"),
        ),  # other files: their own format
    ],
)
def test_a_finetune_tables_input_keys_are_completed_from_the_jobs(tmp_path, table, want):
    body = (
        'inputs = ["j.csv"]\nmodel = "m"\nout = "o"\nid_col = "id"\nlabel_col = "l"\ninput_format = "csv"\n'
    )
    spec = load_job(_write(tmp_path, body + "limit = 3\n[finetune]\n" + table))
    assert spec.finetune.inputs == want
