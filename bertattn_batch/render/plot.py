"""One review's pictures: ``plot_review`` returns matplotlib figures (heads x tokens: each head's [CLS]
row, min-max scaled, from a run exactly its stored ``weight_scaled``; token x token maps with ``pairs``);
``write_review`` (``bertattn plot``) writes them as PNG or HTML, or the heads x tokens table as CSV or XLSX.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._files import atomic_path, writing
from ..analysis.aggregate import export_path, significant
from ..analysis.spelling import printable, readable
from ..analysis.words import run_words
from ..errors import InputError, SpecError
from ..run import read_manifest
from .figures import cls_figure, pairs_figure, review_png
from .html import page, review_html
from .review import ReviewAttention, add_pairs, by_words, load_review, review_from_text, select, token_range

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SUFFIXES = (".png", ".html", ".htm", ".csv", ".xlsx")
TABLES = (".csv", ".xlsx")


def output_path(out: str | Path, pairs: bool = False) -> Path:
    """``out`` checked to name a file ``write_review`` writes (before any model loads)."""
    path = export_path(out, SUFFIXES)
    if pairs and path.suffix.lower() in TABLES:
        raise SpecError(
            f"--pairs draws token x token maps, which a {path.suffix} table cannot hold; write .png or .html"
        )
    return path


def review_for_plot(
    run_dir: str | Path | None = None,
    doc_id: str | None = None,
    *,
    text: str | None = None,
    model: str | None = None,
    layer: int | None = None,
    pairs: bool = False,
    device: str = "cpu",
    tokens: str | None = None,
    specials: bool = True,
    text_file: str | Path | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    unit: str = "token",
    words: str | None = None,
    user_dict: str | None = None,
) -> ReviewAttention:
    """A review of a run (``run_dir`` + ``doc_id``) or a text (``text`` or ``text_file`` + ``model``;
    ``doc_id`` then names it), with token x token matrices where ``pairs``; ``tokens``: the content tokens
    (or words, ``unit='word'``) to show (``"0:40"``); ``specials``: [CLS] and [SEP] in the maps. Trust in the
    model folder's code and pickle weights is the caller's, never the run's."""
    if unit not in ("token", "word"):
        raise SpecError(f"--unit must be token or word; got {unit!r}")
    trust = {"trust_remote_code": trust_remote_code, "allow_pickle": allow_pickle}
    if text_file is not None:
        text = read_text_file(text_file, text)
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
            add_pairs(review, run_dir, model=model, text=text, device=device, **trust)
    else:
        if text is None or model is None:
            raise SpecError("give RUN_DIR and --doc-id, or --text and --model")
        layer = -2 if layer is None else layer
        name = doc_id or (Path(text_file).name if text_file else "text")
        review = review_from_text(text, model, layer, pairs=pairs, device=device, doc_id=name, **trust)
    if unit == "word":
        if run_dir is not None:
            words, user_dict = run_words(read_manifest(run_dir), words, user_dict)
        elif words in (None, "auto"):
            words = "jieba"  # for a text with Chinese characters; WordPiece's ## pieces for any other
        if words in (None, "none"):
            raise SpecError("--unit word: this run has no words (--words none)")
        review = by_words(review, words, user_dict)
    return select(review, shown, specials)


def read_text_file(path: str | Path, text: str | None = None) -> str:
    """A review's text from a UTF-8 file (a byte-order mark dropped); ``text``: a text given as well."""
    if text is not None:
        raise SpecError("give the review as --text or --text-file, not both")
    try:
        return Path(path).read_bytes().decode("utf-8-sig")  # line ends as they are
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise InputError(f"cannot read the text file {path}: {e.strerror or e}") from None


def plot_review(
    run_dir: str | Path | None = None, doc_id: str | None = None, **options: Any
) -> Figure | tuple[Figure, Figure]:
    """The heads x tokens figure of a review (see :func:`review_for_plot` for the options); with
    ``pairs=True``, that figure and the token x token maps' figure."""
    review = review_for_plot(run_dir, doc_id, **options)
    return (cls_figure(review), pairs_figure(review)) if options.get("pairs") else cls_figure(review)


def _write_table(review: ReviewAttention, path: Path, suffix: str) -> None:
    """The seed's table: a row per head and measure (scaled, raw), a column per token, values rounded as
    every export rounds them; the review's id, prediction and label first and its text last on every row,
    so that a filter or a pasted row keeps them. The xlsx's third sheet holds the title."""
    tokens = readable(review.tokens, review.byte_level)
    about = [review.doc_id, review.pred_label, significant(review.prob), review.label]
    about = [printable(v, None) if isinstance(v, str) else v for v in about]
    text = review.text and "".join(c if c in "\t\n\r" else printable(c, None) for c in review.text)
    header = ["review", "predicted", "probability", "label", "head", "measure"]
    header += [*(f"{p} {t}" for p, t in zip(review.positions, tokens, strict=True)), "text"]
    measures = {"scaled": review.scaled, "raw": review.weight}
    rows = {
        m: [[*about, h, m, *map(significant, values[h].tolist()), text] for h in range(review.num_heads)]
        for m, values in measures.items()
    }
    if suffix == ".csv":
        with open(path, "w", newline="", encoding="utf-8-sig") as f:  # the mark tells Excel it is UTF-8
            csv.writer(f).writerows([header, *rows["scaled"], *rows["raw"]])
        return
    import xlsxwriter

    with xlsxwriter.Workbook(str(path)) as book:
        for measure, body in rows.items():
            sheet = book.add_worksheet(measure)
            for i, row in enumerate([header, *body]):
                sheet.write_row(i, 0, row)
            sheet.conditional_format(1, 6, review.num_heads, len(header) - 2, {"type": "2_color_scale"})
        book.add_worksheet("review").write(0, 0, review.title())


def write_review(review: ReviewAttention, out: str | Path, pairs: bool = False) -> Path:
    """Write a review to ``out``: PNG or HTML (heads x tokens, and its token x token maps with ``pairs``:
    the same content either way), or the heads x tokens table as CSV or XLSX."""
    path = output_path(out, pairs)
    suffix = path.suffix.lower()
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, unique=True) as tmp:  # a full disk leaves no half-written file behind
            if suffix in TABLES:
                _write_table(review, tmp, suffix)
            elif suffix == ".png":
                tmp.write_bytes(review_png(review, pairs=pairs))
            else:
                tmp.write_text(page(review.title(), review_html(review)), encoding="utf-8")
    return path
