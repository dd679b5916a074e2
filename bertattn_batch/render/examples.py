"""The reviews a report shows as pictures, chosen by one stated rule (:data:`RULE`), and their section.
A review whose label is one the model predicts and differs from its prediction is marked misclassified;
a label the model cannot predict marks none, as the accuracy leaves it out."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import polars as pl

from .figures import review_png
from .html import esc, img, muted
from .review import load_reviews

#: How the example reviews are chosen. Probabilities that label smoothing caps tie by the hundred, and
#: the shortest reviews say nothing of what a head reads.
RULE = (
    "reviews of a typical length (tokens between the 25th and 75th percentile of the run's), largest "
    "margin between the two most probable labels first; ties by the length nearest the median"
)


class Example(NamedTuple):
    doc_id: str
    pred_label: str
    label: str | None
    margin: float
    misclassified: bool  # the label is one the model predicts, and not the prediction


def _ranked(preds: pl.DataFrame, labels: list[str]) -> pl.DataFrame:
    """Scored reviews of typical length in the order of :data:`RULE` (``labels``: the model's)."""
    ok = preds.filter(pl.col("status") == "ok")
    if ok.is_empty():
        return ok.with_columns(margin=pl.lit(0.0), misclassified=pl.lit(False))
    lo, mid, hi = (ok["n_tokens"].quantile(q, "nearest") for q in (0.25, 0.5, 0.75))
    top2 = pl.col("probs").list.sort(descending=True)
    return (
        ok.filter(pl.col("n_tokens").is_between(lo, hi))
        .with_columns(
            margin=(top2.list.get(0) - top2.list.get(1, null_on_oob=True).fill_null(0.0)).cast(pl.Float64),
            off_median=(pl.col("n_tokens") - mid).abs(),
            misclassified=pl.col("label").is_in(labels).fill_null(False)
            & (pl.col("label") != pl.col("pred_label")),
        )
        .sort(["margin", "off_median", "doc_id"], descending=[True, False, False])
    )


def _examples(rows: pl.DataFrame) -> list[Example]:
    return [Example(*r) for r in rows.select(*Example._fields).rows()]


def pick(preds: pl.DataFrame, per_label: int, labels: list[str]) -> list[Example]:
    """The first ``per_label`` examples of each predicted label by :data:`RULE`, labels in order."""
    ranked = _ranked(preds, labels).group_by("pred_label", maintain_order=True).head(per_label)
    return _examples(ranked.sort("pred_label", maintain_order=True))


def misclassified(preds: pl.DataFrame, k: int, labels: list[str]) -> list[Example]:
    """The ``k`` most confidently misclassified reviews."""
    return _examples(_ranked(preds, labels).filter(pl.col("misclassified")).head(k))


def examples_html(run: Path, picks: list[Example], layer: int, title: str, by_label: bool = True) -> str:
    if not picks:
        return ""
    parts = [f"<h2>{esc(title)}</h2>", muted(f"Chosen as {esc(RULE)}.")]
    label = None
    for review, example in zip(load_reviews(run, [e.doc_id for e in picks], layer), picks, strict=True):
        if by_label and example.pred_label != label:
            parts.append(f"<h3>Predicted {esc(example.pred_label)}</h3>")
            label = example.pred_label
        mark = " · misclassified" if example.misclassified else ""
        caption = f"{review.title()} · margin {example.margin:.3f}{mark}"
        parts.append(
            img(
                review_png(review, dpi=110),
                alt=f"heads x tokens heatmap of {review.title()}",
                caption=caption,
            )
        )
    return "\n".join(parts)
