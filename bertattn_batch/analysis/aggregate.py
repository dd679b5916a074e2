"""Token influence by head across a run, from polars lazy scans of its committed Parquet parts.

Usage::

    bertattn aggregate runs/r1 --min-reviews 5 --top-k 5

    from bertattn_batch.analysis import aggregate, format_top
    result = aggregate("runs/r1")          # writes runs/r1/aggregates/token_influence.parquet
    print(format_top(result.table, k=5))

For each (layer, head, token) and each group of reviews (all of them, each predicted label, each
true label where the source had labels): the reviews and occurrences, the mean raw, scaled and
norm-based weight, how often the token is the head's top token in a review, and the measures that
weigh rarity (:mod:`.contrast`): the log-odds of the token's attention mass in one label against the
others, which rare tokens cannot win, and the mean shrunk toward the head's. Words as well as tokens: a token that
does not start with ``##`` and the ``##`` continuations right after it make one word (WordPiece
tokenizers only: the manifest records the run's continuation mark).

Definitions (the schema's descriptions say the same):
- only reviews with ``status == "ok"`` count; a review's rows in ``cls_attention`` join its prediction
  on ``doc_id``;
- means are over occurrences (a token twice in a review counts twice);
- a head's top token in a review is its content token with the largest raw weight; ties go to the
  first position (numpy's ``argmax``), so every scored review has exactly one top token per head;
- a word's raw weight is the sum of its pieces' raw weights (the head's mass is kept); its scaled
  weight is that sum min-max scaled again over the review's words, so 1 is the review's top word;
  its norm-based weight is the sum of its pieces' (an upper bound of the norm of their sum).

Memory stays bounded whatever the run's size: each committed part (a few thousand reviews, each
review wholly inside one part; cut into slices of whole reviews past ``MAX_ROWS_PER_PASS`` rows) is
reduced on its own to per-token sums, which are additive across parts; the sums are then combined
with streaming group-bys whose size is bounded by the vocabulary.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from .. import schema
from .._files import claim_dir, remove_stale
from ..errors import RunDirError, SpecError, WriteError
from ..run import (
    AGGREGATES_DIR,
    CommittedPart,
    committed_files,
    display_path,
    on_local_copy,
    read_manifest,
    status_now,
)
from .contrast import GROUP, with_contrasts, with_shrunk_means
from .derived import write_derived
from .words import CLASSES, KEY, REVIEW, word_continuation, word_rows

log = logging.getLogger(__name__)

TABLE = "token_influence"
UNITS = ("token", "word")
SPLITS = ("all", "pred_label", "label")
#: The defaults of :func:`aggregate`: tokens seen in fewer reviews are left out; the ranking measure.
MIN_REVIEWS = 5
RANK_BY = "mean_scaled"
#: Measures ``rank`` may order by (descending).
RANK_MEASURES = (
    "mean_scaled",
    "mean_weight",
    "mean_norm",
    "mean_scaled_shrunk",
    "log_odds_z",
    "log_odds",
    "top_share",
    "n_top",
    "n_reviews",
)
#: The measures that compare a label with the others: none for the split 'all'.
CONTRASTS = ("log_odds_z", "log_odds")
#: Attention rows reduced in one pass; a larger part is cut into slices of whole reviews (by their
#: number), which bounds memory whatever the run's window size or review length.
MAX_ROWS_PER_PASS = 1_000_000

_SUMS = ["n_reviews", "n_occurrences", "weight_sum", "scaled_sum", "scaled_sq_sum", "norm_sum", "n_top"]


@dataclass
class Aggregates:
    """What ``aggregate`` wrote: the table (small: bounded by the vocabulary) and how it was made."""

    path: Path
    table: pl.DataFrame
    options: dict[str, Any] = field(default_factory=dict)
    parts: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: Scored reviews per group (split, class_label, class_reviews; 'label' only where the source had
    #: labels): what a printout explains its missing groups by, as the table cannot tell a group that
    #: --min-reviews emptied from one the run lacks.
    groups: pl.DataFrame | None = None
    num_layers: int | None = None  # the model's, to name layers from the end too
    byte_level: bool | None = None  # the run's tokens spell bytes: printed decoded

    def line(self) -> str:
        units = self.table.group_by("unit").len().sort("unit").rows()
        counts = ", ".join(f"{n} {u} rows" for u, n in units)
        return (
            f"wrote {display_path(self.path)} ({counts or 'no rows'}) from {len(self.parts)} parts "
            f"in {self.seconds:.1f}s; min {self.options.get('min_reviews')} reviews, "
            f"ranked by {self.options.get('rank_by')}"
        )


def aggregates_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / AGGREGATES_DIR / f"{TABLE}.parquet"


def committed_parts(run_dir: str | Path, verify: bool = False) -> list[CommittedPart]:
    """The attention, token and predictions files of every part the manifest commits, in name order
    (see ``run.committed_files``; ``verify``: their pages' checksums checked)."""
    return committed_files(run_dir, ("cls_attention", "tokens", "predictions"), verify)


def review_rows(part: CommittedPart) -> pl.LazyFrame:
    """One part's attention rows of scored reviews, each with its token, predicted and true label, and
    keyed by the review's number within the part (``KEY``) instead of its doc_id."""
    keys = (
        pl.scan_parquet(part.files["predictions"], glob=False)
        .filter(pl.col("status") == "ok")
        .select("doc_id", *CLASSES)
        .unique("doc_id", maintain_order=True)
        .with_row_index(KEY)
        .collect()  # one row per review: small, and numbered once for both joins
        .lazy()
    )
    ids = keys.select("doc_id", KEY)
    attn = (
        pl.scan_parquet(part.files["cls_attention"], glob=False)
        .select("doc_id", "layer", "head", "position", "weight", "weight_scaled", "weight_norm")
        .join(ids, on="doc_id", how="inner")
        .drop("doc_id")
    )
    tokens = (
        pl.scan_parquet(part.files["tokens"], glob=False)
        .select("doc_id", "position", "token")
        .join(ids, on="doc_id", how="inner")
        .drop("doc_id")
    )
    return (
        attn.join(tokens, on=[KEY, "position"], how="left")  # a missing token row keeps a null token
        .join(keys.drop("doc_id"), on=KEY, how="inner")
        .with_columns(pl.col("weight", "weight_scaled", "weight_norm").cast(pl.Float64))
    )


def part_sums(rows: pl.LazyFrame, unit: str) -> pl.LazyFrame:
    """Additive per-(layer, head, token, pred_label, label) sums of one part's reviews.

    ``n_reviews`` counts distinct reviews within the part; a review lives in one part only, so the
    counts add up across parts.
    """
    peak = pl.col("weight").max().over(REVIEW)
    top_position = pl.col("position").filter(pl.col("weight") == peak).min().over(REVIEW)
    return (
        rows.with_columns(is_top=pl.col("position") == top_position)
        .group_by(["layer", "head", "token", *CLASSES])
        .agg(
            n_reviews=pl.col(KEY).n_unique().cast(pl.Int64),
            n_occurrences=pl.len().cast(pl.Int64),
            weight_sum=pl.col("weight").sum(),
            scaled_sum=pl.col("weight_scaled").sum(),
            scaled_sq_sum=(pl.col("weight_scaled") ** 2).sum(),
            norm_sum=pl.col("weight_norm").sum(),
            n_top=pl.col("is_top").sum().cast(pl.Int64),
        )
        .with_columns(unit=pl.lit(unit))
    )


def class_sizes(preds_paths: Sequence[Path | str]) -> pl.DataFrame:
    """Scored reviews per group: (split, class_label, class_reviews)."""
    if not preds_paths:
        return pl.DataFrame(schema={"split": pl.String, "class_label": pl.String, "class_reviews": pl.Int64})
    ok = (
        pl.scan_parquet(list(preds_paths), glob=False)
        .filter(pl.col("status") == "ok")
        .group_by(CLASSES)
        .agg(n=pl.len().cast(pl.Int64))
        .collect(engine="streaming")
    )
    frames = [
        pl.DataFrame({"split": ["all"], "class_label": [None], "class_reviews": [int(ok["n"].sum())]}),
        _sizes_by(ok, "pred_label"),
        _sizes_by(ok.filter(pl.col("label").is_not_null()), "label"),
    ]
    schema_ = {"split": pl.String, "class_label": pl.String, "class_reviews": pl.Int64}
    return pl.concat([f.cast(schema_) for f in frames if f.height]).filter(pl.col("class_reviews") > 0)


def _sizes_by(ok: pl.DataFrame, column: str) -> pl.DataFrame:
    return (
        ok.group_by(column)
        .agg(class_reviews=pl.col("n").sum())
        .rename({column: "class_label"})
        .with_columns(split=pl.lit(column))
        .select("split", "class_label", "class_reviews")
    )


def combine(sums: pl.LazyFrame, sizes: pl.DataFrame, min_reviews: int, rank_by: str) -> pl.LazyFrame:
    """Per-part sums -> the token_influence table: every split, means, the filter and the rank."""
    agg = [pl.col(c).sum() for c in _SUMS]
    by_split = [
        sums.group_by(["unit", "layer", "head", "token"])
        .agg(agg)
        .with_columns(split=pl.lit("all"), class_label=pl.lit(None, dtype=pl.String)),
        sums.group_by(["unit", "layer", "head", "pred_label", "token"])
        .agg(agg)
        .rename({"pred_label": "class_label"})
        .with_columns(split=pl.lit("pred_label")),
        sums.filter(pl.col("label").is_not_null())
        .group_by(["unit", "layer", "head", "label", "token"])
        .agg(agg)
        .rename({"label": "class_label"})
        .with_columns(split=pl.lit("label")),
    ]
    cols = ["unit", "layer", "head", "split", "class_label", "token", *_SUMS]
    every_token = pl.concat([f.select(cols) for f in by_split])
    table = (
        with_shrunk_means(with_contrasts(every_token))  # before the filter: the heads' totals count all
        .filter(pl.col("n_reviews") >= min_reviews)
        .join(sizes.lazy(), on=["split", "class_label"], how="inner", nulls_equal=True)
        .with_columns(
            mean_weight=pl.col("weight_sum") / pl.col("n_occurrences"),
            mean_scaled=pl.col("scaled_sum") / pl.col("n_occurrences"),
            mean_norm=pl.col("norm_sum") / pl.col("n_occurrences"),
            top_share=pl.col("n_top") / pl.col("n_reviews"),
        )
    )
    return ranked(table, rank_by).select(schema.columns(TABLE))


def ranked(table: pl.LazyFrame | pl.DataFrame, measure: str) -> pl.LazyFrame | pl.DataFrame:
    """``table`` sorted by group and ``measure`` (descending; ties: more reviews, then token text),
    with ``rank`` 1, 2, ... within each group. A contrast is null in the split 'all', where the order
    falls to the ties."""
    return table.sort(
        [*GROUP, measure, "n_reviews", "token"],
        descending=[False] * len(GROUP) + [True, True, False],
        nulls_last=False,
    ).with_columns(rank=pl.col("token").cum_count().over(GROUP).cast(pl.Int32))


@on_local_copy(write_back=True)
def aggregate(
    run_dir: str | Path,
    min_reviews: int = MIN_REVIEWS,
    rank_by: str = RANK_BY,
    units: Sequence[str] = UNITS,
    into: str | Path | None = None,
) -> Aggregates:
    """Compute token (and word) influence by head for a run; write and return it. ``into``: the folder
    to write the table (and its work files) into, where not the run's own ``aggregates/`` (a run that
    cannot be written to)."""
    t0 = time.perf_counter()
    if min_reviews < 1:
        raise SpecError(f"--min-reviews must be at least 1, got {min_reviews}")
    if rank_by not in RANK_MEASURES:
        raise SpecError(f"rank_by must be one of {', '.join(RANK_MEASURES)}; got {rank_by!r}")
    bad = [u for u in units if u not in UNITS]
    if bad or not units:
        raise SpecError(f"units must be among {', '.join(UNITS)}; got {list(units)}")
    run = Path(run_dir)
    manifest = read_manifest(run)
    parts = committed_parts(run, verify=True)
    if (status := status_now(run, manifest.status)) != "complete":  # its committed parts alone
        if not parts:
            raise RunDirError(f"{run} has no committed parts yet; run bertattn extract first")
        log.warning("%s is %s: aggregates of its %d committed parts only", run, status, len(parts))
    continuation = word_continuation(manifest)
    if continuation is None:
        units = [u for u in units if u != "word"]  # its pieces carry no continuation marks to join
    out_dir = Path(into) if into is not None else run / AGGREGATES_DIR
    remove_stale(out_dir, "_work-*")  # left by an aggregate that was killed
    work = out_dir / f"_work-{time.time_ns()}"
    try:
        work.mkdir(parents=True, exist_ok=True)
        claim = claim_dir(work)
    except OSError as e:
        raise WriteError(f"cannot write the aggregates into {out_dir}: {e.strerror or e}") from None
    try:
        sizes = class_sizes([p.files["predictions"] for p in parts])
        if parts:
            table = combine(_summed(parts, units, continuation, work), sizes, min_reviews, rank_by)
        else:  # a complete run over inputs without rows: an empty table, so what reads it still works
            table = pl.LazyFrame(schema=pl.from_arrow(schema.arrow(TABLE).empty_table()).schema)
        options = {"min_reviews": min_reviews, "rank_by": rank_by, "units": list(units)}
        # the result is bounded by the vocabulary (x heads x groups), so it is collected and cast
        # to the schema with pyarrow, which keeps the columns' descriptions in the file
        table = table.collect(engine="streaming")
        final = out_dir / f"{TABLE}.parquet"
        write_derived(
            final,
            schema.cast(table.to_arrow(), TABLE),
            TABLE,
            options,
            manifest.job_sha256,
            parts=json.dumps([p.name for p in parts]),
            created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
    except pl.exceptions.ComputeError as e:  # polars's word for a write that failed
        if "No space left" not in str(e):
            raise
        raise WriteError(f"cannot write the aggregates into {out_dir}: no space left on the device") from None
    except FileNotFoundError as e:  # (polars's) a part went while it was read
        raise RunDirError(
            f"{run}: {e.filename or 'a part'} went while aggregate read it (an --overwrite of the run "
            "meanwhile?); run aggregate again"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if claim is not None:
            os.close(claim)
    names = [p.name for p in parts]
    seconds = time.perf_counter() - t0
    return Aggregates(final, table, options, names, seconds, sizes, manifest.num_layers, manifest.byte_level)


def _summed(
    parts: list[CommittedPart], units: Sequence[str], continuation: str | None, work: Path
) -> pl.LazyFrame:
    """Per-token sums over all parts: each part reduced on its own, then the partial sums combined."""
    partials = []
    for part in parts:
        slices = -(-pq.ParquetFile(part.files["cls_attention"]).metadata.num_rows // MAX_ROWS_PER_PASS)
        for k in range(max(slices, 1)):
            rows = review_rows(part)
            if slices > 1:  # reviews never straddle slices: the sums stay additive
                rows = rows.filter(pl.col(KEY) % slices == k)
            for unit in units:
                frame = part_sums(rows if unit == "token" else word_rows(rows, continuation), unit)
                path = work / f"{unit}-{k}-{part.name}"
                frame.sink_parquet(path, engine="streaming")
                partials.append(path)
    base_path = work / "base.parquet"
    (
        pl.scan_parquet(partials, glob=False)
        .group_by(["unit", "layer", "head", "token", *CLASSES])
        .agg([pl.col(c).sum() for c in _SUMS])
        .sink_parquet(base_path, engine="streaming")
    )
    return pl.scan_parquet(base_path, glob=False)


def read_aggregates(run_dir: str | Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The written table and its metadata (options, parts); raise when there is none."""
    meta = aggregates_meta(run_dir)
    return pl.read_parquet(aggregates_path(run_dir), glob=False), meta


def aggregates_meta(run_dir: str | Path) -> dict[str, Any]:
    """The written table's metadata (options, parts) alone, from its footer; raise when there is none."""
    path = aggregates_path(run_dir)
    if not path.is_file():
        raise RunDirError(f"{path} does not exist; run bertattn aggregate {run_dir}")
    raw = pq.read_schema(path).metadata or {}
    meta = {k.decode(): v.decode() for k, v in raw.items() if not k.startswith(b"ARROW")}
    for key in ("options", "parts"):
        if key in meta:
            meta[key] = json.loads(meta[key])
    return meta


def is_current(run_dir: str | Path, min_reviews: int | None = None) -> bool:
    """True when the written aggregates, in this schema version, cover exactly the run's committed
    parts (and were computed with ``min_reviews``, where given)."""

    path = aggregates_path(run_dir)
    if not path.is_file():
        return False
    meta = aggregates_meta(run_dir)
    if meta.get("schema_version") != str(schema.version(TABLE)):  # written by an older bertattn
        return False
    if min_reviews is not None and meta.get("options", {}).get("min_reviews") != min_reviews:
        return False

    return meta.get("parts") == [p.name for p in committed_parts(run_dir)]
