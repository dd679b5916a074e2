"""One review's [CLS] attention at one layer, from a run (``load_review``: the stored weights) or a text
(``review_from_text``), with token x token maps computed by eager attention (``pairs``); drawn
(``plot_review``) and written (``write_review``, ``bertattn plot``) as PNG, HTML, CSV or XLSX."""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from .. import schema
from .._files import atomic_path, writing
from ..analysis.aggregate import export_path, run_layer, significant
from ..analysis.provenance import load_run_model
from ..analysis.spelling import printable, readable
from ..analysis.words import NO_WORDS, check_words, run_words
from ..errors import InputError, RunDirError, SpecError
from ..extract.words import CONTINUATION, KEY, word_map
from ..run import attention_rows, committed_files, layer_name, read_manifest, scan_parts, verify_pages
from . import fonts
from .figures import CMAP, drawing, heatmap, new_figure, png_bytes, spans, turn_long_labels
from .html import esc, img, page

if TYPE_CHECKING:
    from matplotlib.figure import Figure

log = logging.getLogger(__name__)

#: Tokens of a token x token map at most, every one labelled: a longer review's maps are cut into
#: windows of even length along the diagonal.
PAIR_WINDOW = 40
#: Largest |recomputed - stored| [CLS] weight accepted silently (a bf16 run differs more).
PAIRS_TOLERANCE = 1e-3
#: Longest id or label a title shows whole, so that a figure stays a readable width.
TITLE_VALUE_CHARS = 80
#: What ``write_review`` writes, by suffix: pictures, or the heads x tokens table.
SUFFIXES = (".png", ".html", ".htm", ".csv", ".xlsx")
TABLES = (".csv", ".xlsx")


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
    num_layers: int | None = None  # the model's, to name the layer from the end too
    starts: list[int] | None = None  # each token's first character in ``text``
    ends: list[int] | None = None  # and the character after its last
    word_starts: list[int] | None = None  # the run's words: the position of each token's word's first token
    word_texts: list[str] | None = None  # and that word's text
    words: str | None = None  # the rule that joined the tokens into words (:func:`by_words`), if any
    continuation: str | None = CONTINUATION  # the tokenizer's mark of a continued piece (None: it has none)

    @property
    def num_heads(self) -> int:
        return int(self.weight.shape[0])

    def title(self) -> str:
        """One line: id, layer, prediction and label, each cut to ``TITLE_VALUE_CHARS``."""
        prob = f" ({self.prob:.3f})" if self.prob is not None else ""
        parts = [
            f"review {printable(self.doc_id, TITLE_VALUE_CHARS)}",
            layer_name(self.layer, self.num_layers),
            self.pred_label is not None
            and f"predicted {printable(self.pred_label, TITLE_VALUE_CHARS)}{prob}",
            self.label is not None and f"label {printable(self.label, TITLE_VALUE_CHARS)}",
            self.words is not None and f"words ({self.words})",
        ]
        return " · ".join(p for p in parts if p)


def token_range(value: str | None) -> slice | None:
    """``--tokens 0:40``: content tokens 0..39 (0 is the first after [CLS]), as Python slices go."""
    bounds = None if value is None else re.fullmatch(r"\s*([+-]?\d+)?\s*:\s*([+-]?\d+)?\s*", value)
    if value is not None and bounds is None:
        raise SpecError(f"--tokens takes a range of token positions such as 0:40 or 10:, got {value!r}")
    return bounds and slice(*(None if b is None else int(b) for b in bounds.groups()))


def _at(review: ReviewAttention, idx: Sequence[int], **changes: Any) -> ReviewAttention:
    """The review with only its content tokens ``idx`` (ids, positions, spans, weights), then ``changes``."""

    def at(values: list[Any] | None) -> list[Any] | None:
        return None if values is None else [values[i] for i in idx]

    names = ("tokens", "token_ids", "positions", "starts", "ends", "word_starts", "word_texts")
    kept = {k: at(getattr(review, k)) for k in names}
    weights = {"weight": review.weight[:, idx], "scaled": review.scaled[:, idx]}
    return dataclasses.replace(review, **kept | weights | changes)


def select(review: ReviewAttention, tokens: slice | None = None, specials: bool = True) -> ReviewAttention:
    """The review with only the content tokens ``tokens`` (and [CLS], [SEP] in its maps with ``specials``)."""
    idx = list(range(len(review.tokens))[tokens or slice(None)])
    if not idx:
        lo, hi = ("" if end is None else end for end in (tokens.start, tokens.stop))
        raise SpecError(f"--tokens {lo}:{hi} selects none of the review's {len(review.tokens)} tokens")
    out = _at(review, idx)
    if review.pairs is not None:
        last = review.pairs.shape[1] - 1
        rows = ([0] if specials else []) + [i + 1 for i in idx] + ([last] if specials else [])
        out.pairs = review.pairs[:, rows][:, :, rows]  # (H, s, s)
        out.pair_tokens = [review.pair_tokens[i] for i in rows]
    return out


