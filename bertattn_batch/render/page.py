"""Self-contained HTML pieces: a page with inline CSS, heatmap tables, PNG figures as data URIs.

Usage::

    body = heat_table(values, columns=tokens, rows=["head 0", ...]) + figure_img(fig, "alt text")
    Path("page.html").write_text(page("Title", body), encoding="utf-8")

Nothing here loads from the network (no scripts, fonts or images from elsewhere): a page opens the
same offline, attached to a mail, or years later.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from html import escape

import numpy as np

from ..analysis.spelling import printable

CMAP = "Reds"

_CSS = """
body { font-family: "bertattn-cjk", system-ui, -apple-system, "Segoe UI", "Noto Sans", "Noto Sans CJK SC",
       "WenQuanYi Micro Hei", sans-serif; margin: 1.5em; color: #222; max-width: 100%; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; } h3 { font-size: 1em; }
table { border-collapse: collapse; margin: .4em 0 1em; font-size: .85em; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; max-width: 24em; overflow-wrap: anywhere; }
th { background: #f4f4f4; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; max-width: 100%; }
table.heat td { width: 1.1em; height: 1.1em; padding: 0; border: 1px solid #fff; }
table.heat th.tok { writing-mode: vertical-rl; font-weight: normal; background: none;
                    border: none; padding: 2px 0; white-space: nowrap; font-size: .9em; }
table.heat th.row { background: none; border: none; white-space: nowrap; }
.meta { color: #555; font-size: .9em; }
img.fig { max-width: 100%; height: auto; border: 1px solid #eee; }
figure { margin: .5em 0 1.5em; } figcaption { color: #555; font-size: .9em; }
"""


def page(title: str, body: str) -> str:
    """A complete HTML document around ``body`` (already escaped HTML).

    CJK characters in it bring a subset of the CJK font along (see ``fonts.font_face_css``).
    """
    from . import fonts

    face = fonts.font_face_css(title + body)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{face}{_CSS}</style>\n</head>\n"
        f"<body>\n<h1>{esc(title)}</h1>\n{body}\n</body>\n</html>\n"
    )


def colors(values: np.ndarray, vmin: float = 0.0, vmax: float = 1.0) -> np.ndarray:
    """Hex colours of ``values`` under a matplotlib colour map; NaN becomes white."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    span = vmax - vmin or 1.0
    norm = np.clip((np.asarray(values, dtype=np.float64) - vmin) / span, 0, 1)
    cm = colormaps[CMAP]
    out = np.empty(norm.shape, dtype=object)
    for idx, v in np.ndenumerate(norm):
        out[idx] = "#ffffff" if np.isnan(v) else to_hex(cm(v))
    return out


def heat_table(
    values: np.ndarray,
    columns: Sequence[str],
    rows: Sequence[str],
    tips: np.ndarray | None = None,
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> str:
    """A heatmap as an HTML table: one coloured cell per value, column labels written vertically.

    Real text, so any script the browser has a font for (CJK included) reads right; ``tips`` (same
    shape as ``values``) become each cell's tooltip.
    """
    hexes = colors(values, vmin, vmax)
    head = "".join(f'<th class="tok">{esc(c)}</th>' for c in columns)
    lines = [f'<div class="scroll"><table class="heat"><tr><th></th>{head}</tr>']
    for i, name in enumerate(rows):
        cells = "".join(
            f'<td style="background:{hexes[i, j]}"'
            + (f' title="{esc(tips[i, j])}"' if tips is not None else "")
            + "></td>"
            for j in range(values.shape[1])
        )
        lines.append(f'<tr><th class="row">{esc(name)}</th>{cells}</tr>')
    lines.append("</table></div>")
    return "\n".join(lines)


def esc(value: object) -> str:
    """Text for a page: HTML-escaped, its control characters shown as escapes (a label holding an ESC
    or a line break, a token a NUL; see ``spelling.printable``)."""
    return escape(printable(str(value), None))


def data_table(header: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[bool] = ()) -> str:
    """A plain HTML table; cells escaped, floats written with 3 decimals."""
    num = list(numeric) + [False] * (len(header) - len(numeric))
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = []
        for value, is_num in zip(row, num, strict=False):
            text = f"{value:.3f}" if isinstance(value, float) else ("" if value is None else str(value))
            cls = ' class="num"' if is_num else ""
            cells.append(f"<td{cls}>{esc(text)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def png_bytes(fig, dpi: int = 110, tight: bool = True) -> bytes:
    """A matplotlib figure as PNG bytes. ``tight=False`` for figures laid out by hand (a tight box
    measures every text again)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    return buf.getvalue()


def img(png: bytes, alt: str, caption: str = "") -> str:
    """A PNG embedded as a data URI, inside a figure with an optional caption."""
    src = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    return f'<figure><img class="fig" src="{src}" alt="{esc(alt)}">{cap}</figure>'
