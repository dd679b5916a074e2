"""The report's "What to believe" section: each captured layer's heads ranked by faithfulness against
the random baseline, and what each measure means and where it stops."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from ..analysis.aggregate import top_tokens
from ..analysis.faithfulness import FRACTIONS, faithfulness_path
from ..analysis.spelling import readable_map
from ..run import Manifest, display_path, layer_name
from . import page

#: What each measure says and where it stops, in plain words (docs/measures.md has the references).
NOTES = (
    (
        "weight",
        "where the head's [CLS] query looks (the seed's view); a head can look hard at a token "
        "whose value it barely passes on.",
    ),
    (
        "weight_norm",
        "how much the token actually adds to the head's output (Kobayashi et al., 2020): "
        "weight times the length of its transformed value; still one layer, residual and feed-forward left out.",
    ),
    (
        "value_zeroing",
        "how far the layer's [CLS] output moves when the token's values are removed "
        "(Mohebbi et al., 2023); one layer at a time, the attention held fixed.",
    ),
    (
        "log-odds z",
        "what a head attends to more in one label than the others, rare tokens held back "
        "(Monroe et al., 2008); a difference in where it looks, not a cause.",
    ),
    (
        "comprehensiveness / sufficiency",
        "how much the predicted label's probability drops when the "
        "score's top tokens are deleted, and how much of it they keep alone (ERASER, DeYoung et al., "
        "2020); deleting tokens makes inputs the model never saw, so read them against random deletion.",
    ),
)


#: Random deletion's comprehensiveness below which no head's ratio to it is shown: a probability moved
#: by less than this is noise, and a ratio to it (16x, or negative) says nothing.
MIN_RANDOM = 0.01
#: Contrast tokens shown per head and predicted label.
CONTRAST_TOKENS = 3


def trust_html(run: Path, manifest: Manifest, aggregates: pl.DataFrame | None = None) -> str:
    """The section: the faithfulness table where ``bertattn faithfulness`` wrote one for this run, each
    head with what it attends to more in one predicted label than the others (from ``aggregates``),
    else the command that writes it; the notes in both cases."""
    parts = ["<h2>What to believe</h2>"]
    path = faithfulness_path(run)
    meta = (pq.read_schema(path).metadata or {}) if path.is_file() else None
    measured = meta.get(b"run_id", b"").decode() if meta is not None else None
    if measured == manifest.run_id:
        contrasts = (
            head_contrasts(aggregates, manifest.layers, manifest.byte_level) if aggregates is not None else {}
        )
        sampled = meta.get(b"parts")  # None: measured by a version that did not record it
        if sampled is not None and json.loads(sampled) != sorted(p.name for p in manifest.parts):
            parts.append(
                '<p class="meta">Measured before the run\'s latest parts were committed (an '
                "<code>--incremental</code> pass or a resume): its sample leaves their reviews out. Run "
                f"<code>bertattn faithfulness {page.esc(display_path(run))}</code> again to sample them all.</p>"
            )
        parts += _faithfulness_html(pl.read_parquet(path), manifest.num_layers, contrasts)
    elif measured is not None:
        parts.append(
            '<p class="meta">faithfulness/head_faithfulness.parquet was measured on an earlier run in this '
            f"folder: run <code>bertattn faithfulness {page.esc(display_path(run))}</code> again.</p>"
        )
    else:
        parts.append(
            f'<p class="meta">No faithfulness measured yet: <code>bertattn faithfulness {page.esc(display_path(run))}'
            "</code> ranks every head by how much deleting its top tokens moves the prediction.</p>"
        )
    parts.append(
        "<ul>" + "".join(f"<li><b>{page.esc(m)}</b>: {page.esc(t)}</li>" for m, t in NOTES) + "</ul>"
    )
    return "\n".join(parts)


def head_contrasts(
    aggregates: pl.DataFrame, layers: list[int], byte_level: bool | None = None
) -> dict[tuple[int, int], str]:
    """(layer, head) -> "negative: 差 不 太 · positive: 好 不错 很": each predicted label's tokens with the
    highest log-odds z-score against the other labels, as the aggregates rank them (and as a reader
    spells them: ``byte_level``, see :func:`spelling.readable`)."""
    top = top_tokens(aggregates, CONTRAST_TOKENS, "token", "pred_label", layers, measure="log_odds_z")
    top = top.filter(pl.col("log_odds_z").is_not_null())  # one predicted label: nothing to contrast
    shown = readable_map(top["token"].to_list(), byte_level)
    out: dict[tuple[int, int], list[str]] = {}
    for (layer, head, label), rows in top.group_by("layer", "head", "class_label", maintain_order=True):
        tokens = " ".join(shown[t] for t in rows.sort("rank")["token"])
        out.setdefault((layer, head), []).append(f"{label}: {tokens}")
    return {key: " · ".join(labels) for key, labels in out.items()}


def _faithfulness_html(
    table: pl.DataFrame, num_layers: int | None, contrasts: dict[tuple[int, int], str]
) -> list[str]:
    aopc = table.filter(pl.col("k").is_null())
    refs = aopc.filter(pl.col("layer").is_null())
    random = refs.filter(pl.col("score") == "random")
    base = random["comprehensiveness"][0] if random.height else None
    n = int(aopc["n_reviews"][0]) if aopc.height else 0
    ks = ", ".join(f"{k:.0%}" for k in FRACTIONS)
    out = [
        f'<p class="meta">From faithfulness/head_faithfulness.parquet: {n} reviews, the top {ks} of each '
        "review's tokens deleted (means over those shares). A head's ranking is worth reading where its "
        "comprehensiveness is well above random's and its sufficiency below.</p>"
    ]
    for (layer,), rows in aopc.filter(pl.col("layer").is_not_null()).group_by("layer", maintain_order=True):
        ranked = pl.concat([rows, refs]).sort("comprehensiveness", descending=True)
        body = [
            [
                r["score"],
                "" if r["head"] is None else r["head"],
                r["comprehensiveness"],
                f"{r['comprehensiveness'] / base:.1f}x" if base is not None and base >= MIN_RANDOM else "",
                r["sufficiency"],
                "" if r["head"] is None else contrasts.get((layer, r["head"]), ""),
            ]
            for r in ranked.iter_rows(named=True)
        ]
        out += [
            f"<h3>Heads of {page.esc(layer_name(layer, num_layers))}, most faithful first</h3>",
            page.data_table(
                [
                    "score",
                    "head",
                    "comprehensiveness",
                    "vs random",
                    "sufficiency",
                    "attends to more, by prediction",
                ],
                body,
                [False, True, True, True, True, False],
            ),
        ]
    return out