def by_words(
    review: ReviewAttention, mode: str, user_dict: str | None = None, stored: bool = False
) -> ReviewAttention:
    """The review with its words in place of its tokens, weights summed and scaled again per head; in the
    token x token maps a word pays its tokens' mean attention and receives their sum (Clark et al., 2019).
    ``stored``: the words are the run's, which the review holds; else made by ``mode``."""
    if stored and review.word_starts is not None:
        words = pl.DataFrame({"word": review.word_starts, "word_text": review.word_texts})
    else:
        if review.starts is None or review.ends is None:
            raise SpecError("--unit word needs the tokens' spans, which this review lacks")
        spans = {"start": review.starts, "end": review.ends}
        tokens = pl.DataFrame({KEY: 0, "position": review.positions, "token": review.tokens, **spans})
        texts = None if review.text is None else pl.DataFrame({KEY: [0], "text": [review.text]})
        words = word_map(tokens, texts, mode, user_dict, review.continuation).collect().sort("position")
    _, first, word = np.unique(words["word"].to_numpy(), return_index=True, return_inverse=True)
    member = np.zeros((len(word), len(first)))  # (n, W): token i is in word j
    member[np.arange(len(word)), word] = 1
    weight = review.weight @ member  # (H, W)
    lo, hi = weight.min(axis=1, keepdims=True), weight.max(axis=1, keepdims=True)
    scaled = np.where(hi > lo, (weight - lo) / np.where(hi > lo, hi - lo, 1), 0.0)  # (H, W)
    tokens = words["word_text"].gather(first).to_list()  # a word at its first token
    out = _at(review, first, tokens=tokens, weight=weight, scaled=scaled, words=mode, byte_level=False)
    if review.pairs is not None:
        full = np.zeros((len(word) + 2, len(first) + 2))  # (S, W + 2): [CLS] and [SEP] words of their own
        full[0, 0] = full[-1, -1] = 1
        full[1:-1, 1:-1] = member
        out.pairs = np.einsum("qa,hqk,kb->hab", full / full.sum(axis=0), review.pairs, full)  # (H, W+2, W+2)
        out.pair_tokens = [review.pair_tokens[0], *out.tokens, review.pair_tokens[-1]]
    return out


def from_rows(rows: pl.DataFrame, doc_id: str, layer: int, **about: Any) -> ReviewAttention:
    """A review from its attention rows in the long form (``run.attention_rows``), in any order;
    ``about``: its other fields (prediction, label, text, the model's)."""
    rows = rows.filter((pl.col("doc_id") == doc_id) & (pl.col("layer") == layer)).sort(["head", "position"])
    if rows.is_empty():
        raise RunDirError(f"review {doc_id!r} has no attention rows at layer {layer}")
    heads = rows["head"].n_unique()
    n = rows.height // heads
    first = rows.filter(pl.col("head") == rows["head"][0])
    stored = "word" in first.columns and first["word"].null_count() == 0
    if n * heads != rows.height or first.height != n:
        raise RunDirError(f"review {doc_id!r}: heads hold different numbers of tokens at layer {layer}")
    return ReviewAttention(
        doc_id=doc_id,
        layer=layer,
        tokens=first["token"].to_list(),
        token_ids=first["token_id"].to_list(),
        positions=first["position"].to_list(),
        starts=first["start"].to_list() if "start" in first.columns else None,
        ends=first["end"].to_list() if "end" in first.columns else None,
        word_starts=first["word"].to_list() if stored else None,
        word_texts=first["word_text"].to_list() if stored else None,
        weight=rows["weight"].to_numpy().reshape(heads, n),  # (H, n)
        scaled=rows["weight_scaled"].to_numpy().reshape(heads, n),  # (H, n)
        **about,
    )


