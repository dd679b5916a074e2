"""Token influence by head across a run (the ``token_influence`` table), its printed top tokens, and the
reviews behind one token (``top_reviews``): each part, in slices of whole reviews, is reduced to
per-(layer, head, token or word, group) sums that add up across parts, so memory stays bounded."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from .. import schema, storage
from .._files import atomic_path, claim_dir, remove_stale, writing
from ..errors import RunDirError, SpecError, WriteError
from ..extract.words import first_positions, word_map
from ..run import (
    AGGREGATES_DIR,
    CommittedPart,
    Manifest,
    committed_files,
    display_path,
    layer_name,
    on_local_copy,
    read_manifest,
    status_now,
)
from .provenance import derived_meta, write_derived
from .spelling import columns, printable, readable, readable_map
from .words import KEY, NO_WORDS, SEGMENT, Words, check_words, run_words, word_rows

log = logging.getLogger(__name__)

TABLE = "token_influence"
UNITS = ("token", "word")
SPLITS = ("all", "pred_label", "label")
#: The defaults of :func:`aggregate`: tokens seen in fewer reviews are left out; the ranking measure.
MIN_REVIEWS = 5
RANK_BY = "log_odds_z"
#: Measures ``rank`` may order by (descending).
RANK_MEASURES = (
    *("mean_scaled", "mean_weight", "mean_norm", "mean_scaled_shrunk"),
    *("log_odds_z", "log_odds", "top_share", "n_top", "n_reviews"),
)
#: The measures that compare a label with the others: null in the split 'all'.
CONTRASTS = ("log_odds_z", "log_odds")
#: Attention rows reduced in one pass; a larger part is cut into slices of whole reviews.
MAX_ROWS_PER_PASS = 1_000_000
#: Floor of τ² (the spread of the true token means): a head whose token means differ by no more than
#: chance shrinks every token to the head's mean.
MIN_BETWEEN_VARIANCE = 1e-12
CLASSES = ["pred_label", "label"]
#: One head's tokens within one class; one head over a split; one token of a head over a split.
GROUP = ["unit", "layer", "head", "split", "class_label"]
_SPLIT = ["unit", "layer", "head", "split"]
_TOKEN = ["unit", "layer", "head", "split", "token"]
_SUMS = ["n_reviews", "n_occurrences", "weight_sum", "scaled_sum", "scaled_sq_sum", "norm_sum", "n_top"]
_SIZES = {"split": pl.String, "class_label": pl.String, "class_reviews": pl.Int64}


@dataclass
class Aggregates:
    """What ``aggregate`` wrote: the table (bounded by the vocabulary) and how it was made."""

    path: Path
    table: pl.DataFrame
    options: dict[str, Any]
    parts: list[str]
    seconds: float
    groups: pl.DataFrame  # scored reviews per (split, class_label): a printout names its emptied groups
    num_layers: int | None  # the model's, to name layers from the end too
    byte_level: bool | None  # the run's tokens spell bytes: printed decoded

    def line(self) -> str:
        units = self.table.group_by("unit").len().sort("unit").rows()
        counts = ", ".join(f"{n} {u} rows" for u, n in units)
        return (
            f"wrote {display_path(self.path)} ({counts or 'no rows'}) from {len(self.parts)} parts "
            f"in {self.seconds:.1f}s; min {self.options.get('min_reviews')} reviews, "
            f"ranked by {self.options.get('rank_by')}; words: {self.options.get('words') or 'none'}"
        )


def aggregates_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / AGGREGATES_DIR / f"{TABLE}.parquet"


def committed_parts(run_dir: str | Path, verify: bool = False) -> list[CommittedPart]:
    """The attention, token, predictions (and contributions) files of every committed part, by name."""
    alti = ("contributions",) if read_manifest(run_dir).spec.get("contributions") else ()
    return committed_files(run_dir, ("cls_attention", "tokens", "predictions", *alti), verify)


@dataclass
class PartRows:
    """One part's scored reviews, numbered by ``KEY``: attention rows, reviews, tokens. The rows carry
    integers only: their token as ``term`` (its id) and their review's labels as ``cls`` (a code of
    ``reviews``), so that the reductions group by integers; texts join the few rows they leave."""

    rows: pl.LazyFrame
    reviews: pl.DataFrame
    tokens: pl.LazyFrame

    def only(self, keep: pl.Expr) -> PartRows:
        """The reviews ``keep`` (an expression on the reviews' columns) selects, and their rows."""
        reviews = self.reviews.filter(keep)
        keys = reviews.lazy().select(KEY)
        return PartRows(self.rows.join(keys, on=KEY), reviews, self.tokens.join(keys, on=KEY))

    def units(self, unit: str, words: Words | None = None) -> tuple[pl.LazyFrame, pl.LazyFrame]:
        """The attention rows of ``unit``: the tokens', or those of the reviews' words (:mod:`.words`; the
        run's own where ``words`` are the stored ones, else made again); and each ``term``'s text (term,
        token): a token's id, a word's number in this part."""
        if unit == "token":
            return self.rows, self.tokens.select(term="token_id", token="token").unique("term")
        assert words is not None and words.rule is not None, "words need a rule"
        if words.stored:
            each = self.tokens.select(KEY, "position", "word", "word_text").collect()
        else:
            texts = self.reviews.select(KEY, "text") if words.need_texts else None
            each = first_positions(
                word_map(self.tokens.collect(), texts, words.rule, words.user_dict, words.continuation)
            ).collect()
        texts = each.select(token="word_text").unique().with_row_index("term")
        each = each.join(texts, left_on="word_text", right_on="token").lazy()
        return word_rows(self.rows, each), texts.lazy()


def review_rows(part: CommittedPart, extra: Sequence[str] = (), words: Words | None = None) -> PartRows:
    """One part's scored reviews (with their ``extra`` predictions columns) and attention rows, by ``KEY``;
    their tokens with their stored words where ``words`` reads them, and with the texts where it makes
    them again."""
    if words is not None and words.need_texts and not words.stored and "text" not in extra:
        extra = (*extra, "text")
    reviews = (
        pl.scan_parquet(part.files["predictions"], glob=False)
        .filter(pl.col("status") == "ok")
        .select("doc_id", *CLASSES, *extra)
        .unique("doc_id", maintain_order=True)
        .with_row_index(KEY)
        .collect()  # one row per review: small, and numbered once for every join
    )
    codes = reviews.select(CLASSES).unique().with_row_index("cls")
    reviews = reviews.join(codes, on=CLASSES, nulls_equal=True, maintain_order="left")
    ids = reviews.lazy().select("doc_id", KEY)

    def keyed(table: str, *columns: str) -> pl.LazyFrame:
        scan = pl.scan_parquet(part.files[table], glob=False).select("doc_id", *columns)
        return scan.join(ids, on="doc_id").drop("doc_id")

    attn = keyed("cls_attention", "layer", "head", "position", "weight", "weight_scaled", "weight_norm")
    if "contributions" in part.files:  # ALTI: one more score, of no head (layer and head null)
        a = pl.col("alti").cast(pl.Float64)
        lo, hi = a.min().over(KEY), a.max().over(KEY)
        scaled = pl.when(hi > lo).then((a - lo) / (hi - lo)).otherwise(0.0)
        alti = keyed("contributions", "position", "alti").select(
            layer=pl.lit(None, pl.Int16), head=pl.lit(None, pl.Int16), position="position", weight=a,
            weight_scaled=scaled, weight_norm=a, **{KEY: KEY},
        )  # fmt: skip
        attn = pl.concat([attn, alti], how="vertical_relaxed")
    stored = ("word", "word_text") if words is not None and words.stored else ()
    tokens = keyed("tokens", "position", "token_id", "token", "start", "end", *stored)
    rows = (
        # a missing token: a null term
        attn.join(tokens.select(KEY, "position", term="token_id"), on=[KEY, "position"], how="left")
        .join(reviews.lazy().select(KEY, "cls"), on=KEY, how="inner")
        .with_columns(pl.col("weight", "weight_scaled", "weight_norm").cast(pl.Float64))
    )
    return PartRows(rows, reviews, tokens)


def part_sums(rows: pl.LazyFrame, texts: pl.LazyFrame, reviews: pl.DataFrame, unit: str) -> pl.DataFrame:
    """Per-(layer, head, token, pred_label, label) sums of one part's reviews, additive across parts:
    occurrences and weights; ``n_top``, the reviews where the token is the head's largest weight (the
    first such position); ``n_reviews``, the reviews that hold it, counted on one head's rows, for every
    (layer, head) reads every token of a review. ``rows`` and ``texts`` as :meth:`PartRows.units` makes
    them; ``reviews`` with their labels' code."""
    rows = rows.collect().lazy()  # read by three reductions
    by = ["layer", "head", "term", "cls"]
    sums = rows.group_by(by).agg(
        n_occurrences=pl.len().cast(pl.Int64),
        weight_sum=pl.col("weight").sum(),
        scaled_sum=pl.col("weight_scaled").sum(),
        scaled_sq_sum=(pl.col("weight_scaled") ** 2).sum(),
        norm_sum=pl.col("weight_norm").sum(),
    )
    tops = (
        rows.with_columns(segment=SEGMENT)
        .filter(pl.col("weight") == pl.col("weight").max().over("segment"))
        .group_by("segment").agg(pl.col(by).sort_by("position").first())
        .group_by(by).agg(n_top=pl.len().cast(pl.Int64))
    )  # fmt: skip
    one_head = rows.filter(*(pl.col(c) == pl.col(c).min() for c in ("layer", "head")))
    held = one_head.group_by("term", "cls").agg(n_reviews=pl.col(KEY).n_unique().cast(pl.Int64))
    sums, tops, held = pl.collect_all([sums, tops, held])
    classes = reviews.select("cls", *CLASSES).unique("cls")
    return (
        sums.join(tops, on=by, how="left", nulls_equal=True)
        .join(held, on=["term", "cls"], how="left", nulls_equal=True)
        .join(texts.collect(), on="term", how="left", nulls_equal=True)
        .join(classes, on="cls")
        .select("layer", "head", "token", *CLASSES, *_SUMS, unit=pl.lit(unit))
        .with_columns(pl.col("n_top").fill_null(0))
    )


def _splits(frame: pl.LazyFrame | pl.DataFrame, keys: list[str], aggs: list[pl.Expr]) -> Iterator[Any]:
    """``frame`` grouped by ``keys`` within each split, with its ``split`` and ``class_label``."""
    for split in SPLITS:
        part = frame.filter(pl.col("label").is_not_null()) if split == "label" else frame
        label = pl.lit(None, dtype=pl.String) if split == "all" else pl.col(split)
        by = keys if split == "all" else [*keys, split]
        grouped = part.group_by(by).agg(aggs) if by else part.select(aggs)
        yield grouped.with_columns(split=pl.lit(split), class_label=label)


def class_sizes(preds_paths: Sequence[Path | str]) -> pl.DataFrame:
    """Scored reviews per group: (split, class_label, class_reviews)."""
    if not preds_paths:
        return pl.DataFrame(schema=_SIZES)
    ok = pl.scan_parquet(list(preds_paths), glob=False).filter(pl.col("status") == "ok")
    counts = ok.group_by(CLASSES).agg(n=pl.len().cast(pl.Int64)).collect(engine="streaming")
    frames = _splits(counts, [], [pl.col("n").sum().alias("class_reviews")])
    return pl.concat([f.select(*_SIZES).cast(_SIZES) for f in frames]).filter(pl.col("class_reviews") > 0)


def with_contrasts(sums: pl.LazyFrame) -> pl.LazyFrame:
    """``sums`` with ``log_odds`` and ``log_odds_z`` of each token in its class against the rest: the
    weighted log-odds ratio with an informative Dirichlet prior (Monroe, Colaresi & Quinn 2008, eq. 16 to
    22), a head's raw attention mass as the token's count and the split's totals as the prior; the z-score
    keeps a rare token from winning by chance. Null for the split 'all' and a split of one class."""
    y = pl.col("weight_sum")
    prior = y.sum().over(_TOKEN)  # α_w: the token's mass in every class of the split
    prior_total = y.sum().over(_SPLIT)  # α_0: the head's mass over the split
    n_class = y.sum().over(GROUP)
    y_rest, n_rest = prior - y, prior_total - n_class
    odds_class = (y + prior) / (n_class + prior_total - y - prior)
    odds_rest = (y_rest + prior) / (n_rest + prior_total - y_rest - prior)
    sd = (1 / (y + prior) + 1 / (y_rest + prior)).sqrt()
    log_odds = pl.when((pl.col("split") != "all") & (n_rest > 0)).then(odds_class.log() - odds_rest.log())
    return sums.with_columns(log_odds=log_odds, log_odds_z=log_odds / sd)


def with_shrunk_means(sums: pl.LazyFrame) -> pl.LazyFrame:
    """``sums`` with ``mean_scaled_shrunk``: each token's mean scaled weight pulled toward its head's mean
    in the group, the more the fewer reviews it was seen in: ``(n·m + κ·μ) / (n + κ)``, ``κ = s² / τ²``
    (empirical Bayes; ``s²`` the pooled within-token variance, ``τ²`` that of the token means less
    ``s²/n``). The groups' figures are reduced once and joined, not broadcast row by row."""
    n_occ, n_rev = pl.col("n_occurrences"), pl.col("n_reviews")
    mean = pl.col("scaled_sum") / n_occ
    within = (pl.col("scaled_sq_sum") - n_occ * mean**2).clip(lower_bound=0)
    groups = sums.group_by(GROUP).agg(
        head_mean=pl.col("scaled_sum").sum() / n_occ.sum(),  # μ
        pooled=within.sum() / n_occ.sum(),  # s²
        spread=mean.var(ddof=0),
        per_review=(1 / n_rev).mean(),
    )
    between = (pl.col("spread") - pl.col("pooled") * pl.col("per_review")).fill_null(0)  # τ²
    kappa = pl.col("pooled") / pl.max_horizontal(between, pl.lit(MIN_BETWEEN_VARIANCE))
    shrunk = (n_rev * mean + kappa * pl.col("head_mean")) / (n_rev + kappa)
    return (
        sums.join(groups, on=GROUP, how="left", nulls_equal=True)
        .with_columns(mean_scaled_shrunk=shrunk)
        .drop("head_mean", "pooled", "spread", "per_review")
    )


def combine(
    sums: pl.LazyFrame, sizes: pl.DataFrame, min_reviews: int, rank_by: str, tracks: pl.LazyFrame
) -> pl.LazyFrame:
    """Per-part sums (and ``tracks``, each head's ``alti_spearman``) -> the token_influence table."""
    cols = ["unit", "layer", "head", "split", "class_label", "token", *_SUMS]
    frames = _splits(sums, ["unit", "layer", "head", "token"], [pl.col(c).sum() for c in _SUMS])
    every_token = pl.concat([f.select(cols) for f in frames])
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
        .join(tracks, on=["layer", "head"], how="left")  # ALTI's own rows (null layer) get none
    )
    return ranked(table, rank_by).select(schema.columns(TABLE))


