"""Heatmaps of one review's attention: from a run by its id, or from a text through a model.

Usage::

    bertattn plot runs/r1 --doc-id 42 --out r42.png                 # heads x tokens, [CLS] row
    bertattn plot runs/r1 --doc-id 42 --out r42.html --pairs        # + token x token per head
    bertattn plot --text "上菜慢，服务态度差" --model models/zh-senti --out seed.png

    review = load_review("runs/r1", "42", layer=-2)
    cls_figure(review).savefig("r42.png")

The heads x tokens picture is the seed's: each head's ``[CLS]`` row over the content tokens, min-max
scaled per head; from a run it shows exactly the stored ``weight_scaled``. The token x token picture
needs every query's row, which a run does not keep: it is computed for that one review with eager
attention (``output_attentions=True``), reading the text from the run's source (or ``--text``).
"""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass
from html import escape
from pathlib import Path

import numpy as np
import polars as pl

from . import fonts, htmlpage
from .aggregate import committed_parts
from .errors import InputError, RunDirError, SpecError
from .write import read_manifest, run_inputs

log = logging.getLogger(__name__)

#: Tokens per row of a heads x tokens figure; longer reviews wrap onto more rows.
TOKENS_PER_ROW = 64
#: Token x token maps get tick labels up to this many tokens.
PAIR_LABELS_UP_TO = 48
#: Largest |recomputed - stored| [CLS] weight accepted silently (a bf16 run differs more).
PAIRS_TOLERANCE = 1e-3
SUFFIXES = (".png", ".html", ".htm")
#: Longest id or label a figure's title shows whole.
TITLE_VALUE_CHARS = 80


@dataclass
class ReviewAttention:
    """One review's [CLS] attention at one layer: ``weight``/``scaled`` are (heads, content tokens)."""

    doc_id: str
    layer: int  # 0-based
    tokens: list[str]
    token_ids: list[int]
    positions: list[int]
    weight: np.ndarray  # (H, n) raw softmax weights
    scaled: np.ndarray  # (H, n) per-head min-max scaled, as stored in cls_attention
    pred_label: str | None = None
    prob: float | None = None
    label: str | None = None
    text: str | None = None
    pairs: np.ndarray | None = None  # (H, S, S) every query's row, [CLS] and [SEP] included
    pair_tokens: list[str] | None = None  # (S,)
    byte_level: bool | None = None  # whether the tokens spell bytes; None: told from the tokens

    @property
    def num_heads(self) -> int:
        return int(self.weight.shape[0])

    def title(self) -> str:
        parts = [f"review {_short(self.doc_id)}", f"layer {self.layer}"]
        if self.pred_label is not None:
            prob = f" ({self.prob:.3f})" if self.prob is not None else ""
            parts.append(f"predicted {_short(self.pred_label)}{prob}")
        if self.label is not None:
            parts.append(f"label {_short(self.label)}")
        return " · ".join(parts)


