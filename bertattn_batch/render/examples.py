"""The reviews a report shows as pictures, chosen by one stated rule, and their section of the page.

The rule (:data:`RULE`): among scored reviews of a typical length (their token counts between the
25th and 75th percentile of the run's), those with the largest margin between the two most probable
labels; ties go to the length nearest the median, then the doc id. Why: probabilities that label
smoothing caps tie by the hundred, and the shortest reviews (two characters) say nothing of what a
head reads. A review whose label is one the model predicts and differs from its prediction is marked,
and the most confidently misclassified reviews get a section of their own; a label the model cannot
predict (0/1 against negative/positive, or 'neutral') is left out, as the accuracy leaves it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from . import page
from .figures import cls_png
from .review import load_reviews

RULE = (
    "reviews of a typical length (tokens between the 25th and 75th percentile of the run's), largest "
    "margin between the two most probable labels first; ties by the length nearest the median"
)


@dataclass(frozen=True)
class Example:
    doc_id: str
    pred_label: str
    label: str | None
    margin: float
    misclassified: bool  # the label is one the model predicts, and not the prediction


def _ranked(preds: pl.DataFrame, labels: list[str]) -> pl.DataFrame:
    """Scored reviews of typical length with their margin and whether they are misclassified, in the
    rule's order."""
    ok = preds.filter(pl.col("status") == "ok")
    if ok.is_empty():
        return ok
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
    return [
        Example(*r) for r in rows.select("doc_id", "pred_label", "label", "margin", "misclassified").rows()
    ]


def pick(preds: pl.DataFrame, per_label: int, labels: list[str]) -> list[Example]:
    """The ``per_label`` examples of each predicted label, by :data:`RULE` (``labels``: the model's)."""
    ranked = _ranked(preds, labels)
    if ranked.is_empty() or per_label < 1:
        return []
    top = (
        ranked.group_by("pred_label", maintain_order=True)
        .head(per_label)
        .sort("pred_label", maintain_order=True)
    )
    return _examples(top)


def misclassified(preds: pl.DataFrame, k: int, labels: list[str]) -> list[Example]:
    """The ``k`` most confidently misclassified reviews (``labels``: the model's)."""
    ranked = _ranked(preds, labels)
    if ranked.is_empty() or k < 1:
        return []
    return _examples(ranked.filter(pl.col("misclassified")).head(k))


def examples_html(run: Path, picks: list[Example], layer: int, title: str, by_label: bool = True) -> str:
    if not picks:
        return ""
    reviews = load_reviews(run, [e.doc_id for e in picks], layer)
    parts = [f"<h2>{page.esc(title)}</h2>", f'<p class="meta">Chosen as {page.esc(RULE)}.</p>']
    label = None
    for review, example in zip(reviews, picks, strict=True):
        if by_label and example.pred_label != label:
            parts.append(f"<h3>Predicted {page.esc(example.pred_label)}</h3>")
            label = example.pred_label
        mark = " · misclassified" if example.misclassified else ""
        parts.append(
            page.img(
                cls_png(review),
                alt=f"heads x tokens heatmap of {review.title()}",
                caption=f"{review.title()} · margin {example.margin:.3f}{mark}",
            )
        )
    return "\n".join(parts)
