"""Self-contained HTML (inline CSS, tables, PNGs as data URIs): nothing loads from the network, so a page
opens the same offline, attached to a mail, or years later."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from html import escape

from ..analysis.spelling import printable
from . import fonts

_CSS = """
body { font-family: "bertattn-cjk", system-ui, -apple-system, "Segoe UI", "Noto Sans", "Noto Sans CJK SC",
       "WenQuanYi Micro Hei", sans-serif; margin: 1.5em; color: #222; max-width: 100%; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; } h3 { font-size: 1em; }
table { border-collapse: collapse; margin: .4em 0 1em; font-size: .85em; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; max-width: 24em;
         overflow-wrap: anywhere; }
th { background: #f4f4f4; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.scroll { overflow-x: auto; max-width: 100%; }
table.heat td { width: 1.1em; height: 1.1em; padding: 0; border: 1px solid #fff; }
table.heat th.tok { writing-mode: vertical-rl; font-weight: normal; background: none;
                    border: none; padding: 2px 0; white-space: nowrap; font-size: .9em; }
table.heat th.row { background: none; border: none; white-space: nowrap; }
.meta { color: #555; font-size: .9em; }
img.fig { max-width: 100%; height: auto; border: 1px solid #eee; } img.full { max-width: none; }
figure { margin: .5em 0 1.5em; } figcaption { color: #555; font-size: .9em; }
"""


def esc(value: object) -> str:
    """Text for a page: HTML-escaped, control characters shown as escapes (``spelling.printable``)."""
    return escape(printable(str(value), None))


def muted(text: str) -> str:
    """A paragraph of notes in grey (``text``: HTML)."""
    return f'<p class="meta">{text}</p>'


def page(title: str, body: str) -> str:
    """A complete HTML document around ``body`` (HTML); its CJK characters bring a font subset along."""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{fonts.font_face_css(title + body)}{_CSS}</style>\n</head>\n"
        f"<body>\n<h1>{esc(title)}</h1>\n{body}\n</body>\n</html>\n"
    )


def data_table(header: Sequence[str], rows: Sequence[Sequence[object]], numeric: Sequence[bool] = ()) -> str:
    """A plain table; cells escaped, floats with 3 decimals, ``numeric`` columns right-aligned."""

    def cell(i: int, value: object) -> str:
        text = f"{value:.3f}" if isinstance(value, float) else ("" if value is None else str(value))
        num = ' class="num"' if i < len(numeric) and numeric[i] else ""
        return f"<td{num}>{esc(text)}</td>"

    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"]
    out += ["<tr>" + "".join(cell(i, v) for i, v in enumerate(row)) + "</tr>" for row in rows]
    return "\n".join([*out, "</table>"])


def img(png: bytes, alt: str, caption: str = "", full_size: bool = False) -> str:
    """A PNG as a data URI in a figure; ``full_size``: at its own size, scrolled, its labels legible."""
    src = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    image = f'<img class="fig{" full" if full_size else ""}" src="{src}" alt="{esc(alt)}">'
    return f"<figure>{f'<div class=scroll>{image}</div>' if full_size else image}{cap}</figure>"
