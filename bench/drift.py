"""bfloat16 against float32 on a whole corpus: the predictions that flip and how far the weights move.

Usage::

    .venv/bin/python bench/drift.py                       # the default job's model and corpus (make bench)
    .venv/bin/python bench/drift.py --device cuda

Runs the job in float32 and in ``--low``, joins the two runs' ``cls_attention`` on (doc_id, layer,
head, position), and writes the differences to ``bench/results/drift-<device>.json``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import harness

from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.model import resolve_device


def precision_drift(
    model: Path,
    corpus: Path,
    out_root: Path,
    device: str,
    max_length: int | None,
    id_col: str = "doc_id",
    label_col: str | None = "label",
    low: str = "bfloat16",
) -> dict[str, Any]:
    """Run ``corpus`` in float32 and in ``low``; flipped predictions and weight differences."""
    import polars as pl

    runs = {}
    for dt in ("float32", low):
        spec = JobSpec(
            inputs=InputSpec([str(corpus)], id_col=id_col, label_col=label_col), model=str(model),
            out=str(out_root / f"drift-{dt}"), max_length=max_length, device=device, dtype=dt,
            on_existing="overwrite", progress=False,
        )  # fmt: skip
        runs[dt] = run_job(spec)

    def scan(dt: str, table: str) -> pl.LazyFrame:
        return pl.scan_parquet(str(out_root / f"drift-{dt}" / table / "part-*.parquet"))

    def predictions(dt: str) -> pl.LazyFrame:
        return scan(dt, "predictions").select("doc_id", "status", "pred_id", pl.col("probs").list.first())

    p = (
        predictions("float32")
        .filter(pl.col("status") == "ok")
        .join(predictions(low), on="doc_id", suffix="_low")
        .select(
            pl.len().alias("reviews"),
            (pl.col("pred_id") != pl.col("pred_id_low")).sum().alias("flipped"),
            (pl.col("probs") - pl.col("probs_low")).abs().max().alias("prob_max_abs_diff"),
        )
        .collect()
        .row(0, named=True)
    )
    keys, values = ["doc_id", "layer", "head", "position"], ["weight", "weight_scaled"]
    diffs = [(pl.col(v) - pl.col(f"{v}_low")).abs() for v in values]
    w = (
        scan("float32", "cls_attention")
        .select(*keys, *values)
        .join(scan(low, "cls_attention").select(*keys, *values), on=keys, suffix="_low")
        .select(
            pl.len().alias("weights"),
            *(d.max().alias(f"{v}_max_abs_diff") for v, d in zip(values, diffs, strict=True)),
            *(d.mean().alias(f"{v}_mean_abs_diff") for v, d in zip(values, diffs, strict=True)),
        )
        .collect()
        .row(0, named=True)
    )
    return {
        "corpus": str(corpus),
        "model": str(model),
        "low": low,
        **p,
        "flipped_share": p["flipped"] / p["reviews"] if p["reviews"] else 0.0,
        **w,
        "runs": {
            dt: {"scored": s.scored, "padding_share": round(s.padding_share, 4), "seconds": s.seconds}
            for dt, s in runs.items()
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--low", default="bfloat16", help="the dtype weighed against float32")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    device = resolve_device(args.device)
    model, max_length = harness.zh_model()
    with tempfile.TemporaryDirectory(prefix="bertattn-drift-") as tmp:
        drift = precision_drift(model, harness.ZH_CORPUS, Path(tmp), str(device), max_length, low=args.low)
    print(
        f"{drift['reviews']} reviews, {args.low} against float32: {drift['flipped']} predictions flipped; "
        f"weight |diff| max {drift['weight_max_abs_diff']:.2e}, mean {drift['weight_mean_abs_diff']:.2e}; "
        f"scaled |diff| max {drift['weight_scaled_max_abs_diff']:.2e}, "
        f"mean {drift['weight_scaled_mean_abs_diff']:.2e}"
    )
    out = args.out or harness.RESULTS / f"drift-{device.type}.json"
    harness.write_results(out, {"machine": harness.machine(device), "drift": drift})
    return drift


if __name__ == "__main__":
    main()