def load_reviews(run: str | Path, doc_ids: list[str], layer: int | None = None) -> list[ReviewAttention]:
    """Several reviews of a run with their predictions, in one scan of its committed parts. The pages of
    the parts that hold them are checked first: polars would draw a flipped bit as a weight."""
    doc_ids = [str(d) for d in doc_ids]  # ids are stored as text: row number 0 is "0"
    manifest = read_manifest(run)
    idx = run_layer(manifest, layer)
    parts = committed_files(run, ("cls_attention", "tokens", "predictions"))
    if not parts:
        if manifest.status == "complete":  # a run over inputs without rows
            read = "--limit 0 read" if manifest.spec.get("limit") == 0 else "its inputs had"
            raise InputError(f"{run} holds no reviews: {read} no rows")
        raise RunDirError(f"{run} has no committed parts yet; run bertattn extract first")
    wanted = pl.col("doc_id").is_in(doc_ids)
    scan = scan_parts([p.files["predictions"] for p in parts])
    preds = scan.filter(wanted & (pl.col("status") == "ok")).collect(engine="streaming")
    holding = {e.name for e in manifest.parts for i in preds["row_index"] if e.start_row <= i < e.end_row}
    for f in (f for p in parts if p.name in holding for f in p.files.values()):
        verify_pages(run, f)
    rows = attention_rows(
        scan_parts([p.files["cls_attention"] for p in parts]).filter(wanted & (pl.col("layer") == idx)),
        scan_parts([p.files["tokens"] for p in parts]).filter(wanted),
    ).collect(engine="streaming")
    out, model = [], {"byte_level": manifest.byte_level, "num_layers": manifest.num_layers}
    for doc_id in doc_ids:
        found = preds.filter(pl.col("doc_id") == doc_id)
        if found.is_empty():
            raise InputError(f"review {doc_id!r} is not among the scored reviews of {run}")
        pred = found.row(0, named=True)
        probs, pred_id = pred["probs"], pred["pred_id"]
        prob = None if probs is None or pred_id is None else float(probs[pred_id])
        about = {k: pred.get(k) for k in ("pred_label", "label", "text")}
        out.append(from_rows(rows, doc_id, idx, prob=prob, **about, **model))
    return out


def load_review(run_dir: str | Path, doc_id: str, layer: int | None = None) -> ReviewAttention:
    """One review of a run: exactly its stored weights, in position order."""
    return load_reviews(run_dir, [doc_id], layer)[0]


def _load_classifier(model: str, layer: int, device: str, max_length: int | None = None, **trust: bool):
    """The classifier with eager attention: transformers' own attention matrices, the reference."""
    from ..model import Classifier

    try:
        return Classifier.load(
            model, layers=[layer], device=device, attention="eager", max_length=max_length, **trust
        )
    except SpecError as e:  # named as plot's option, not extract's
        raise SpecError(str(e).replace("(--layers)", "(--layer)")) from None


def _attach_pairs(review: ReviewAttention, clf, ids: np.ndarray) -> None:
    """Every query's attention row at the classifier's layer, on token ids ``ids`` ([CLS] ... [SEP])."""
    import torch

    input_ids, mask = clf.pad([ids])  # (1, S), (1, S)
    with torch.inference_mode():
        out = clf.model(input_ids=input_ids, attention_mask=mask, output_attentions=True)
    review.pairs = out.attentions[clf.layers[0]][0].float().cpu().numpy()  # (H, S, S)
    review.pair_tokens = clf.tokenizer.convert_ids_to_tokens(ids.tolist())


def review_from_text(
    text: str,
    model: str,
    layer: int = -2,
    pairs: bool = False,
    device: str = "cpu",
    doc_id: str = "text",
    **trust: bool,
) -> ReviewAttention:
    """Score one text and build its review through the stages a run uses (encode, model, extract)."""
    from ..extract import Extractor, ScoredRow, vocab_array
    from ..model import encode_texts

    if not text or not text.strip():
        raise InputError("the text to plot is empty")
    clf = _load_classifier(model, layer, device, **trust)
    enc = encode_texts(clf.tokenizer, [text], clf.max_length)[0]
    if enc.n_tokens <= 2:
        raise InputError("the text gives no tokens to plot")
    out = clf.forward([enc.ids])
    n, probs = enc.n_tokens, out.probs
    scored = ScoredRow(0, doc_id, None, "ok", enc, probs[0], out.rows[0, :, :, :n], out.norms[0, :, :, :n])
    tables = Extractor(vocab_array(clf.tokenizer), clf.layers, clf.num_heads, clf.labels).tables([scored])
    # ids as plain strings, as in the files
    attention, tokens = (pl.from_arrow(schema.cast(tables[t], t)).lazy() for t in ("cls_attention", "tokens"))
    rows = attention_rows(attention, tokens).collect()
    pred = int(np.argmax(probs[0]))
    model = {
        "byte_level": clf.byte_level,
        "num_layers": clf.num_layers,
        "continuation": clf.word_continuation,
    }
    about = {"pred_label": clf.labels[pred], "prob": float(probs[0, pred]), "text": text, **model}
    review = from_rows(rows, doc_id, clf.layers[0], **about)
    if pairs:
        _attach_pairs(review, clf, enc.ids)
    return review


