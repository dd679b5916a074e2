"""The reviews where one head attends most to one token or word: ``bertattn reviews``, ``top_reviews``.
Ranked by the raw weight (a word's: the sum of its tokens'), the largest of the review's occurrences:
the scaled weight ties at 1.0 wherever the token is the review's top one, and cannot rank.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import polars as pl

from ..errors import SpecError
from ..run import display_path, layer_name, on_local_copy, read_manifest
from .aggregate import KEY, committed_parts, review_rows, run_layer
from .spelling import printable
from .words import run_words

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
    'word') at ``head`` of ``layer`` (default: the run's first) is highest, with their predictions and
    texts (:data:`COLUMNS`)."""
    manifest = read_manifest(run_dir)
    idx = run_layer(manifest, layer)
    heads = int(manifest.model.get("num_heads", 0))
    if not 0 <= head < heads:
        raise SpecError(f"--head {head}: the model's heads are 0 to {heads - 1}")
    if n < 1:
        raise SpecError(f"--top must be at least 1; got {n}")
    mode, user_dict = run_words(manifest, words, user_dict) if unit == "word" else ("", None)
    if mode is None:
        raise SpecError("this run has no words (--words none); ask for a --token")
    term = term.lower() if unit == "word" else term  # word texts are lower-cased
    found = []
    for part in committed_parts(run_dir):
        rows = review_rows(part, extra=("text", "pred_prob"))
        rows.rows = rows.rows.filter((pl.col("layer") == idx) & (pl.col("head") == head))
        if unit == "word":  # only the reviews whose text holds it are segmented
            rows = rows.only(pl.col("text").str.to_lowercase().str.contains(term, literal=True))
        hits = (rows.words(mode, user_dict) if unit == "word" else rows.rows).filter(pl.col("token") == term)
        best = hits.sort("weight", "position", descending=[True, False]).group_by(KEY).first()
        best = best.select(KEY, "layer", "head", "weight", "weight_scaled", "position")
        found.append(best.join(rows.reviews.lazy(), on=KEY))
    top = pl.concat(found).sort(["weight", "doc_id"], descending=[True, False]).head(n).collect()
    return top.with_row_index("rank", offset=1).select(COLUMNS)


def format_reviews(
    top: pl.DataFrame, run_dir: str | Path, term: str, unit: str, num_layers: int | None
) -> str:
    """Each review: its rank, weights, prediction and text, and the ``bertattn plot`` command that draws
    it."""
    if top.is_empty():
        return f"no scored review holds the {unit} {term!r} (spelled as the run's {unit}s are)"
    layer = top["layer"][0]
    where = f"head {top['head'][0]} of {layer_name(layer, num_layers)}"
    lines = [f"the {top.height} reviews where {where} attends most to the {unit} {term!r}, by raw weight"]
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
            f"--out {shlex.quote(r['doc_id'])}.png",
        ]
    return "\n".join(lines)
