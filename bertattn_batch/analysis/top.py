"""The printed table of ``bertattn aggregate``: each head's top tokens, a line a head."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import polars as pl

from ..errors import SpecError
from ..run import layer_name
from .aggregate import CONTRASTS, RANK_MEASURES, SPLITS, UNITS, ranked
from .spelling import printable, readable_map


def top_tokens(
    table: pl.DataFrame,
    k: int = 5,
    unit: str = "token",
    split: str = "all",
    layers: Sequence[int] | None = None,
    measure: str | None = None,
) -> pl.DataFrame:
    """The k best-ranked rows per (layer, head, class_label) of one unit and split: by the table's own
    rank, or ranked again by ``measure``."""
    out = table.filter((pl.col("unit") == unit) & (pl.col("split") == split))
    if layers is not None:
        out = out.filter(pl.col("layer").is_in(list(layers)))
    if measure is not None:
        out = ranked(out, measure)
    return out.filter(pl.col("rank") <= k).sort(["layer", "class_label", "head", "rank"], nulls_last=False)


def check_top_options(k: int, unit: str, split: str, measure: str = "mean_scaled") -> None:
    """What format_top can print; checked by the CLI before the aggregate is computed."""
    for option, value, allowed in (
        ("--unit", unit, UNITS),
        ("--by", split, SPLITS),
        ("--rank-by", measure, RANK_MEASURES),
    ):
        if value not in allowed:
            raise SpecError(f"{option} must be one of {', '.join(allowed)}; got {value!r}")
    if k < 1:
        raise SpecError(f"--top-k must be at least 1; got {k}")
    if measure in CONTRASTS and split == "all":
        raise SpecError(
            f"{measure} compares one label with the others; print it --by pred_label or --by label"
        )


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
) -> str:
    """A compact text table: one line per head, its top k tokens with their measure.

    ``byte_level``: the run's tokens spell bytes (byte-level BPE); they are printed as text
    (:func:`spelling.readable`).

    ``units`` and ``groups`` (from :class:`Aggregates`) say what the run holds; without them it is
    guessed from the table, which cannot tell a group or unit the run lacks from one that
    ``--min-reviews`` emptied.
    """
    splits = None if groups is None else set(groups["split"].to_list())
    check_top_options(k, unit, split)
    has_unit = unit in units if units is not None else not table.filter(pl.col("unit") == unit).is_empty()
    if unit == "word" and not has_unit:
        return "this run's model has no word units (its tokens carry no '##' marks to join); use --unit token"
    top = top_tokens(table, k, unit, split, layers, measure)

    if top.is_empty():
        if splits is not None and not splits:
            return (
                "no review of this run was scored (its inputs held no rows, or see the statuses in its "
                "predictions); nothing to print"
            )
        has_split = (
            split in splits if splits is not None else not table.filter(pl.col("split") == split).is_empty()
        )
        if split == "label" and not has_split:
            raise SpecError("--by label: this run has no input labels to split by (extract with --label-col)")
        return f"no {unit}s pass the filter for split {split!r}; lower --min-reviews"
    if measure in CONTRASTS and top[measure].is_null().all():
        classes = ", ".join(str(c) for c in top["class_label"].unique(maintain_order=True))
        return (
            f"{measure} compares a {split} with the others, and every scored review has {split} {classes}: "
            "nothing to contrast; rank by another measure (--rank-by mean_scaled)"
        )
    shown = readable_map(top["token"].to_list(), byte_level)
    blocks = []
    for (layer, cls), group in top.group_by(["layer", "class_label"], maintain_order=True):
        n = group["class_reviews"][0]
        who = "all reviews" if cls is None else f"{split} = {printable(str(cls), None)}"
        lines = [f"{layer_name(layer, num_layers)} · {who} ({n} reviews) · top {k} {unit}s, {measure}"]

        cells: dict[int, list[str]] = {}
        for row in group.iter_rows(named=True):
            cells.setdefault(row["head"], []).append(f"{shown[row['token']]} {_fmt(row[measure])}")
        width = max(_width(c) for cs in cells.values() for c in cs)
        lines.append("head  " + "  ".join(_pad(f"#{i}", width) for i in range(1, k + 1)).rstrip())
        for head in sorted(cells):
            lines.append(f"{head:>4}  " + "  ".join(_pad(c, width) for c in cells[head]).rstrip())
        blocks.append("\n".join(lines))
    blocks += _emptied(groups, split, unit, set(top["class_label"].to_list()))
    return "\n\n".join(blocks)


def _emptied(groups: pl.DataFrame | None, split: str, unit: str, shown: set) -> list[str]:
    """A line for each group of ``split`` that has scored reviews but no row left to print: without
    it a label whose reviews are too few for --min-reviews was left out without a word."""
    rows = [] if groups is None else groups.filter(pl.col("split") == split).iter_rows(named=True)
    return [
        f"{split} = {printable(str(g['class_label']), None)} ({g['class_reviews']} reviews): "
        f"no {unit}s pass the filter; lower --min-reviews"
        for g in rows
        if g["class_label"] not in shown
    ]


def _fmt(value: float) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _width(text: str) -> int:
    """Terminal columns: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int) -> str:
    return text + " " * max(0, width - _width(text))
