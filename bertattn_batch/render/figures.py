"""matplotlib figures, heads x tokens heatmaps among them, each drawn by Agg and unknown to pyplot, the
user's matplotlib settings as they were after it; and PNG bytes of them."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import polars as pl

from ..analysis.spelling import columns, readable
from . import fonts

CMAP = "Reds"
#: Tokens per row of a heads x tokens heatmap at most; more wrap onto rows of even length.
TOKENS_PER_ROW = 64
#: Token columns of the top tokens heatmap at most: past it, each head's top k shrinks until they fit.
HEATMAP_TOKENS = 256


@contextlib.contextmanager
def drawing(texts: list[str] | str = "") -> Iterator[None]:
    """matplotlib settings for the figures made in this block, with fonts that draw ``texts``."""
    import matplotlib

    # ids, labels and tokens are text: "$x$" is no formula
    with matplotlib.rc_context({"font.family": fonts.family(texts), "text.parse_math": False}):
        yield


def new_figure(**options: Any):
    """A figure drawn by Agg, unknown to pyplot (a notebook's own figures are left alone)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**options)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig, dpi: int = 110, tight: bool = True) -> bytes:
    """A figure as PNG; ``tight=False`` for figures laid out by hand (a tight box measures every text)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    return buf.getvalue()


def turn_long_labels(ax) -> None:
    """x tick labels wider than one CJK character are drawn vertically; single characters stay upright."""
    for text in ax.get_xticklabels():
        if columns(text.get_text()) > 2:
            text.set_rotation(90)


def spans(n: int, most: int) -> list[range]:
    """``range(n)`` cut into the fewest runs of at most ``most``, of even length (70, 64 -> 35 + 35)."""
    size = -(-n // -(-n // most)) if n else 1
    return [range(lo, min(lo + size, n)) for lo in range(0, n, size)]


def heatmap(values: np.ndarray, tokens: list[str], heads: list[int], title: str):
    """Heads x tokens, scaled weights on 0..1 (NaN blank), wrapped onto even rows of ``TOKENS_PER_ROW`` at
    most; laid out by hand, as matplotlib's layouts measure every tick label several times."""
    labels, title = [fonts.label(t) for t in tokens], fonts.label(title)
    with drawing([*labels, title]):
        rows, heads = [f"head {h}" for h in heads], len(heads)
        chunks = spans(len(labels), TOKENS_PER_ROW)
        cols = len(chunks[0])
        long_labels = [len(t) for t in labels if columns(t) > 2]  # drawn vertically
        cell, left, right, top, gap = 0.2, 0.75, 1.05, 0.45, 0.12  # inches
        band = 0.12 + 0.075 * max(long_labels) if long_labels else 0.3  # room for the token labels
        scratch = new_figure()  # the title as drawn: characters differ in width
        drawn = scratch.text(0, 0, title, fontsize=10).get_window_extent(scratch.canvas.get_renderer())
        width = max(left + cols * cell + right, left + drawn.width / scratch.dpi + 0.2)
        block = heads * cell + band + gap
        height = top + block * len(chunks)
        fig = new_figure(figsize=(width, height))
        for k, chunk in enumerate(chunks):
            y = height - top - k * block - heads * cell
            ax = fig.add_axes((left / width, y / height, cols * cell / width, heads * cell / height))
            shown = np.ma.masked_invalid(values[:, chunk.start : chunk.stop])  # (rows, <= cols)
            image = ax.imshow(shown, vmin=0, vmax=1, cmap=CMAP, aspect="auto", interpolation="nearest")
            ax.set_xlim(-0.5, cols - 0.5)
            ax.set_xticks(range(shown.shape[1]), labels[chunk.start : chunk.stop], fontsize=8)
            turn_long_labels(ax)
            ax.set_yticks(range(heads), rows, fontsize=7)
            ax.tick_params(length=0, pad=2)
        y = (height - top - heads * cell) / height
        cax = fig.add_axes(((left + cols * cell + 0.15) / width, y, 0.12 / width, heads * cell / height))
        # a bar of a few heads is shorter than its label would be: it would run into the title
        fig.colorbar(image, cax=cax).set_label("scaled weight" if heads >= 6 else "scaled", fontsize=8)
        fig.text(left / width, 1 - 0.2 / height, title, fontsize=10, va="center")
        return fig


def top_heatmap(table: pl.DataFrame, layer: int, k: int, unit: str = "token", byte_level: bool | None = None):
    """Heads x the union of every head's top k tokens (aggregates' mean scaled weight over all reviews);
    where that union passes ``HEATMAP_TOKENS``, the largest k' < k whose union fits."""
    rows = table.filter((pl.col("unit") == unit) & (pl.col("split") == "all") & (pl.col("layer") == layer))
    top = rows.filter(pl.col("rank") <= k).sort(["head", "rank"])
    first_rank = top.group_by("token").agg(pl.col("rank").min())["rank"].sort()  # where each joins the union
    if len(first_rank) > HEATMAP_TOKENS:
        k = max(int(first_rank[HEATMAP_TOKENS]) - 1, 1)
        top = top.filter(pl.col("rank") <= k)
    tokens = list(dict.fromkeys(top["token"].to_list()))[:HEATMAP_TOKENS]  # k = 1 alone may pass it
    heads = sorted(rows["head"].unique().to_list())
    cells = rows.filter(pl.col("token").is_in(tokens)).select("head", "token", "mean_scaled").rows()
    lookup = {(h, t): v for h, t, v in cells}
    values = np.array([[lookup.get((h, t), np.nan) for t in tokens] for h in heads], dtype=float)  # (H, n)
    title = f"layer {layer}: mean scaled [CLS] weight of each head's top {k} {unit}s"
    return heatmap(values, readable(tokens, byte_level), heads, title)
