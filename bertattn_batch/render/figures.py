"""The pictures of one review: heads x tokens of the scaled [CLS] row (the seed's), and token x token
maps per head; as matplotlib figures, PNG bytes, or HTML."""

from __future__ import annotations

import contextlib
import io
import unicodedata
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..analysis.spelling import readable
from ..errors import SpecError
from . import fonts, page
from .review import ReviewAttention

#: Tokens per row of a heads x tokens figure; longer reviews wrap onto more rows.
TOKENS_PER_ROW = 64
#: Token x token maps get tick labels up to this many tokens.
PAIR_LABELS_UP_TO = 48


@contextlib.contextmanager
def drawing(texts: list[str] | str = "") -> Iterator[None]:
    """matplotlib's settings for figures made in this block, with fonts that draw ``texts`` (labels and
    titles to come); the user's own settings (a notebook's) are as they were after it."""
    import matplotlib

    # ids, labels and tokens are text: "$x$" is no formula
    with matplotlib.rc_context({"font.family": fonts.family(texts), "text.parse_math": False}):
        yield


def new_figure(**options: Any):
    """A figure that pyplot does not know of, drawn by Agg whatever the user's backend is (switching
    it stopped a notebook's plots from showing) and let go with its last reference."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(**options)
    FigureCanvasAgg(fig)
    return fig


def cls_figure(review: ReviewAttention, tokens_per_row: int = TOKENS_PER_ROW):
    """The seed's picture: heads x tokens, the scaled [CLS] row of each head; long reviews wrap.

    Laid out by hand in inches (cells, label bands, colour bar): matplotlib's automatic layouts
    measure every tick label several times, which dominates the cost of a long review.
    """
    labels = [fonts.label(t) for t in readable(review.tokens, review.byte_level)]
    title = fonts.label(review.title())
    with drawing([*labels, title]):
        n, heads = len(review.tokens), review.num_heads
        chunks = [(i, min(i + tokens_per_row, n)) for i in range(0, n, tokens_per_row)]
        cols = min(n, tokens_per_row)
        # drawn vertically; a CJK character stays upright
        long_labels = [t for t in labels if _columns(t) > 2]
        cell = 0.2  # inches per token column
        cell_h = 0.2  # inches per head row
        left, right, top, gap = 0.75, 1.05, 0.45, 0.12
        band = 0.12 + 0.075 * max(map(len, long_labels)) if long_labels else 0.3  # room for the token labels
        width = max(left + cols * cell + right, left + _inches(title, 10) + 0.2)
        block = heads * cell_h + band + gap
        height = top + block * len(chunks)
        fig = new_figure(figsize=(width, height))
        image = None
        for k, (lo, hi) in enumerate(chunks):
            y = height - top - k * block - heads * cell_h
            ax = fig.add_axes(((left) / width, y / height, cols * cell / width, heads * cell_h / height))
            image = ax.imshow(
                review.scaled[:, lo:hi],
                vmin=0,
                vmax=1,
                cmap=page.CMAP,
                aspect="auto",
                interpolation="nearest",
            )
            ax.set_xlim(-0.5, cols - 0.5)
            ax.set_xticks(range(hi - lo), labels[lo:hi], fontsize=8)
            turn_long_labels(ax)
            ax.set_yticks(range(heads), [f"head {h}" for h in range(heads)], fontsize=7)
            ax.tick_params(length=0, pad=2)
        bar = fig.add_axes(
            (
                (left + cols * cell + 0.15) / width,
                (height - top - heads * cell_h) / height,
                0.12 / width,
                heads * cell_h / height,
            )
        )
        # a bar of a few heads is shorter than "scaled weight": its label would run into the title
        fig.colorbar(image, cax=bar).set_label("scaled weight" if heads >= 6 else "scaled", fontsize=8)
        fig.text(left / width, 1 - 0.2 / height, title, fontsize=10, va="center")
        return fig


def cls_png(review: ReviewAttention, dpi: int = 110) -> bytes:
    """The heads x tokens picture as PNG bytes (its layout is exact: no second, tight pass)."""
    return page.png_bytes(cls_figure(review), dpi=dpi, tight=False)


def pairs_figure(review: ReviewAttention, columns: int = 4):
    """The second seed's picture: token x token attention of every head (rows: queries), every head on
    one colour scale with one colour bar, so that heads compare; laid out so no label meets a title."""
    if review.pairs is None or review.pair_tokens is None:
        raise SpecError("no token x token matrices: load the review with pairs (--pairs)")
    labels = [fonts.label(t) for t in readable(review.pair_tokens, review.byte_level)]
    title = fonts.label(review.title()) + " · token x token (row: query)"
    with drawing([*labels, title]):
        heads, size = review.pairs.shape[0], review.pairs.shape[1]
        columns = min(columns, heads)
        rows = -(-heads // columns)
        panel = max(3.2, 0.11 * size + 1.2) if size <= PAIR_LABELS_UP_TO else 3.0
        fig = new_figure(figsize=(panel * columns + 1.0, panel * rows + 0.8), layout="constrained")
        axes = fig.subplots(rows, columns, squeeze=False)
        vmax = float(review.pairs.max()) or 1.0
        image = None
        for h in range(rows * columns):
            ax = axes[h // columns, h % columns]
            if h >= heads:
                ax.axis("off")
                continue
            image = ax.imshow(review.pairs[h], vmin=0, vmax=vmax, cmap="viridis")
            ax.set_title(f"head {h}", fontsize=9)
            if size <= PAIR_LABELS_UP_TO:
                ax.set_xticks(range(size))
                ax.set_xticklabels(labels, fontsize=6)
                turn_long_labels(ax)
                ax.set_yticks(range(size))
                ax.set_yticklabels(labels, fontsize=6)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
            ax.tick_params(length=0)
        fig.colorbar(image, ax=axes.ravel().tolist(), label="attention weight (raw)", shrink=0.8)
        fig.suptitle(title, fontsize=10)
        return fig


def review_png(review: ReviewAttention, pairs: bool = False, dpi: int = 130) -> bytes:
    """The heads x tokens picture, with the token x token maps below it where ``pairs``: one PNG that
    shows what the HTML page shows."""
    top = cls_png(review, dpi=dpi)
    if not pairs:
        return top
    from PIL import Image

    bottom = page.png_bytes(pairs_figure(review), dpi=dpi)
    images = [Image.open(io.BytesIO(b)).convert("RGB") for b in (top, bottom)]
    out = Image.new("RGB", (max(i.width for i in images), sum(i.height for i in images)), "white")
    out.paste(images[0], (0, 0))
    out.paste(images[1], (0, images[0].height))
    buf = io.BytesIO()
    out.save(buf, format="PNG")
    return buf.getvalue()


def _inches(text: str, fontsize: float) -> float:
    """How wide ``text`` is drawn in the fonts set: measured, since its characters differ in width by
    more than twice (a CJK character, a U+XXXX code standing for one that no font here draws)."""
    scratch = new_figure()
    drawn = scratch.text(0, 0, text, fontsize=fontsize)
    return drawn.get_window_extent(renderer=scratch.canvas.get_renderer()).width / scratch.dpi


def _columns(text: str) -> int:
    """Width in character cells: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def turn_long_labels(ax) -> None:
    """Tick labels wider than one CJK character are drawn vertically; single characters stay upright."""
    for text in ax.get_xticklabels():
        if _columns(text.get_text()) > 2:
            text.set_rotation(90)


def cls_html(review: ReviewAttention) -> str:
    """The heads x tokens heatmap as an HTML table (real text; tooltips give both weights)."""
    tokens = readable(review.tokens, review.byte_level)
    tips = np.empty(review.scaled.shape, dtype=object)
    for h in range(review.num_heads):
        for j, tok in enumerate(tokens):
            tips[h, j] = (
                f"head {h} · {tok} · scaled {review.scaled[h, j]:.3f} · raw {review.weight[h, j]:.5f}"
            )
    return page.heat_table(review.scaled, tokens, [f"head {h}" for h in range(review.num_heads)], tips=tips)


def review_html(review: ReviewAttention, heading: bool = True) -> str:
    """A review's section: title, its text when known, the heatmap table, and token x token maps."""
    parts = [f"<h2>{page.esc(review.title())}</h2>"] if heading else []
    if review.text:
        parts.append(f'<p class="meta">{page.esc(review.text)}</p>')
    parts.append(cls_html(review))
    if review.pairs is not None:
        parts.append(
            page.img(
                page.png_bytes(pairs_figure(review)),
                alt=f"token x token attention of every head, review {review.doc_id}",
                caption="token x token attention per head (rows: queries; raw weights, one scale)",
            )
        )
    return "\n".join(parts)
