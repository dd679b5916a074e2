"""The reviews a report shows as pictures, chosen by stated rules (:data:`RULE`, :data:`MISTAKES`), and
their sections. A review whose label is one the model predicts and differs from its prediction is
misclassified; a label the model cannot predict marks none, as the accuracy leaves it out."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import polars as pl

from .figures import review_png
from .html import esc, img, muted
from .review import load_reviews

#: How the example reviews are chosen: the largest margins tie by the hundred where label smoothing caps
#: the probabilities (and pick reviews of ？？？ and ！！！), and the shortest reviews say nothing of what a
#: head reads.
RULE = (
    "reviews of a typical length (tokens between the 25th and 75th percentile of the run's), not "
    "misclassified (correctly predicted first), whose margin between the two most probable labels is "
    "nearest the median margin of their predicted label; ties by the length nearest the median"
)
#: How the misclassified reviews are chosen: the model's confident mistakes.
MISTAKES = (
    "misclassified reviews of a typical length, largest margin between the two most probable labels "
    "first; ties by the length nearest the median"
)


class Example(NamedTuple):
    doc_id: str
    pred_label: str
    label: str | None
    margin: float
    misclassified: bool  # the label is one the model predicts, and not the prediction


def _typical(preds: pl.DataFrame, labels: list[str]) -> pl.DataFrame:
    """Scored reviews of typical length with their margin (``labels``: the model's)."""
    ok = preds.filter(pl.col("status") == "ok")
    lo, mid, hi = (ok["n_tokens"].quantile(q, "nearest") for q in (0.25, 0.5, 0.75))
    top2 = pl.col("probs").list.sort(descending=True)
    return ok.filter(pl.col("n_tokens").is_between(lo, hi)).with_columns(
        margin=(top2.list.get(0) - top2.list.get(1, null_on_oob=True).fill_null(0.0)).cast(pl.Float64),
        off_median=(pl.col("n_tokens") - mid).abs(),
        misclassified=pl.col("label").is_in(labels).fill_null(False)
        & (pl.col("label") != pl.col("pred_label")),
    )


def _examples(rows: pl.DataFrame) -> list[Example]:
    return [Example(*r) for r in rows.select(*Example._fields).rows()]


def pick(preds: pl.DataFrame, per_label: int, labels: list[str]) -> list[Example]:
    """``per_label`` examples of each predicted label by :data:`RULE`, labels in order."""
    rows = _typical(preds, labels).filter(~pl.col("misclassified"))
    off = (pl.col("margin") - pl.col("margin").median().over("pred_label")).abs()
    unknown = (pl.col("label") != pl.col("pred_label")).fill_null(True)  # the label is not the model's
    ranked = rows.with_columns(off_typical=off, unknown=unknown)
    ranked = ranked.sort(["unknown", "off_typical", "off_median", "doc_id"])
    return _examples(ranked.group_by("pred_label", maintain_order=True).head(per_label).sort("pred_label"))


def misclassified(preds: pl.DataFrame, k: int, labels: list[str]) -> list[Example]:
    """The ``k`` misclassified reviews by :data:`MISTAKES`."""
    rows = _typical(preds, labels).filter(pl.col("misclassified"))
    ranked = rows.sort(["margin", "off_median", "doc_id"], descending=[True, False, False])
    return _examples(ranked.head(k))


def _none_why(preds: pl.DataFrame, labels: list[str], mistakes: bool) -> str:
    ok = preds.filter(pl.col("status") == "ok")
    if not mistakes:
        return "Every scored review of a typical length is misclassified."
    if ok["label"].is_null().all():
        return "The reviews have no labels: none can be called misclassified."
    if not ok["label"].is_in(labels).any():
        return "No review's label is one the model predicts (see Accuracy): none can be called misclassified."
    return "No review of a typical length is misclassified."


def examples_html(run: Path, preds: pl.DataFrame, layer: int, k: int, labels: list[str]) -> str:
    """``k`` reviews typical of each predicted label by :data:`RULE`, then ``k`` mistakes by
    :data:`MISTAKES` (``labels``: the model's); where a section has none, a sentence says why."""
    sections = {
        ("Example reviews", RULE): pick(preds, k, labels),
        ("Most confidently misclassified reviews", MISTAKES): misclassified(preds, k, labels),
    }
    chosen = [e for picks in sections.values() for e in picks]
    loaded = iter(load_reviews(run, [e.doc_id for e in chosen], layer) if chosen else [])
    parts = []
    for (title, rule), picks in sections.items():
        mistakes = rule is MISTAKES
        parts += [
            f"<h2>{title}</h2>",
            muted(f"Chosen as {esc(rule)}." if picks else esc(_none_why(preds, labels, mistakes))),
        ]
        label = None
        for example in picks:
            review = next(loaded)
            if not mistakes and example.pred_label != label:
                parts.append(f"<h3>Predicted {esc(example.pred_label)}</h3>")
                label = example.pred_label
            if example.label != review.label:  # a label the label map gives as the model's
                review.label = f"{review.label} → {example.label}"
            mark = " · misclassified" if example.misclassified else ""
            caption = f"{review.title()} · margin {example.margin:.3f}{mark}"
            alt = f"heads x tokens heatmap of {review.title()}"
            parts += [
                muted(esc(review.text)) if review.text else "",
                img(review_png(review, dpi=110), alt, caption),
            ]
    return "\n".join(parts)
