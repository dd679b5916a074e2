"""``bertattn plot``: heatmaps of one review, from a run by its id or from a text through a model.

Usage::

    bertattn plot runs/r1 --doc-id 42 --out r42.png                 # heads x tokens, [CLS] row
    bertattn plot runs/r1 --doc-id 42 --out r42.html --pairs        # + token x token per head
    bertattn plot --text "上菜慢，服务态度差" --model models/zh-senti --out seed.png

The heads x tokens picture is the seed's: each head's ``[CLS]`` row over the content tokens, min-max
scaled per head; from a run it shows exactly the stored ``weight_scaled``.
"""

from __future__ import annotations

from pathlib import Path

from .._files import atomic_path, writing
from ..errors import SpecError
from . import page
from .figures import review_html, review_png
from .review import ReviewAttention, add_pairs, load_review, review_from_text, select, token_range
from .table import write_table

SUFFIXES = (".png", ".html", ".htm", ".csv", ".xlsx")


def _checked_out(out: str | Path, pairs: bool = False) -> Path:
    path = Path(out)
    if path.suffix.lower() not in SUFFIXES:
        raise SpecError(f"--out must end in {', '.join(SUFFIXES)}; got {path.name!r}")
    if pairs and path.suffix.lower() in (".csv", ".xlsx"):
        raise SpecError(
            f"--pairs draws token x token maps, which a {path.suffix} table cannot hold; write .png or .html"
        )
    return path


def write_review(review: ReviewAttention, out: str | Path, pairs: bool = False) -> Path:
    """Write a review: PNG or HTML (heads x tokens, and the token x token maps with ``pairs``: the same
    content either way), or its heads x tokens table as CSV or XLSX."""
    path = _checked_out(out, pairs)
    suffix = path.suffix.lower()
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, unique=True) as tmp:  # a full disk leaves no empty picture behind
            if suffix in (".csv", ".xlsx"):
                part = tmp.with_name(tmp.name + suffix)  # the suffix says which table to write
                try:
                    write_table(review, part).replace(tmp)
                finally:
                    part.unlink(missing_ok=True)
            elif suffix == ".png":
                tmp.write_bytes(review_png(review, pairs=pairs))
            else:
                tmp.write_text(
                    page.page(review.title(), review_html(review, heading=False)), encoding="utf-8"
                )
    return path


def plot(
    out: str | Path,
    run_dir: str | Path | None = None,
    doc_id: str | None = None,
    text: str | None = None,
    model: str | None = None,
    layer: int | None = None,
    pairs: bool = False,
    device: str = "cpu",
    tokens: str | None = None,
    specials: bool = True,
) -> Path:
    """The ``plot`` command: a review of a run (``run_dir`` + ``doc_id``) or a text (``text`` + ``model``;
    ``doc_id`` then names it in the title).
    ``tokens``: a range of content tokens to show (``0:40``); ``specials``: [CLS] and [SEP] in the
    token x token maps."""
    _checked_out(out, pairs)  # before any model loads
    if not specials and not pairs:
        raise SpecError("--no-specials leaves [CLS] and [SEP] out of the token x token maps: add --pairs")
    shown = token_range(tokens)
    if run_dir is not None:
        if doc_id is None:
            raise SpecError("give --doc-id: the id of the review in the run to plot")
        if not pairs and (text is not None or model is not None):
            raise SpecError(
                "--text and --model go with a run only for --pairs; a run's review is plotted from the run"
            )
        review = load_review(run_dir, doc_id, layer)
        if pairs:
            add_pairs(review, run_dir, model=model, text=text, device=device)
    else:
        if text is None or model is None:
            raise SpecError("give RUN_DIR and --doc-id, or --text and --model")
        review = review_from_text(
            text, model, -2 if layer is None else layer, pairs=pairs, device=device, doc_id=doc_id or "text"
        )
    return write_review(select(review, shown, specials), out, pairs=pairs)