def add_pairs(
    review: ReviewAttention,
    run_dir: str | Path,
    model: str | None = None,
    text: str | None = None,
    device: str = "cpu",
    **trust: bool,
) -> ReviewAttention:
    """Add token x token matrices to a review of a run: its model (or ``model``) on the token ids the
    run scored, or on ``text`` where given (which must give the run's tokens)."""
    from ..model import encode_texts, with_special_tokens

    manifest = read_manifest(run_dir)
    length = manifest.model.get("max_length")
    clf = load_run_model(
        manifest, model, lambda src: _load_classifier(src, review.layer, device, length, **trust)
    )
    if text is None:
        ids = with_special_tokens(clf.tokenizer, [np.asarray(review.token_ids)])[0]
    else:
        ids = encode_texts(clf.tokenizer, [text], clf.max_length)[0].ids
        if ids[1:-1].tolist() != review.token_ids:
            raise InputError(
                f"the review's text and the model do not give review {review.doc_id!r}'s tokens; "
                "pass the review's own text (--text) and the run's model (--model)"
            )
        review.text = text
    _attach_pairs(review, clf, ids)
    gap = float(np.abs(review.pairs[:, 0, 1:-1] - review.weight).max())  # the [CLS] row, (H, n)
    if gap > PAIRS_TOLERANCE:
        log.warning("review %s: the [CLS] row recomputed in float32 differs from the run's by up to %.4f "
                    "(a run in bf16/fp16 or on another device?)", review.doc_id, gap)  # fmt: skip
    return review


def cls_figure(review: ReviewAttention):
    """The seed's picture: heads x tokens, each head's scaled [CLS] row."""
    tokens = readable(review.tokens, review.byte_level)
    return heatmap(review.scaled, tokens, list(range(review.num_heads)), review.title())