def _short(value: str, limit: int = TITLE_VALUE_CHARS) -> str:
    """An id or label fit for a one-line title: line breaks and other control characters as escapes,
    and cut to ``limit`` characters (a 3,000-character id would make the figure 30,000 pixels wide)."""
    text = "".join(repr(c)[1:-1] if not c.isprintable() else c for c in value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (RoBERTa's tokens): a printable character for each byte, inverted."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, shifted = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


_BYTES = _byte_decoder()
_SHIFTED = {c for c, b in _BYTES.items() if ord(c) >= 256}  # bytes with no printable self: 'Ġ' (space)


def readable(tokens: list[str], byte_level: bool | None = None) -> list[str]:
    """Tokens as a reader sees them. Byte-level BPE tokens (RoBERTa: 'Ġgood', 'cafÃ©') are decoded back
    to their text; a piece holding part of a character shows '�'. Other tokens are kept as they are.

    ``byte_level``: whether the run's tokenizer is byte-level (its manifest says, since this version).
    Only for runs that do not say is it told from the tokens, which a WordPiece token such as 'ł'
    (a character that is also a shifted byte) can mislead."""
    if byte_level is None:
        byte_level = any(c in _SHIFTED for t in tokens for c in t)
    if not byte_level or not all(c in _BYTES for t in tokens for c in t):
        return list(tokens)
    out = []
    for t in tokens:
        text = bytes(_BYTES[c] for c in t).decode("utf-8", errors="replace")
        out.append(text.strip() or repr(text)[1:-1])  # a space of its own shows as its escape, e.g. \xa0
    return out


def from_rows(rows: pl.DataFrame, doc_id: str, layer: int) -> ReviewAttention:
    """Build a review from its cls_attention rows at one layer (any row order)."""
    rows = rows.filter((pl.col("doc_id") == doc_id) & (pl.col("layer") == layer)).sort(["head", "position"])
    if rows.is_empty():
        raise InputError(f"no attention rows for review {doc_id!r} at layer {layer}")
    heads = rows["head"].n_unique()
    n = rows.height // heads
    first = rows.filter(pl.col("head") == rows["head"][0])
    if n * heads != rows.height or first.height != n:
        raise RunDirError(f"review {doc_id!r}: heads hold different numbers of tokens at layer {layer}")
    return ReviewAttention(
        doc_id=doc_id,
        layer=layer,
        tokens=first["token"].to_list(),
        token_ids=first["token_id"].to_list(),
        positions=first["position"].to_list(),
        weight=rows["weight"].to_numpy().reshape(heads, n),  # (H, n)
        scaled=rows["weight_scaled"].to_numpy().reshape(heads, n),  # (H, n)
    )


def run_layer(manifest: dict, layer: int | None) -> int:
    """A layer index as the user gave it (negative counts from the end) -> one the run holds."""
    model = manifest.get("model", {})
    stored = list(model.get("layers", []))
    if layer is None:
        if not stored:
            raise RunDirError("the run's manifest lists no layers")
        return int(stored[0])
    num_layers = int(model.get("num_layers", 0))
    idx = layer + num_layers if layer < 0 else layer
    if idx not in stored:
        raise SpecError(f"layer {layer} is not in this run; it holds layers {stored} (0-based)")
    return idx


def load_reviews(run_dir: str | Path, doc_ids: list[str], layer: int | None = None) -> list[ReviewAttention]:
    """Several reviews of a run in one scan of its committed parts, with their predictions."""
    run = Path(run_dir)
    manifest = read_manifest(run)
    idx = run_layer(manifest, layer)
    parts = committed_parts(run)  # the manifest's parts: a stray file is never read
    if not parts:
        raise RunDirError(f"{run} has no committed parts")
    attn_files, pred_files = [a for _, a, _ in parts], [p for _, _, p in parts]
    rows = (
        pl.scan_parquet(attn_files, glob=False)
        .filter(pl.col("doc_id").is_in(doc_ids) & (pl.col("layer") == idx))
        .collect(engine="streaming")
    )
    preds = (
        pl.scan_parquet(pred_files, glob=False)
        .filter(pl.col("doc_id").is_in(doc_ids) & (pl.col("status") == "ok"))
        .collect(engine="streaming")
    )
    out = []
    for doc_id in doc_ids:
        if rows.filter(pl.col("doc_id") == doc_id).is_empty():
            raise InputError(f"review {doc_id!r} is not among the scored reviews of {run}")
        review = from_rows(rows, doc_id, idx)
        pred = preds.filter(pl.col("doc_id") == doc_id).row(0, named=True)
        review.pred_label, review.label = pred["pred_label"], pred["label"]
        review.byte_level = manifest.get("model", {}).get("byte_level")
        if pred["probs"] is not None and pred["pred_id"] is not None:
            review.prob = float(pred["probs"][pred["pred_id"]])
        out.append(review)
    return out


def load_review(run_dir: str | Path, doc_id: str, layer: int | None = None) -> ReviewAttention:
    """One review of a run: exactly its stored weights, in position order."""
    return load_reviews(run_dir, [doc_id], layer)[0]


def _load_classifier(model: str, layer: int, device: str, max_length: int | None = None):
    from .model import Classifier

    # eager: transformers' own attention matrices, the reference, for one review
    return Classifier.load(model, layers=[layer], device=device, attention="eager", max_length=max_length)


def pair_matrices(clf, ids: np.ndarray) -> np.ndarray:
    """Every query's attention row at the classifier's (first) layer: (H, S, S) float32."""
    import torch

    input_ids, mask = clf.pad([ids])  # (1, S), (1, S)
    with torch.inference_mode():
        out = clf.model(input_ids=input_ids, attention_mask=mask, output_attentions=True)
    return out.attentions[clf.layers[0]][0].float().cpu().numpy()  # (H, S, S)


def review_from_text(
    text: str,
    model: str,
    layer: int = -2,
    pairs: bool = False,
    device: str = "cpu",
    max_length: int | None = None,
    doc_id: str = "text",
) -> ReviewAttention:
    """Score one text and build its review through the same stages a run uses (encode, model, extract)."""
    from .encode import encode_texts
    from .extract import Extractor, ScoredRow, vocab_array

    if not text or not text.strip():
        raise InputError("the text to plot is empty")
    clf = _load_classifier(model, layer, device, max_length)
    enc = encode_texts(clf.tokenizer, [text], clf.max_length)[0]
    if enc.n_tokens <= 2:
        raise InputError("the text gives no tokens to plot")
    probs, rows = clf.forward([enc.ids])  # (1, C), (1, 1, H, S)
    scored = ScoredRow(0, doc_id, None, "ok", enc, probs[0], rows[0, :, :, : enc.n_tokens])
    extractor = Extractor(vocab_array(clf.tokenizer), clf.layers, clf.num_heads, clf.labels)
    table = pl.from_arrow(extractor.tables([scored])["cls_attention"])
    review = from_rows(table, doc_id, clf.layers[0])
    pred = int(np.argmax(probs[0]))
    review.pred_label, review.prob, review.text = clf.labels[pred], float(probs[0, pred]), text
    review.byte_level = clf.byte_level
    if pairs:
        _attach_pairs(review, clf, enc.ids)
    return review


def source_text(run_dir: str | Path, doc_id: str) -> str:
    """A review's text, read again from the run's inputs (the run stores tokens, not texts)."""
    from .read import read_rows

    run = Path(run_dir)
    manifest = read_manifest(run)
    spec = manifest.get("spec", {})
    files = [preds for _, _, preds in committed_parts(run)]
    wanted = (pl.col("doc_id") == doc_id) & (pl.col("status") == "ok")  # a null id's row number may match
    preds = pl.scan_parquet(files, glob=False).filter(wanted).collect() if files else None
    if preds is None or preds.is_empty():
        raise InputError(f"review {doc_id!r} is not in {run}")
    row = int(preds["row_index"][0])
    try:
        for batch in read_rows(
            run_inputs(manifest),
            text_col=spec.get("text_col", "text"),
            id_col=spec.get("id_col"),
            label_col=None,
            input_format=spec.get("input_format", "auto"),
        ):
            if batch.row_index and batch.row_index[-1] >= row:
                i = batch.row_index.index(row)
                if batch.doc_id[i] == doc_id and batch.text[i] is not None:
                    return batch.text[i]
                break
    except InputError as e:
        raise InputError(f"cannot read the run's input again ({e}); pass the review with --text") from None
    raise InputError(f"review {doc_id!r} was not found in the run's inputs; pass it with --text")


def add_pairs(
    review: ReviewAttention,
    run_dir: str | Path | None = None,
    model: str | None = None,
    text: str | None = None,
    device: str = "cpu",
) -> ReviewAttention:
    """Compute token x token matrices for a review of a run (its model and text, or those given)."""
    from .encode import encode_texts

    manifest = read_manifest(run_dir) if run_dir is not None else {}
    model = model or manifest.get("model", {}).get("source")
    if not model:
        raise SpecError("token x token maps need the model: pass --model")
    if text is None:
        if run_dir is None:
            raise SpecError("token x token maps need the review's text: pass --text")
        text = source_text(run_dir, review.doc_id)
    max_length = manifest.get("model", {}).get("max_length")
    clf = _load_classifier(model, review.layer, device, max_length)
    run_weights = manifest.get("model", {}).get("weights_sha256")
    if run_weights and clf.weights_sha256 != run_weights:  # the maps would be another model's
        raise InputError(
            f"the model at {model} is not the run's: its weights' hash differs from the one the "
            "manifest records; pass the run's model with --model"
        )
    enc = encode_texts(clf.tokenizer, [text], clf.max_length)[0]
    if enc.ids[1:-1].tolist() != review.token_ids:
        raise InputError(
            f"the review's text and the model do not give review {review.doc_id!r}'s tokens; "
            "pass the review's own text (--text) and the run's model (--model)"
        )
    review.text = text
    _attach_pairs(review, clf, enc.ids)
    recomputed = review.pairs[:, 0, 1:-1]  # (H, n): the [CLS] query's row over content tokens
    gap = float(np.abs(recomputed - review.weight).max())
    if gap > PAIRS_TOLERANCE:
        log.warning(
            "review %s: the [CLS] row recomputed in float32 differs from the run's by up to %.4f "
            "(a run in bf16/fp16 or on another device?)",
            review.doc_id,
            gap,
        )
    return review


def _attach_pairs(review: ReviewAttention, clf, ids: np.ndarray) -> None:
    review.pairs = pair_matrices(clf, ids)
    review.pair_tokens = clf.tokenizer.convert_ids_to_tokens(ids.tolist())


# -- figures ----------------------------------------------------------------------------------------
def _pyplot(texts: list[str] | str = ""):
    """pyplot on the Agg backend, with fonts that draw ``texts`` (labels and titles to come)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    plt.rcParams["font.family"] = fonts.family(texts)
    plt.rcParams["text.parse_math"] = False  # ids, labels and tokens are text: "$x$" is no formula
    return plt


def cls_figure(review: ReviewAttention, tokens_per_row: int = TOKENS_PER_ROW):
    """The seed's picture: heads x tokens, the scaled [CLS] row of each head; long reviews wrap.

    Laid out by hand in inches (cells, label bands, colour bar): matplotlib's automatic layouts
    measure every tick label several times, which dominates the cost of a long review.
    """
    labels = [fonts.label(t) for t in readable(review.tokens, review.byte_level)]
    title = fonts.label(review.title())
    plt = _pyplot([*labels, title])
    n, heads = len(review.tokens), review.num_heads
    chunks = [(i, min(i + tokens_per_row, n)) for i in range(0, n, tokens_per_row)]
    cols = min(n, tokens_per_row)
    long_labels = [t for t in labels if _columns(t) > 2]  # drawn vertically; a CJK character stays upright
    cell = 0.2  # inches per token column
    cell_h = 0.2  # inches per head row
    left, right, top, gap = 0.75, 1.05, 0.45, 0.12
    band = 0.12 + 0.075 * max(map(len, long_labels)) if long_labels else 0.3  # room for the token labels
    width = max(left + cols * cell + right, 0.075 * len(review.title()) + 0.6)
    block = heads * cell_h + band + gap
    height = top + block * len(chunks)
    fig = plt.figure(figsize=(width, height))
    image = None
    for k, (lo, hi) in enumerate(chunks):
        y = height - top - k * block - heads * cell_h
        ax = fig.add_axes(((left) / width, y / height, cols * cell / width, heads * cell_h / height))
        image = ax.imshow(
            review.scaled[:, lo:hi],
            vmin=0,
            vmax=1,
            cmap=htmlpage.CMAP,
            aspect="auto",
            interpolation="nearest",
        )
        ax.set_xlim(-0.5, cols - 0.5)
        ax.set_xticks(range(hi - lo), labels[lo:hi], fontsize=8)
        _turn_long_labels(ax)
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
    fig.colorbar(image, cax=bar, label="scaled weight")
    fig.text(left / width, 1 - 0.2 / height, title, fontsize=10, va="center")
    return fig


def cls_png(review: ReviewAttention, dpi: int = 110) -> bytes:
    """The heads x tokens picture as PNG bytes (its layout is exact: no second, tight pass)."""
    return htmlpage.png_bytes(cls_figure(review), dpi=dpi, tight=False)


def pairs_figure(review: ReviewAttention, columns: int = 4):
    """The second seed's picture: token x token attention of every head (rows: queries)."""
    if review.pairs is None or review.pair_tokens is None:
        raise SpecError("no token x token matrices: load the review with pairs (--pairs)")
    labels = [fonts.label(t) for t in readable(review.pair_tokens, review.byte_level)]
    title = fonts.label(review.title()) + " · token x token (row: query)"
    plt = _pyplot([*labels, title])
    heads, size = review.pairs.shape[0], review.pairs.shape[1]
    columns = min(columns, heads)
    rows = -(-heads // columns)
    panel = max(3.2, 0.11 * size + 1.2) if size <= PAIR_LABELS_UP_TO else 3.0
    fig, axes = plt.subplots(rows, columns, figsize=(panel * columns, panel * rows + 0.6), squeeze=False)
    for h in range(rows * columns):
        ax = axes[h // columns, h % columns]
        if h >= heads:
            ax.axis("off")
            continue
        ax.imshow(review.pairs[h], vmin=0, vmax=float(review.pairs[h].max()) or 1.0, cmap="viridis")
        ax.set_title(f"head {h}", fontsize=9)
        if size <= PAIR_LABELS_UP_TO:
            ax.set_xticks(range(size))
            ax.set_xticklabels(labels, fontsize=6)
            _turn_long_labels(ax)
            ax.set_yticks(range(size))
            ax.set_yticklabels(labels, fontsize=6)
        else:
            ax.set_xticks([])
            ax.set_yticks([])
        ax.tick_params(length=0)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    return fig


def _columns(text: str) -> int:
    """Width in character cells: CJK characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _turn_long_labels(ax) -> None:
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
    return htmlpage.heat_table(
        review.scaled, tokens, [f"head {h}" for h in range(review.num_heads)], tips=tips
    )


def review_html(review: ReviewAttention, heading: bool = True) -> str:
    """A review's section: title, its text when known, the heatmap table, and token x token maps."""
    parts = [f"<h2>{escape(review.title())}</h2>"] if heading else []
    if review.text:
        parts.append(f'<p class="meta">{escape(review.text)}</p>')
    parts.append(cls_html(review))
    if review.pairs is not None:
        parts.append(
            htmlpage.img(
                htmlpage.png_bytes(pairs_figure(review)),
                alt=f"token x token attention of every head, review {review.doc_id}",
                caption="token x token attention per head (rows: queries; raw weights)",
            )
        )
    return "\n".join(parts)


def _checked_out(out: str | Path) -> Path:
    path = Path(out)
    if path.suffix.lower() not in SUFFIXES:
        raise SpecError(f"--out must end in {', '.join(SUFFIXES)}; got {path.name!r}")
    return path


def write_review(review: ReviewAttention, out: str | Path, pairs: bool = False) -> Path:
    """Write a review's picture: PNG (heads x tokens, or token x token with ``pairs``) or HTML (both)."""
    path = _checked_out(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() != ".png":
        path.write_text(htmlpage.page(review.title(), review_html(review, heading=False)), encoding="utf-8")
    else:
        png = htmlpage.png_bytes(pairs_figure(review), dpi=130) if pairs else cls_png(review, dpi=130)
        path.write_bytes(png)
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
) -> Path:
    """The ``plot`` command: a review of a run (``run_dir`` + ``doc_id``) or a text (``text`` + ``model``)."""
    _checked_out(out)  # before any model loads
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
        review = review_from_text(text, model, -2 if layer is None else layer, pairs=pairs, device=device)
    return write_review(review, out, pairs=pairs)
