"""The predictions checks, as polars lazy queries over every readable part: row ranges, doc ids,
statuses, probabilities and predicted labels."""

from __future__ import annotations

import polars as pl

from ... import schema
from ...run import row_range_problems
from .layout import RunView
from .report import KEPT, Recorder

#: |sum(probs) - 1| allowed: probabilities are a float32 softmax whatever the model's dtype.
PROBS_TOLERANCE = 1e-4


def check_predictions(rec: Recorder, run: RunView) -> dict[str, int]:
    """row_index, doc_id and predictions checks over every readable predictions part; status counts."""
    parts = [p for p in run.parts if "predictions" in p.readable]
    _check_row_ranges(rec, run)
    if not parts:
        for check in ("row_index", "doc_id", "predictions"):
            rec.skip(check, "no readable predictions parts")
        return {}
    by_file = {str(run.file(p, "predictions")): p for p in parts}
    lf = pl.scan_parquet(list(by_file), include_file_paths="_file", glob=False).with_columns(
        pl.col("_file").replace_strict({f: p.rel["predictions"] for f, p in by_file.items()})
    )
    statuses = dict(
        lf.group_by("status").agg(pl.len()).collect(engine="streaming").iter_rows()  # (status, n)
    )

    per_file = lf.group_by("_file").agg(
        n=pl.len(),
        lo=pl.col("row_index").min(),
        hi=pl.col("row_index").max(),
        distinct=pl.col("row_index").n_unique(),
    )
    rel_to_part = {p.rel["predictions"]: p for p in parts}
    for rel, n, lo, hi, distinct in per_file.collect(engine="streaming").iter_rows():
        p = rel_to_part[rel]
        if p.generation == 0:
            good = n == distinct == p.end_row - p.start_row and lo == p.start_row and hi == p.end_row - 1
            want = f"each of {p.start_row}..{p.end_row - 1} once"
        else:
            good = n == distinct and (n == 0 or (lo >= p.start_row and hi < p.end_row))
            want = f"distinct indices within {p.start_row}..{p.end_row - 1}"
        if not good:
            rec.fail(
                "row_index",
                f"{rel}: {n} rows, {distinct} distinct row_index in {lo}..{hi}; expected {want}",
            )
    rec.note("row_index", f"{sum(statuses.values())} rows in {len(parts)} parts")

    dups = (
        lf.filter(pl.col("status") == "ok")
        .group_by("doc_id")
        .agg(n=pl.len(), files=pl.col("_file").unique().sort().head(2))
        .filter(pl.col("n") > 1)
        .sort("doc_id")
        .collect(engine="streaming")
    )
    rec.fail_many(
        "doc_id",
        dups.height,
        (f"doc {d!r} scored {n} times ({', '.join(f)})" for d, n, f in dups.head(KEPT).iter_rows()),
    )
    rec.note("doc_id", f"{statuses.get('ok', 0)} scored reviews")
    apply_rules(rec, lf, _prediction_rules(run))
    labels = f", {len(run.id2label)} labels" if run.id2label else ""
    rec.note("predictions", f"{sum(statuses.values())} rows{labels}")
    return statuses


def _check_row_ranges(rec: Recorder, run: RunView) -> None:
    """Generation 0's parts tile 0..N-1 with no gap or overlap; later generations do not overlap."""
    for problem in row_range_problems((p.generation, p.start_row, p.end_row) for p in run.parts):
        rec.fail("row_index", problem)


Rule = tuple[str, pl.Expr, pl.Expr]  # (check, True where a row breaks it, message for such a row)


def fmt(template: str, *args: str | pl.Expr) -> pl.Expr:
    """``pl.format`` where a plain string names a column; floats are shown to 6 decimals."""
    return pl.format(template, *(pl.col(a) if isinstance(a, str) else a for a in args))


def r(name: str) -> pl.Expr:
    return pl.col(name).cast(pl.Float64).round(6)


def _prediction_rules(run: RunView) -> list[Rule]:
    ok = pl.col("status") == "ok"
    probs, pred_id = pl.col("probs"), pl.col("pred_id")
    at = fmt("{} row {} doc '{}'", "_file", "row_index", "doc_id")
    argmax = probs.list.arg_max()
    total = probs.list.sum().cast(pl.Float64)
    predicted = probs.is_not_null() | pred_id.is_not_null() | pl.col("pred_label").is_not_null()
    top = run.max_length or 2**31 - 1
    rules = [
        (~pl.col("status").is_in(schema.STATUSES), fmt("{}: unknown status '{}'", at, "status")),
        (ok & probs.is_null(), fmt("{}: scored but probs is null", at)),
        (ok & ~((total - 1).abs() <= PROBS_TOLERANCE), fmt("{}: probs sum to {}", at, total.round(6))),
        (
            ok & (pred_id.is_null() | (pred_id != argmax)),
            fmt("{}: pred_id {} is not the argmax {} of probs", at, "pred_id", argmax),
        ),
        (
            ok & ~pl.col("n_tokens").is_between(3, top),
            fmt("{}: scored with n_tokens {}, expected 3..{}", at, "n_tokens", pl.lit(top)),
        ),
        (
            ~ok & (predicted | pl.col("pred_prob").is_not_null() | (pl.col("n_tokens") != 0)),
            fmt("{}: status '{}' but a prediction or n_tokens {}", at, "status", "n_tokens"),
        ),
        (
            ok
            & ~((pl.col("pred_prob") - probs.list.get(pred_id, null_on_oob=True)).abs() <= PROBS_TOLERANCE),
            fmt("{}: pred_prob {} is not probs[pred_id]", at, r("pred_prob")),
        ),
    ]
    run_id = run.manifest.get("run_id")
    if isinstance(run_id, str):
        rules.append((pl.col("run_id") != run_id, fmt("{}: run_id '{}' is not the run's", at, "run_id")))
    if run.id2label:
        n = len(run.id2label)
        label = pred_id.cast(pl.String).replace_strict(run.id2label, default=None, return_dtype=pl.String)
        rules += [
            (
                ok & (probs.list.len() != n),
                fmt("{}: {} probs for {} labels", at, probs.list.len(), pl.lit(n)),
            ),
            (
                ok & (label.is_null() | (pl.col("pred_label") != label)),
                fmt("{}: pred_label '{}' is not id2label[{}]", at, "pred_label", "pred_id"),
            ),
        ]
    return [("predictions", bad, msg) for bad, msg in rules]


def apply_rules(rec: Recorder, lf: pl.LazyFrame, rules: list[Rule]) -> None:
    """Count the rows breaking each rule in one pass over ``lf``; format messages only for broken rules."""
    flags = [bad.fill_null(False) for _, bad, _ in rules]
    counts = (
        lf.select([f.sum().alias(f"n{i}") for i, f in enumerate(flags)]).collect(engine="streaming").row(0)
    )
    for (check, _, msg), flag, n in zip(rules, flags, counts, strict=True):
        if n:
            examples = lf.filter(flag).head(KEPT).select(msg).collect(engine="streaming").to_series()
            rec.fail_many(check, int(n), examples.to_list())