def tracks_alti(rows: pl.LazyFrame) -> pl.LazyFrame:
    """Per (layer, head) of one part's rows: the sum and count over reviews of the Spearman correlation
    between the head's raw weight and ALTI over the review's tokens (constant scores: none)."""
    alti = rows.filter(pl.col("layer").is_null()).select(KEY, "position", alti="weight")
    return (
        rows.filter(pl.col("layer").is_not_null())
        .join(alti, on=[KEY, "position"])
        .group_by([KEY, "layer", "head"])
        .agg(rho=pl.corr("weight", "alti", method="spearman"))
        .filter(pl.col("rho").is_not_nan())
        .group_by(["layer", "head"])
        .agg(rho_sum=pl.col("rho").sum(), rho_n=pl.len())
    )


def ranked(table: pl.LazyFrame | pl.DataFrame, measure: str) -> pl.LazyFrame | pl.DataFrame:
    """``table`` by group and ``measure`` (descending; ties: more reviews, token), ranked within groups."""
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
    words: str | None = None,
    user_dict: str | None = None,
) -> Aggregates:
    """Compute token (and word) influence by head for a run; write and return it. ``into``: a folder in
    place of the run's ``aggregates/``; ``words``, ``user_dict``: how tokens make words, if not the run's."""
    t0 = time.perf_counter()
    if min_reviews < 1:
        raise SpecError(f"--min-reviews must be at least 1, got {min_reviews}")
    one_of("rank_by", rank_by, RANK_MEASURES)
    if not units or any(u not in UNITS for u in units):
        raise SpecError(f"units must be among {', '.join(UNITS)}; got {list(units)}")
    run = Path(run_dir)
    manifest = read_manifest(run)
    parts = committed_parts(run, verify=True)
    if (status := status_now(run, manifest.status)) != "complete":  # its committed parts alone
        if not parts:
            raise RunDirError(f"{run} has no committed parts yet; run bertattn extract first")
        log.warning("%s is %s: aggregates of its %d committed parts only", run, status, len(parts))
    rule = run_words(manifest, words, user_dict)
    if rule.rule is None:
        units = [u for u in units if u != "word"]
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
            sums, tracks = _summed(parts, units, rule, work)
            table = combine(sums, sizes, min_reviews, rank_by, tracks)
        else:  # a complete run over inputs without rows: an empty table
            table = pl.LazyFrame(schema=pl.from_arrow(schema.arrow(TABLE).empty_table()).schema)
        options = {"min_reviews": min_reviews, "rank_by": rank_by, "units": list(units), "words": rule.rule}
        table = table.collect(engine="streaming")  # small; cast by pyarrow to keep column descriptions
        dest = out_dir / f"{TABLE}.parquet"
        names = [p.name for p in parts]
        meta = {"parts": json.dumps(names), "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        write_derived(dest, schema.cast(table.to_arrow(), TABLE), TABLE, options, manifest.job_sha256, **meta)
    except pl.exceptions.ComputeError as e:  # polars's word for a write that failed
        if "No space left" not in str(e):
            raise
        raise WriteError(f"cannot write the aggregates into {out_dir}: no space left on the device") from None
    except FileNotFoundError as e:  # a part went while it was read
        raise RunDirError(
            f"{run}: {e.filename or 'a part'} went while aggregate read it (an --overwrite of the run "
            "meanwhile?); run aggregate again"
        ) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if claim is not None:
            os.close(claim)
    seconds = time.perf_counter() - t0
    return Aggregates(dest, table, options, names, seconds, sizes, manifest.num_layers, manifest.byte_level)


def _summed(
    parts: list[CommittedPart], units: Sequence[str], words: Words, work: Path
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Per-token sums over all parts (each slice reduced on its own), and each head's ALTI tracking."""
    partials, rhos = [], []
    for part in parts:
        slices = -(-pq.ParquetFile(part.files["cls_attention"]).metadata.num_rows // MAX_ROWS_PER_PASS)
        whole = review_rows(part, words=words if "word" in units else None)
        for k in range(max(slices, 1)):
            rows = whole.only(pl.col(KEY) % slices == k) if slices > 1 else whole  # sums stay additive
            rows.rows = rows.rows.collect(engine="streaming").lazy()  # at most MAX_ROWS_PER_PASS rows
            if "contributions" in part.files:
                rhos.append(work / f"rho-{k}-{part.name}")
                tracks_alti(rows.rows).collect().write_parquet(rhos[-1])
            for unit in units:
                path = work / f"{unit}-{k}-{part.name}"
                part_sums(*rows.units(unit, words), rows.reviews, unit).write_parquet(path)
                partials.append(path)
    base_path = work / "base.parquet"
    by_token = pl.scan_parquet(partials, glob=False).group_by(["unit", "layer", "head", "token", *CLASSES])
    by_token.agg([pl.col(c).sum() for c in _SUMS]).sink_parquet(base_path, engine="streaming")
    rho = pl.col("rho_sum").sum() / pl.col("rho_n").sum()
    if rhos:
        tracks = pl.scan_parquet(rhos, glob=False).group_by(["layer", "head"]).agg(alti_spearman=rho)
    else:
        tracks = pl.LazyFrame(schema={"layer": pl.Int16, "head": pl.Int16, "alti_spearman": pl.Float64})
    return pl.scan_parquet(base_path, glob=False), tracks


def read_aggregates(run_dir: str | Path) -> tuple[pl.DataFrame, dict[str, Any]]:
    """The written table and its metadata (options, parts); raise when there is none."""
    path = aggregates_path(run_dir)
    if not path.is_file():
        raise RunDirError(f"{path} does not exist; run bertattn aggregate {run_dir}")
    return pl.read_parquet(path, glob=False), derived_meta(path)


def is_current(run_dir: str | Path, min_reviews: int | None = None) -> bool:
    """True when the written aggregates, in this schema version, cover exactly the run's committed parts
    (and were computed with ``min_reviews``, where given)."""
    path = aggregates_path(run_dir)
    meta = derived_meta(path) if path.is_file() else {}
    return (
        meta.get("schema_version") == str(schema.version(TABLE))
        and min_reviews in (None, meta.get("options", {}).get("min_reviews"))
        and meta.get("parts") == [p.name for p in committed_parts(run_dir)]
    )


def view(
    table: pl.DataFrame,
    unit: str = "token",
    split: str = "all",
    layers: Sequence[int] | None = None,
    measure: str | None = None,
    heads: Sequence[int] | None = None,
) -> pl.DataFrame:
    """The rows of one unit and split (and ``layers``, ``heads``), ranked again by ``measure`` if given."""
    out = table.filter((pl.col("unit") == unit) & (pl.col("split") == split))
    for column, wanted in (("layer", layers), ("head", heads)):
        if wanted is not None:
            out = out.filter(pl.col(column).is_in(list(wanted)))
    if measure is not None:
        out = ranked(out, measure)
    return out.sort(["layer", "class_label", "head", "rank"], nulls_last=False)


def top_tokens(table: pl.DataFrame, k: int = 5, *args: Any, **options: Any) -> pl.DataFrame:
    """The k best-ranked rows per (layer, head, class_label) of :func:`view`."""
    return view(table, *args, **options).filter(pl.col("rank") <= k)


def run_layer(manifest: Manifest, layer: int | None) -> int:
    """A layer as the user gives it (negative counts from the end; None: the run's first) -> its index."""
    stored = manifest.layers
    if layer is None:
        if not stored:
            raise RunDirError("the run's manifest lists no layers")
        return int(stored[0])
    idx = layer + int(manifest.model.get("num_layers", 0)) if layer < 0 else layer
    if idx not in stored:
        raise SpecError(f"layer {layer} is not in this run; it holds layers {stored} (0-based)")
    return idx


def check_head(manifest: Manifest, head: int) -> None:
    """SpecError where ``head`` is not one of the run's model's heads."""
    heads = int(manifest.model.get("num_heads", 0))
    if not 0 <= head < heads:
        raise SpecError(f"--head {head}: the model's heads are 0 to {heads - 1}")


#: What :func:`export` writes, by suffix; and the significant digits of a weight in any CSV or XLSX
#: this package writes (the tables of ``plot`` too): small weights keep their size.
EXPORTS = (".csv", ".xlsx", ".parquet")
SIGNIFICANT = 4


def significant(value: float | None) -> float | None:
    """``value`` rounded to :data:`SIGNIFICANT` significant digits, as :func:`export` rounds a cell."""
    return None if value is None else float(f"{value:.{SIGNIFICANT}g}")


def export_path(
    path: str | Path, suffixes: Sequence[str] = EXPORTS, run_dir: str | Path | None = None
) -> Path:
    """``path`` checked to name a file :func:`export` (or another writer of ``suffixes``) writes, and not
    one inside the folders of ``run_dir``, where it would replace a part or a derived table."""
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        raise SpecError(f"--out must end in {', '.join(suffixes)}; got {path.name!r}")
    run = None if run_dir is None or storage.is_remote(str(run_dir)) else Path(run_dir).resolve()
    folder = path.absolute().parent.resolve()  # a link at --out itself is replaced, not written through
    if run is not None and folder.is_relative_to(run) and folder != run:
        raise SpecError(f"--out {path} is inside a folder of the run {run_dir}; write it elsewhere")
    return path


def export(frame: pl.DataFrame, path: str | Path) -> Path:
    """Write ``frame`` as CSV (UTF-8 with the mark that tells Excel so), XLSX or Parquet; the CSV and
    XLSX cells rounded to :data:`SIGNIFICANT` digits, as a person reads them."""
    path = export_path(path)
    suffix = path.suffix.lower()
    if suffix != ".parquet":
        frame = frame.with_columns(pl.col(pl.Float32, pl.Float64).round_sig_figs(SIGNIFICANT))
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, unique=True) as tmp:
            if suffix == ".csv":
                frame.write_csv(tmp, include_bom=True)
            elif suffix == ".xlsx":
                frame.write_excel(tmp, autofit=True)
            else:
                frame.write_parquet(tmp)
    return path


def one_of(option: str, value: str, allowed: Sequence[str]) -> None:
    """SpecError where ``value`` of ``option`` is none of ``allowed``."""
    if value not in allowed:
        raise SpecError(f"{option} must be one of {', '.join(allowed)}; got {value!r}")


def check_word_unit(manifest: Manifest, words: str | None = None, user_dict: str | None = None) -> None:
    """SpecError where ``--unit word`` is asked of a run that, under ``words``, makes no words: checked
    before the work, as its aggregates would replace the run's own without their words."""
    if run_words(manifest, words, user_dict).rule is None:
        why = NO_WORDS
        if words == "none":
            why = "--words none turns them off"
        elif words not in (None, "auto"):  # a rule that reads the texts, of a run that stored none
            why = f"{words} words need the reviews' texts, which this run did not store"
        raise SpecError(f"--unit word: {why}; use --unit token")


def check_top_options(k: int, unit: str, split: str, measure: str = "mean_scaled") -> None:
    """What :func:`format_top` can print; the CLI checks it before the aggregate is computed."""
    one_of("--unit", unit, UNITS)
    one_of("--by", split, SPLITS)
    one_of("--rank-by", measure, RANK_MEASURES)
    if k < 1:
        raise SpecError(f"--top-k must be at least 1; got {k}")
    if measure in CONTRASTS and split == "all":
        raise SpecError(
            f"{measure} compares one label with the others; print it --by pred_label or --by label"
        )


def shown_terms(top: pl.DataFrame, byte_level: bool | None) -> dict[str, str]:
    """How each term of rows of one unit prints (:func:`~.spelling.readable_map`): a token as a reader
    sees it, decoded where tokens spell bytes; a word as its review's text spells it, never decoded."""
    words = not top.is_empty() and top["unit"][0] == "word"
    return readable_map(top["token"].to_list(), False if words else byte_level)


def format_top(
    table: pl.DataFrame,
    k: int = 5,
    unit: str = "token",
    split: str = "all",
    layers: Sequence[int] | None = None,
    measure: str = "mean_scaled",
    units: Sequence[str] | None = None,
    groups: pl.DataFrame | None = None,
    num_layers: int | None = None,
    byte_level: bool | None = None,
    heads: Sequence[int] | None = None,
) -> str:
    """A text table: a line per head (``heads``: those only), its top k tokens with their measure; ``units``
    and ``groups`` (:class:`Aggregates`) say what the run holds, else the table tells it."""
    check_top_options(k, unit, split)
    units = table["unit"].unique() if units is None else units
    splits = table["split"].unique() if groups is None else groups["split"]
    if unit == "word" and unit not in units:
        return f"{NO_WORDS}; use --unit token"
    top = top_tokens(table, k, unit, split, layers, measure, heads)
    if top.is_empty():
        if groups is not None and groups.is_empty():
            return (
                "no review of this run was scored (its inputs held no rows, or see the statuses in its "
                "predictions); nothing to print"
            )
        if split == "label" and split not in splits:
            raise SpecError("--by label: this run has no input labels to split by (extract with --label-col)")
        return f"no {unit}s pass the filter for split {split!r}; lower --min-reviews"
    if measure in CONTRASTS and top[measure].is_null().all():
        classes = ", ".join(str(c) for c in top["class_label"].unique(maintain_order=True))
        return (
            f"{measure} compares a {split} with the others, and every scored review has {split} {classes}: "
            "nothing to contrast; rank by another measure (--rank-by mean_scaled)"
        )
    shown = shown_terms(top, byte_level)
    values = top.select("token", measure).rows()
    said = [f"{shown[t]} {f'{v:.3f}' if isinstance(v, float) else v}" for t, v in values]
    cells = top.with_columns(cell=pl.Series(said, dtype=pl.String))
    blocks = []
    for (layer, cls), group in cells.group_by(["layer", "class_label"], maintain_order=True):
        who = "all reviews" if cls is None else f"{split} = {printable(str(cls), None)}"
        where = "ALTI, the whole model" if layer is None else layer_name(layer, num_layers)
        lines = [f"{where} · {who} ({group['class_reviews'][0]} reviews) · top {k} {unit}s, {measure}"]
        width = max(map(columns, group["cell"]))
        tracked = group["alti_spearman"].is_not_null().any()  # the run has ALTI: how far each head tracks it
        head_line = "  ".join(f"#{i}".ljust(width) for i in range(1, k + 1)).rstrip()
        lines.append("head  " + ("ALTI ρ  " if tracked else "") + head_line)
        for (head,), rows in group.group_by("head", maintain_order=True):  # every head of a layer, or ALTI
            r = rows["alti_spearman"][0]
            rho_cell = f"{'' if r is None else f'{r:+.2f}':>6}  " if tracked else ""
            cell = "  ".join(c + " " * (width - columns(c)) for c in rows["cell"]).rstrip()
            lines.append(f"{'' if head is None else head:>4}  {rho_cell}{cell}")
        blocks.append("\n".join(lines))
    # a group with scored reviews but no row left is named, not left out
    shown_classes = set(top["class_label"].to_list())
    emptied = [] if groups is None else groups.filter(pl.col("split") == split).iter_rows(named=True)
    blocks += [
        f"{split} = {printable(str(g['class_label']), None)} ({g['class_reviews']} reviews): "
        f"no {unit}s pass the filter; lower --min-reviews"
        for g in emptied
        if g["class_label"] not in shown_classes
    ]
    return "\n\n".join(blocks)


# -- the reviews where one head attends most to one token or word (``bertattn reviews``): ranked by the raw
# weight (a word's: its tokens' summed), as the scaled weight ties at 1.0 wherever the token is the
# review's top.
#: Characters of a review's text printed.
TEXT_CHARS = 200
COLUMNS = [
    "rank", "doc_id", "layer", "head", "weight", "weight_scaled", "position", "pred_label", "pred_prob",
    "label", "text",
]  # fmt: skip


@on_local_copy()
def top_reviews(
    run_dir: str | Path,
    term: str,
    head: int,
    layer: int | None = None,
    unit: str = "token",
    n: int = 10,
    words: str | None = None,
    user_dict: str | None = None,
) -> pl.DataFrame:
    """The ``n`` scored reviews whose largest raw weight on ``term`` (a token, or a word with ``unit``
    'word') at ``head`` of ``layer`` (default: the run's first) is highest (:data:`COLUMNS`)."""
    manifest = read_manifest(run_dir)
    idx = run_layer(manifest, layer)
    check_head(manifest, head)
    check_words(words)
    if n < 1:
        raise SpecError(f"--top must be at least 1; got {n}")
    rule = run_words(manifest, words, user_dict) if unit == "word" else None
    if rule is not None and rule.rule is None:
        raise SpecError(f"{NO_WORDS}; ask for a --token")
    term = term.lower() if unit == "word" else term  # word texts are lower-cased
    found = []
    for part in committed_parts(run_dir, verify=True):
        rows = review_rows(part, extra=("text", "pred_prob"), words=rule)
        rows.rows = rows.rows.filter((pl.col("layer") == idx) & (pl.col("head") == head))
        if rule is not None and not rule.stored:  # only the reviews whose text holds it are segmented
            rows = rows.only(pl.col("text").str.to_lowercase().str.contains(term, literal=True))
        unit_rows, texts = rows.units(unit, rule)
        hits = unit_rows.join(named(texts, term, unit, manifest.byte_level), on="term")
        best = hits.sort("weight", "position", descending=[True, False]).group_by(KEY).first()
        best = best.select(KEY, "layer", "head", "weight", "weight_scaled", "position")
        found.append(best.join(rows.reviews.lazy(), on=KEY))
    top = pl.concat(found).sort(["weight", "doc_id"], descending=[True, False]).head(n).collect()
    return top.with_row_index("rank", offset=1).select(COLUMNS)


def named(texts: pl.LazyFrame, term: str, unit: str, byte_level: bool | None) -> pl.LazyFrame:
    """The terms (term, token) that ``term`` names: a word in any case; a token as stored or as the
    printouts spell it, where tokens spell bytes (RoBERTa's 'Ġgood' and 'good' both print 'good')."""
    token = pl.col("token")
    if unit == "word":
        return texts.filter(token.str.to_lowercase() == term)
    if byte_level is False:
        return texts.filter(token == term)
    spelled = texts.collect()
    plain = term.replace("␣", " ").strip()
    shown = readable(spelled["token"].to_list(), byte_level)
    kept = [
        t == term or s.replace("␣", " ").strip() == plain
        for t, s in zip(spelled["token"], shown, strict=True)
    ]
    return spelled.filter(pl.Series(kept, dtype=pl.Boolean)).lazy()


def file_name(doc_id: str) -> str:
    """A review's id made a plain file name in the current folder: '../x' and 'a/b' name no other; an id
    that had to change keeps a hash of itself, so that two ids (a/b, a_b) name two files."""
    name = re.sub(r"[^\w.-]+", "_", doc_id).lstrip(".")[:100]
    if name == doc_id:
        return name
    return f"{name or 'review'}-{hashlib.sha256(doc_id.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def format_reviews(
    top: pl.DataFrame, run_dir: str | Path, term: str, unit: str, num_layers: int | None
) -> str:
    """Each review: its rank, weights, prediction, text, and the ``bertattn plot`` command that draws it."""
    if top.is_empty():
        return f"no scored review holds the {unit} {term!r} (spelled as the run's {unit}s are)"
    layer = top["layer"][0]
    where = f"head {top['head'][0]} of {layer_name(layer, num_layers)}"
    reviews = "the review" if top.height == 1 else f"the {top.height} reviews"
    lines = [f"{reviews} where {where} attends most to the {unit} {term!r}, by raw weight"]
    run = shlex.quote(display_path(run_dir))
    for r in top.iter_rows(named=True):
        prob = "" if r["pred_prob"] is None else f" ({r['pred_prob']:.3f})"
        label = "" if r["label"] is None else f" · label {printable(r['label'], 40)}"
        doc = printable(r["doc_id"], 80)
        lines += [
            f"{r['rank']:>3}. {doc} · weight {r['weight']:.4f} (scaled {r['weight_scaled']:.3f}) · "
            f"predicted {printable(r['pred_label'] or '', 40)}{prob}{label}",
            f"     {printable(r['text'], TEXT_CHARS) if r['text'] is not None else '(text not stored)'}",
            f"     bertattn plot {run} --doc-id {shlex.quote(r['doc_id'])} --layer {layer} --unit {unit} "
            f"--out {shlex.quote(file_name(r['doc_id']))}.png",
        ]
    return "\n".join(lines)
