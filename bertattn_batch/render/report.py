"""One self-contained HTML page about a run: what it did, which tokens each head attends to, examples.

Usage::

    bertattn report runs/r1                      # writes runs/r1/report.html
    bertattn report runs/r1 --out r1.html --examples 3 --top-k 8

    from bertattn_batch import build_report
    build_report("runs/r1")

The page holds the run's counts and throughput, accuracy and a confusion matrix where the source had
labels, the top tokens per head (a table and a heatmap, from ``aggregate``; recomputed when the run
has changed since), and the heads x tokens heatmaps of the most confident reviews of each predicted
label. Figures are PNG data URIs and the styles are inline: the file opens without a network.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from .._util import atomic_path, writing
from ..analysis import aggregate as agg
from ..analysis.aggregate import top_tokens
from ..analysis.spelling import readable, readable_map
from ..errors import SpecError, WriteError
from ..run import (
    REPORT_NAME,
    Manifest,
    committed_files,
    display_path,
    layer_name,
    on_local_copy,
    part_rows,
    read_manifest,
    status_now,
)
from . import fonts, page
from .accuracy import accuracy_html
from .examples import examples_html, misclassified, pick
from .figures import TOKENS_PER_ROW, drawing, new_figure, turn_long_labels
from .review import run_layer
from .trust import trust_html


def _committed_predictions(run: Path) -> pl.DataFrame:
    """Every committed prediction row, whatever its status (the report counts statuses too)."""
    files = [p.files["predictions"] for p in committed_files(run, ("predictions",), verify=True)]
    if not files:
        return pl.DataFrame()
    return (
        pl.scan_parquet(files, glob=False)
        .select("doc_id", "status", "label", "pred_id", "pred_label", "probs", "n_tokens", "truncated")
        .collect(engine="streaming")
    )


def _any_scored(preds: pl.DataFrame) -> bool:
    return not preds.is_empty() and not preds.filter(pl.col("status") == "ok").is_empty()


def status_counts(preds: pl.DataFrame) -> list[tuple[str, int]]:
    if preds.is_empty():
        return []
    return preds.group_by("status").len().sort(["len", "status"], descending=[True, False]).rows()


def _summary_html(manifest: Manifest, preds: pl.DataFrame) -> str:
    model = manifest.model
    last = manifest.last_run or {}
    spec = manifest.spec
    rows = [
        ("status", manifest.status),
        ("inputs", ", ".join(str(i) for i in spec.get("inputs", []))),
        (
            "model",
            f"{model.get('source')} ({model.get('model_type')}, {model.get('num_layers')} layers x "
            f"{model.get('num_heads')} heads)",
        ),
        ("layers stored (0-based)", ", ".join(str(x) for x in model.get("layers", []))),
        (
            "device, dtype, attention",
            f"{model.get('device')}, {model.get('dtype')}, {model.get('attention')}",
        ),
        *_whole_run_rows(preds),
        *((f"{k} (last run that read reviews)", v) for k, v in _last_run_rows(last)),
        ("parts committed", len(manifest.parts)),
        # as the run counted them when it completed, else (running, or stopped) as its parts hold them
        (
            "rows per table",
            ", ".join(f"{k} {v}" for k, v in (manifest.counts or part_rows(manifest)).items()),
        ),
        ("created", manifest.created_at),
    ]
    parts = ["<h2>Run</h2>", page.data_table(["", ""], [(k, v) for k, v in rows if v is not None])]
    statuses = status_counts(preds)
    if statuses:
        parts += [
            "<h3>Reviews by status</h3>",
            page.data_table(["status", "reviews"], statuses, [False, True]),
        ]
    by_pred = [] if preds.is_empty() else (
        preds.filter(pl.col("status") == "ok").group_by("pred_label").len().sort("pred_label").rows()
    )  # fmt: skip
    if by_pred:  # no table of none where no review was scored
        parts += [
            "<h3>Predicted labels</h3>",
            page.data_table(["predicted", "reviews"], by_pred, [False, True]),
        ]
    return "\n".join(parts)


def _whole_run_rows(preds: pl.DataFrame) -> list[tuple[str, Any]]:
    """What every committed part holds, over all passes and resumes."""
    if preds.is_empty():
        return []
    ok = preds.filter(pl.col("status") == "ok")
    return [
        ("prediction rows", preds.height),  # an unreadable row or null id is recorded again each pass
        ("reviews scored", ok.height),
        ("tokens", int(ok["n_tokens"].sum())),
        ("truncated reviews", int(ok["truncated"].sum())),
    ]


def _last_run_rows(last: dict[str, Any]) -> list[tuple[str, Any]]:
    """What the job's last run did (a resume or an ``--incremental`` pass reads only part of the run):
    its speed belongs to it alone."""
    if not last:
        return []
    seconds = last.get("seconds", {})
    return [
        ("ended", last.get("ended_at")),
        ("reviews read", last.get("input_rows")),
        ("padding share", f"{last.get('padding_share', 0):.1%}"),
        ("throughput", f"{last.get('reviews_per_s', 0):.1f} reviews/s"),
        ("wall time", f"{seconds.get('wall', 0):.1f} s (model {seconds.get('model', 0):.1f} s)"),
    ]


def _top_table_html(top: pl.DataFrame, measure: str = "mean_scaled", byte_level: bool | None = None) -> str:
    shown = readable_map(top["token"].to_list(), byte_level)
    cells: dict[int, list[str]] = {}
    for row in top.iter_rows(named=True):
        cells.setdefault(row["head"], []).append(f"{shown[row['token']]} ({row[measure]:.2f})")
    width = max(map(len, cells.values()))  # the longest list, not k: few tokens may pass the filter
    rows = [[h, *cells[h], *[""] * (width - len(cells[h]))] for h in sorted(cells)]
    return page.data_table(["head", *(f"#{i}" for i in range(1, width + 1))], rows, [True])


#: Token columns of the heads x top tokens picture at most (rows of figures.TOKENS_PER_ROW): past it,
#: each head's top k shrinks until the union fits, so that the labels stay readable on the page.
HEATMAP_TOKENS = 256


def top_heatmap(table: pl.DataFrame, layer: int, k: int, unit: str = "token", byte_level: bool | None = None):
    """Heads x (the union of every head's top k tokens): mean scaled weight, all reviews, in rows of
    ``TOKENS_PER_ROW`` tokens; where that union passes ``HEATMAP_TOKENS``, every head's top k' < k.
    ``byte_level``: the run's tokenizer spells bytes (see :func:`spelling.readable`)."""
    rows = table.filter((pl.col("unit") == unit) & (pl.col("split") == "all") & (pl.col("layer") == layer))
    top = rows.filter(pl.col("rank") <= k).sort(["head", "rank"])
    first_rank = top.group_by("token").agg(pl.col("rank").min())["rank"].sort()  # where each joins the union
    if len(first_rank) > HEATMAP_TOKENS:
        k = max(int(first_rank[HEATMAP_TOKENS]) - 1, 1)  # the largest k whose union fits
        top = top.filter(pl.col("rank") <= k)
    tokens = list(dict.fromkeys(top["token"].to_list()))[:HEATMAP_TOKENS]  # (k = 1 alone may pass it)
    labels = [fonts.label(t) for t in readable(tokens, byte_level)]
    with drawing(labels):
        heads = sorted(rows["head"].unique().to_list())
        values = np.full((len(heads), len(tokens)), np.nan)
        lookup = {
            (h, t): v
            for h, t, v in rows.filter(pl.col("token").is_in(tokens))
            .select("head", "token", "mean_scaled")
            .rows()
        }
        for i, h in enumerate(heads):
            for j, t in enumerate(tokens):
                values[i, j] = lookup.get((h, t), np.nan)
        cols = min(len(tokens), TOKENS_PER_ROW)
        chunks = range(0, len(tokens), TOKENS_PER_ROW)
        size = (max(5.0, 0.24 * cols + 2.2), (0.3 * len(heads) + 1.2) * len(chunks) + 0.4)
        fig = new_figure(figsize=size, layout="constrained")
        axes = fig.subplots(len(chunks), 1, squeeze=False)
        for ax, lo in zip(axes[:, 0], chunks, strict=True):
            image = ax.imshow(
                np.ma.masked_invalid(values[:, lo : lo + cols]), vmin=0, vmax=1, cmap=page.CMAP, aspect="auto"
            )
            ax.set_xlim(-0.5, cols - 0.5)
            ax.set_xticks(range(len(labels[lo : lo + cols])))
            ax.set_xticklabels(labels[lo : lo + cols], fontsize=8)
            turn_long_labels(ax)
            ax.set_yticks(range(len(heads)))
            ax.set_yticklabels([f"head {h}" for h in heads], fontsize=8)
            ax.tick_params(length=0)
        axes[0, 0].set_title(
            f"layer {layer}: mean scaled [CLS] weight of each head's top {k} {unit}s", fontsize=10
        )
        fig.colorbar(image, ax=axes[:, 0].tolist(), fraction=0.02, pad=0.01)
        return fig


def _tokens_html(
    table: pl.DataFrame,
    meta: dict[str, Any],
    layer: int,
    k: int,
    scored: bool = True,
    byte_level: bool | None = None,
    num_layers: int | None = None,
) -> str:
    """``scored``: some review was scored, so an empty table means the min-reviews filter emptied it.
    A table ranked by a contrast between labels, which all reviews together do not have, is shown ranked
    by mean scaled weight over all reviews."""
    opts = meta.get("options", {})
    rank_by = str(opts.get("rank_by"))
    if rank_by in agg.CONTRASTS:
        table, rank_by = agg.ranked(table, agg.RANK_BY), f"{agg.RANK_BY} ({rank_by} compares labels)"
    parts = [
        f"<h2>Top tokens per head · {layer_name(layer, num_layers)}</h2>",
        f'<p class="meta">From {agg.AGGREGATES_DIR}/{agg.TABLE}.parquet: tokens seen in at '
        f"least {opts.get('min_reviews')} reviews, ranked by {page.esc(rank_by)}; "
        "cells give the token and its mean scaled weight.</p>",
    ]
    for unit in opts.get("units", ["token"]):
        top = top_tokens(table, k, unit, "all", [layer])
        if top.is_empty():
            why = "passes the filter" if scored else "was counted: no review of this run was scored"
            parts.append(f'<p class="meta">No {unit} {why}.</p>')
            continue
        parts += [f"<h3>{unit.capitalize()}s, all reviews</h3>", _top_table_html(top, byte_level=byte_level)]
        if unit == "token":
            parts.append(
                page.img(
                    page.png_bytes(top_heatmap(table, layer, k, unit, byte_level)),
                    alt=f"heatmap of the top {unit}s per head",
                    caption=f"Heads x top {unit}s: mean scaled weight over all reviews",
                )
            )
    by_pred = top_tokens(table, k, "token", "pred_label", [layer], measure="log_odds_z")
    if not by_pred.is_empty() and by_pred["log_odds_z"].is_null().all():  # one predicted label
        label = page.esc(by_pred["class_label"][0])
        parts.append(f'<p class="meta">Every scored review is predicted {label}: no label to contrast.</p>')
        by_pred = by_pred.clear()
    if not by_pred.is_empty():
        parts.append(
            "<h3>What each head attends to more in one predicted label than in the others</h3>"
            '<p class="meta">Cells give the token and its z-score: the log-odds of the head\'s attention '
            "mass on it in this label against the others, with the run's own totals as an informative "
            "Dirichlet prior (Monroe, Colaresi &amp; Quinn 2008). A large z needs both a large ratio and "
            "much attention mass, so a token seen in a few reviews cannot top it by chance. It says where "
            "the head looks differently, not that the token moves the prediction.</p>"
        )
    for cls, group in by_pred.group_by("class_label", maintain_order=True):
        parts += [
            f"<h3>Tokens, reviews predicted {page.esc(cls[0])} ({group['class_reviews'][0]})</h3>",
            _top_table_html(group, "log_odds_z", byte_level),
        ]
    return "\n".join(parts)


@on_local_copy(write_back=True)
def build_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    layer: int | None = None,
    examples: int = 3,
    top_k: int = 8,
    min_reviews: int | None = None,
) -> Path:
    """Write the run's report page; aggregates are (re)computed first when missing or out of date.

    ``min_reviews`` None keeps the aggregates' own (5 where there are none yet); aggregates computed
    again keep their ``rank_by`` and units, so a report never swaps the table a user made for another.
    """
    t0 = time.perf_counter()
    if examples < 0 or top_k < 1:
        raise SpecError(
            f"--examples must not be negative and --top-k must be at least 1; got {examples}, {top_k}"
        )
    if out is not None and Path(out).suffix.lower() not in (".html", ".htm"):
        raise SpecError(f"the report is an HTML page; name it .html, not {Path(out).name}")
    run = Path(run_dir)
    manifest = read_manifest(run)
    manifest.status = status_now(run, manifest.status)  # as the page says it
    idx = run_layer(manifest, layer)
    made = agg.aggregates_meta(run).get("options", {}) if agg.aggregates_path(run).is_file() else {}
    min_reviews = min_reviews if min_reviews is not None else made.get("min_reviews", agg.MIN_REVIEWS)
    if agg.is_current(run, min_reviews):
        table, meta = agg.read_aggregates(run)
    else:
        options = dict(
            min_reviews=min_reviews,
            rank_by=made.get("rank_by", agg.RANK_BY),
            units=made.get("units", agg.UNITS),
        )
        try:
            result = agg.aggregate(run, **options)
        except WriteError:  # a run this process cannot write to: the report alone is written
            with tempfile.TemporaryDirectory(prefix="bertattn-aggregates-") as scratch:
                result = agg.aggregate(run, **options, into=scratch)
        table, meta = result.table, {"options": result.options, "parts": result.parts}
    preds = _committed_predictions(run)
    labelled = bool(manifest.spec.get("label_col")) or (
        not preds.is_empty() and preds["label"].is_not_null().any()
    )
    shown = not preds.is_empty() and examples
    body = [
        _summary_html(manifest, preds),
        accuracy_html(manifest, preds, labelled),
        _tokens_html(table, meta, idx, top_k, _any_scored(preds), manifest.byte_level, manifest.num_layers),
        trust_html(run, manifest, table),
        examples_html(run, pick(preds, examples, manifest.labels), idx, "Example reviews") if shown else "",
        examples_html(
            run,
            misclassified(preds, examples, manifest.labels),
            idx,
            "Most confidently misclassified reviews",
            False,
        )
        if shown
        else "",
        f'<p class="meta">Written {time.strftime("%Y-%m-%d %H:%M")} by bertattn report in '
        f"{time.perf_counter() - t0:.1f}s.</p>",
    ]
    path = Path(out) if out is not None else run / REPORT_NAME
    with writing(path), atomic_path(path, unique=True) as tmp:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(
            page.page(
                f"bertattn run: {display_path(run.resolve()).rstrip('/').rsplit('/', 1)[-1]}", "\n".join(body)
            ),
            encoding="utf-8",
        )
    return path