def pairs_figure(review: ReviewAttention, columns: int = 4):
    """Token x token attention of every head (rows: queries), every token labelled: a review longer than
    ``PAIR_WINDOW`` tokens is shown in windows along the diagonal (attention between windows left out).
    One colour scale and one colour bar, so that heads compare."""
    if review.pairs is None or review.pair_tokens is None:
        raise SpecError("no token x token matrices: load the review with pairs (--pairs)")
    labels = [fonts.label(t) for t in readable(review.pair_tokens, review.byte_level)]
    heads, size = review.pairs.shape[:2]
    windows = spans(size, PAIR_WINDOW)
    title = f"{fonts.label(review.title())} · token x token (row: query)"
    if len(windows) > 1:
        title += f" in windows of {len(windows[0])} of its {size} tokens"
    with drawing([*labels, title]):
        panels = [(w, h) for w in windows for h in range(heads)]
        columns = min(columns, len(panels))
        rows = -(-len(panels) // columns)
        panel = max(3.2, 0.11 * len(windows[0]) + 1.2)
        fig = new_figure(figsize=(panel * columns + 1.0, panel * rows + 0.8), layout="constrained")
        axes = fig.subplots(rows, columns, squeeze=False).ravel()
        vmax = max(float(review.pairs[h][np.ix_(w, w)].max()) for w, h in panels) or 1.0  # of what is drawn
        for ax in axes[len(panels) :]:
            ax.axis("off")
        for (w, h), ax in zip(panels, axes, strict=False):
            image = ax.imshow(review.pairs[h][np.ix_(w, w)], vmin=0, vmax=vmax, cmap="viridis")  # (s, s)
            where = f" · tokens {w.start + 1}–{w.stop} of {size}" if len(windows) > 1 else ""
            ax.set_title(f"head {h}{where}", fontsize=9)
            ax.set_xticks(range(len(w)), labels[w.start : w.stop], fontsize=6)
            ax.set_yticks(range(len(w)), labels[w.start : w.stop], fontsize=6)
            turn_long_labels(ax)
            ax.tick_params(length=0)
        fig.colorbar(image, ax=axes.tolist(), label="attention weight (raw)", shrink=min(0.8, 1.6 / rows))
        fig.suptitle(title, fontsize=10)
        return fig


def review_png(review: ReviewAttention, pairs: bool = False, dpi: int = 130) -> bytes:
    """The heads x tokens picture, with the token x token maps below it where ``pairs``."""
    top = png_bytes(cls_figure(review), dpi=dpi, tight=False)
    if not pairs:
        return top
    from PIL import Image  # pasted as 8-bit RGB, which keeps a long review's stack small

    images = [Image.open(io.BytesIO(b)).convert("RGB") for b in (top, png_bytes(pairs_figure(review), dpi))]
    out = Image.new("RGB", (max(i.width for i in images), sum(i.height for i in images)), "white")
    out.paste(images[0], (0, 0))
    out.paste(images[1], (0, images[0].height))
    buf = io.BytesIO()
    out.save(buf, format="PNG")
    return buf.getvalue()


def review_html(review: ReviewAttention) -> str:
    """A review's page body: its text where known; the heads x tokens heatmap as a table of coloured cells
    (real text, which any script the browser has a font for reads right, both weights in each cell's
    tooltip); its token x token maps if any."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    tokens = readable(review.tokens, review.byte_level)
    rgba = colormaps[CMAP].with_extremes(bad="white")(np.clip(review.scaled, 0, 1))  # (H, n, 4)
    head = "".join(f'<th class="tok">{esc(t)}</th>' for t in tokens)
    lines = [f'<p class="meta">{esc(review.text)}</p>'] if review.text else []
    lines.append(f'<div class="scroll"><table class="heat"><tr><th></th>{head}</tr>')
    for h in range(review.num_heads):
        cells = []
        for j, tok in enumerate(tokens):
            tip = f"head {h} · {tok} · scaled {review.scaled[h, j]:.3f} · raw {review.weight[h, j]:.5f}"
            cells.append(f'<td style="background:{to_hex(rgba[h, j])}" title="{esc(tip)}"></td>')
        lines.append(f'<tr><th class="row">head {h}</th>{"".join(cells)}</tr>')
    lines.append("</table></div>")
    if review.pairs is not None:
        alt = f"token x token attention of every head, review {review.doc_id}"
        caption = "token x token attention per head (rows: queries; raw weights, one scale)"
        lines.append(img(png_bytes(pairs_figure(review)), alt, caption, full_size=True))
    return "\n".join(lines)


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
    """A review of a run (``run_dir`` + ``doc_id``) or a text (``text`` or ``text_file`` + ``model``), with
    token x token maps where ``pairs``; ``tokens``: the content tokens (or words) to show (``"0:40"``);
    ``specials``: [CLS] and [SEP] in the maps. Trust in the model's code is the caller's, not the run's."""
    if unit not in ("token", "word"):
        raise SpecError(f"--unit must be token or word; got {unit!r}")
    check_words(words)
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
        stored = False
        if run_dir is not None:
            words, user_dict, stored, review.continuation = run_words(
                read_manifest(run_dir), words, user_dict
            )
        elif words in (None, "auto"):
            words = "jieba"  # for a text with Chinese characters; the tokenizer's own words for any other
        if words in (None, "none"):
            raise SpecError(f"--unit word: {NO_WORDS}")
        review = by_words(review, words, user_dict, stored)
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
    """A review's heads x tokens figure (options: :func:`review_for_plot`), and its maps' with ``pairs``."""
    review = review_for_plot(run_dir, doc_id, **options)
    return (cls_figure(review), pairs_figure(review)) if options.get("pairs") else cls_figure(review)


def _write_table(review: ReviewAttention, path: Path, suffix: str) -> None:
    """The seed's table: a row per head and measure (scaled, raw), a column per token, rounded as every
    export is; the review's id, prediction, label and text on every row, so that a filter keeps them."""
    tokens = readable(review.tokens, review.byte_level)
    about = [review.doc_id, review.pred_label, significant(review.prob), review.label]
    about = [printable(v, None) if isinstance(v, str) else v for v in about]
    text = review.text and "".join(c if c in "\t\n\r" else printable(c, None) for c in review.text)
    header = ["review", "predicted", "probability", "label", "head", "measure"]
    header += [*(f"{p} {t}" for p, t in zip(review.positions, tokens, strict=True)), "text"]
    rows = {
        m: [[*about, h, m, *map(significant, values[h].tolist()), text] for h in range(review.num_heads)]
        for m, values in (("scaled", review.scaled), ("raw", review.weight))
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
    """Write a review to ``out``: PNG or HTML (with its token x token maps where ``pairs``), CSV or XLSX."""
    path = output_path(out, pairs)
    suffix = path.suffix.lower()
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, unique=True) as tmp:  # a full disk leaves no half-written file
            if suffix in TABLES:
                _write_table(review, tmp, suffix)
            elif suffix == ".png":
                tmp.write_bytes(review_png(review, pairs=pairs))
            else:
                tmp.write_text(page(review.title(), review_html(review)), encoding="utf-8")
    return path
