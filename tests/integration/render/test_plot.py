"""Pictures of one review: the heatmap's matrix is the run's stored weights, the token x token maps are
transformers' own eager attention, and Chinese characters are drawn with a real CJK font (or, with
none, as U+XXXX codes after a warning: never boxes)."""

from __future__ import annotations

import logging
import math
import warnings
from html import unescape
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.compute as pc
import pytest
from conftest import SEED_TEXT
from helpers import eager_oracle, minmax, read_attention, read_table
from typer.testing import CliRunner

import bertattn_batch.render.figures as figures
import bertattn_batch.render.plot as plotting
from bertattn_batch.cli import app
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.render import fonts

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def en_run(tiny_en_dir, drug_sample, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plot") / "run"
    run_job(
        JobSpec(
            inputs=InputSpec([str(drug_sample)], id_col="doc_id", label_col="label"),
            model=str(tiny_en_dir),
            out=str(out),
            layers=[-2, -1],
            window=10,
            progress=False,
        )
    )
    return out


@pytest.fixture(scope="module")
def zh_run(tiny_zh_dir, zh_sample, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plot") / "zh"
    run_job(
        JobSpec(
            inputs=InputSpec([str(zh_sample)], id_col="doc_id", label_col="label"),
            model=str(tiny_zh_dir),
            out=str(out),
            progress=False,
        )
    )
    return out


def stored(run: Path, doc_id: str, layer: int, column: str) -> np.ndarray:
    """(heads, tokens) of one review straight from the Parquet files, ordered by hand."""
    t = read_attention(run)
    t = t.filter(pc.and_(pc.equal(t["doc_id"], doc_id), pc.equal(t["layer"], layer)))
    t = t.sort_by([("head", "ascending"), ("position", "ascending")])
    heads = len(set(t["head"].to_pylist()))
    return t[column].to_numpy().reshape(heads, -1)


def longest_doc(run: Path) -> str:
    preds = read_table(run, "predictions").to_pylist()
    return max((p for p in preds if p["status"] == "ok"), key=lambda p: p["n_tokens"])["doc_id"]


def short_doc(run: Path) -> str:
    """A review short enough for labelled token x token maps (and quick to draw)."""
    preds = [p for p in read_table(run, "predictions").to_pylist() if p["status"] == "ok"]
    return min((p for p in preds if p["n_tokens"] >= 12), key=lambda p: p["n_tokens"])["doc_id"]


def test_matrix_equals_the_stored_weights(en_run):
    doc = longest_doc(en_run)
    for layer in (None, -1):  # default: the run's first layer (-2 of 3 is 1); -1 is 2
        review = plotting.load_review(en_run, doc, layer)
        idx = 1 if layer is None else 2
        assert review.layer == idx
        np.testing.assert_array_equal(review.scaled, stored(en_run, doc, idx, "weight_scaled"))
        np.testing.assert_array_equal(review.weight, stored(en_run, doc, idx, "weight"))
    # and the picture draws exactly that matrix, wrapped into rows of TOKENS_PER_ROW tokens
    fig = plotting.cls_figure(review)
    drawn = [ax.images[0].get_array() for ax in fig.axes if ax.images]
    assert len(review.tokens) > figures.TOKENS_PER_ROW and len(drawn) > 1
    np.testing.assert_array_equal(np.concatenate([np.asarray(d) for d in drawn], axis=1), review.scaled)
    labels = [t.get_text() for ax in fig.axes if ax.images for t in ax.get_xticklabels()]
    assert labels == review.tokens


def test_pred_and_label_come_with_the_review(en_run):
    doc = longest_doc(en_run)
    review = plotting.load_review(en_run, doc)
    pred = next(p for p in read_table(en_run, "predictions").to_pylist() if p["doc_id"] == doc)
    assert (review.pred_label, review.label) == (pred["pred_label"], pred["label"])
    assert review.prob == pytest.approx(max(pred["probs"]))
    assert f"review {doc}" in review.title() and pred["pred_label"] in review.title()


def test_pairs_from_a_run_are_eager_attention(en_run):
    doc = short_doc(en_run)
    review = plotting.add_pairs(plotting.load_review(en_run, doc), en_run)  # model and token ids of the run
    heads, n = review.weight.shape
    assert review.pairs.shape == (heads, n + 2, n + 2)
    np.testing.assert_allclose(review.pairs.sum(-1), 1.0, atol=1e-5)  # every query row is a softmax
    np.testing.assert_allclose(
        review.pairs[:, 0, 1:-1], review.weight, atol=1e-5
    )  # its [CLS] row is the run's
    assert review.pair_tokens[0] == "[CLS]" and review.pair_tokens[-1] == "[SEP]"
    fig = plotting.pairs_figure(review)
    np.testing.assert_array_equal(np.asarray(fig.axes[0].images[0].get_array()), review.pairs[0])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == review.pair_tokens


def test_pairs_refuse_a_text_that_is_not_the_review(en_run):
    review = plotting.load_review(en_run, longest_doc(en_run))
    with pytest.raises(plotting.InputError, match="do not give review"):
        plotting.add_pairs(review, en_run, text="an entirely different review")


def test_text_and_model_go_through_the_library(tiny_en_dir, drug_rows):
    text = drug_rows[7]["text"]
    review = plotting.review_from_text(text, str(tiny_en_dir), layer=-2, pairs=True)
    expected = eager_oracle(tiny_en_dir, [text], layer=-2)[0]  # (H, n): transformers' own
    np.testing.assert_allclose(review.weight, expected, atol=1e-5)
    np.testing.assert_allclose(review.scaled, minmax(expected), atol=1e-5)
    np.testing.assert_allclose(review.pairs[:, 0, 1:-1], expected, atol=1e-5)
    assert review.layer == 1 and review.pred_label in ("negative", "neutral", "positive")


def test_png_and_html_files(en_run, tmp_path):
    doc = short_doc(en_run)
    review = plotting.add_pairs(plotting.load_review(en_run, doc), en_run)
    png = plotting.write_review(review, tmp_path / "r.png")
    pairs_png = plotting.write_review(review, tmp_path / "pairs.png", pairs=True)
    page = plotting.write_review(review, tmp_path / "r.html")
    assert png.read_bytes().startswith(PNG_MAGIC) and pairs_png.read_bytes().startswith(PNG_MAGIC)
    html = page.read_text(encoding="utf-8")
    assert html.count('<th class="tok">') == len(review.tokens)
    assert html.count('<th class="row">') == review.num_heads
    assert "data:image/png;base64," in html  # the token x token maps, embedded
    assert "http://" not in html and "https://" not in html and "<script" not in html
    with pytest.raises(
        plotting.SpecError, match=r"must end in \.png, \.html, \.htm, \.csv, \.xlsx; got .r\.jpg."
    ):
        plotting.write_review(review, tmp_path / "r.jpg")
    # a table holds the heads x tokens weights only: --pairs with it is refused
    r = CliRunner().invoke(
        app, ["plot", str(en_run), "--doc-id", review.doc_id, "--out", str(tmp_path / "p.csv"), "--pairs"]
    )
    assert r.exit_code == 1 and "--pairs draws token x token maps, which a .csv table cannot hold" in r.output


def _missing_glyph_warnings(fig) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figures.png_bytes(fig)
    return [str(w.message) for w in caught if "missing from" in str(w.message)]


def test_chinese_renders_with_a_cjk_font(zh_run):
    fonts.reset()
    if fonts.cjk_font() is None:
        pytest.skip(f"no CJK font on this machine ({fonts.INSTALL_HINT})")
    review = plotting.load_review(zh_run, "seed")
    assert "超" in review.tokens and "[UNK]" in review.tokens
    fig = plotting.cls_figure(review)
    labels = [t.get_text() for ax in fig.axes if ax.images for t in ax.get_xticklabels()]
    assert labels == review.tokens  # drawn as they are
    assert _missing_glyph_warnings(fig) == []


def test_without_a_cjk_font_codes_not_boxes(zh_run, monkeypatch, caplog):
    monkeypatch.setenv(fonts.ENV_VAR, "none")
    fonts.reset()
    try:
        review = plotting.load_review(zh_run, "seed")
        with caplog.at_level(logging.WARNING, logger="bertattn_batch.render.fonts"):
            fig = plotting.cls_figure(review)
        labels = [t.get_text() for ax in fig.axes if ax.images for t in ax.get_xticklabels()]
        assert labels[review.tokens.index("超")] == f"U+{ord('超'):04X}"
        assert "[UNK]" in labels  # what the font has stays as it is
        assert _missing_glyph_warnings(fig) == []
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1 and "noto-cjk" in warned[0]
    finally:
        monkeypatch.delenv(fonts.ENV_VAR)
        fonts.reset()


def test_a_layer_out_of_range_names_plots_option(tiny_en_dir):
    """The error names plot's own option, --layer."""
    with pytest.raises(plotting.SpecError, match=r"give one of -3 to 2 \(--layer\)$"):
        plotting.review_from_text("good food", str(tiny_en_dir), layer=3)


def test_cli_plots_a_run_and_a_text(en_run, tiny_zh_dir, tmp_path):
    runner = CliRunner()
    doc = longest_doc(en_run)
    r = runner.invoke(app, ["plot", str(en_run), "--doc-id", doc, "--out", str(tmp_path / "a.html")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "a.html").is_file()
    r = runner.invoke(
        app,
        [
            "plot",
            "--text",
            SEED_TEXT,
            "--model",
            str(tiny_zh_dir),
            "--out",
            str(tmp_path / "b.png"),
            "--pairs",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "b.png").read_bytes().startswith(PNG_MAGIC)
    r = runner.invoke(app, ["plot", str(en_run), "--doc-id", "no-such-id", "--out", str(tmp_path / "c.png")])
    assert r.exit_code == 1 and "not among the scored reviews" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = runner.invoke(
        app, ["plot", str(en_run), "--doc-id", doc, "--layer", "0", "--out", str(tmp_path / "d.png")]
    )
    assert r.exit_code == 1 and "holds layers [1, 2]" in r.output
    r = runner.invoke(
        app, ["plot", str(en_run), "--doc-id", doc, "--text", "other", "--out", str(tmp_path / "e.png")]
    )
    assert r.exit_code == 1 and "--text and --model go with a run only for --pairs" in r.output


def test_options_plot_would_not_use_are_used_or_refused(tiny_zh_dir, tmp_path):
    """--doc-id names a text's review; --no-specials without --pairs is refused."""
    runner = CliRunner()
    text = ["plot", "--text", SEED_TEXT, "--model", str(tiny_zh_dir)]
    r = runner.invoke(app, [*text, "--doc-id", "my-review", "--out", str(tmp_path / "t.html")])
    assert r.exit_code == 0, r.output
    assert "review my-review" in (tmp_path / "t.html").read_text()
    r = runner.invoke(app, [*text, "--no-specials", "--out", str(tmp_path / "s.png")])
    assert r.exit_code == 1 and "--no-specials leaves [CLS] and [SEP] out" in r.output
    assert not (tmp_path / "s.png").exists()


def test_a_text_file_plots_the_text_it_holds(tiny_zh_dir, tmp_path):
    """plot --text-file: the file's text, no-break spaces and line breaks in it, gives the review --text
    gives; the file's name names it, and its table row carries the text as the file holds it."""
    text = SEED_TEXT + "\n第二行：\xa0超级差评！"
    path = tmp_path / "review.txt"
    path.write_text(text, encoding="utf-8")
    tables = {}
    for how in (["--text", text], ["--text-file", str(path)]):
        out = tmp_path / f"{how[0][2:]}.csv"
        r = CliRunner().invoke(app, ["plot", *how, "--model", str(tiny_zh_dir), "--out", str(out)])
        assert r.exit_code == 0, r.output
        tables[how[0]] = pl.read_csv(out)
    assert tables["--text-file"]["text"].unique().to_list() == [text]
    assert tables["--text-file"]["review"].unique().to_list() == ["review.txt"]
    assert tables["--text-file"].drop("review").equals(tables["--text"].drop("review"))
    r = CliRunner().invoke(
        app, ["plot", "--text", "x", "--text-file", str(path), "--model", str(tiny_zh_dir)]
    )
    assert r.exit_code == 1 and "--text or --text-file, not both" in r.output


def test_byte_level_tokens_are_shown_as_text():
    """RoBERTa's byte-level BPE pieces ('Ġcaf', 'Ã©') are labelled with their text; the oracle is the
    tokenizers library's own ByteLevel decoder. WordPiece and CJK tokens are left alone."""
    from tokenizers import ByteLevelBPETokenizer, decoders

    from bertattn_batch.analysis.spelling import readable

    texts = ["naïve café 😀 good drug", "a\xa0b … bad side effects", "好药 worked"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts * 20, vocab_size=300, min_frequency=1, show_progress=False)
    tokens = [t for text in texts for t in bpe.encode(text).tokens]
    decoded = [decoders.ByteLevel().decode([t]) for t in tokens]
    got = readable(tokens)
    for tok, want, shown in zip(tokens, decoded, got, strict=True):
        if "\ufffd" not in want and want.strip():  # a whole character or more
            assert shown == want.strip(), (tok, shown, want)
    assert readable(["good", "##ness", "好", "[UNK]"]) == ["good", "##ness", "好", "[UNK]"]
    # a WordPiece run's letters that are also shifted bytes ('ł', 'ı') stay letters: its manifest says
    assert readable(["dr", "ł", "##uka", "ı"], byte_level=False) == ["dr", "ł", "##uka", "ı"]
    assert readable(tokens, byte_level=True) == got
    # in a table, with no text around them, tokens that read alike are still told apart
    from bertattn_batch.analysis.spelling import readable_map

    shown = readable_map(["Ġgood", "good", "Ã", "©", "ä¸į"], byte_level=True)
    assert shown == {"Ġgood": "␣good", "good": "good", "Ã": "Ã", "©": "©", "ä¸į": "不"}


def test_a_run_records_whether_its_tokens_spell_bytes(en_run):
    review = plotting.load_review(en_run, short_doc(en_run))
    assert review.byte_level is False  # WordPiece: whatever letters its tokens hold, shown as they are


def test_titles_are_literal_one_line_and_bounded(en_run, tmp_path):
    """'$...$' in an id or label is text, not a formula, and a long or multi-line id is cut
    to one line: the figure stays a readable width."""
    review = plotting.load_review(en_run, short_doc(en_run))
    review.doc_id, review.label = "c$\\frac$ " + "x" * 3000 + "\nnext", "m$x^2$d"
    title = review.title()
    assert "\n" not in title and len(title) < 250 and "m$x^2$d" in title
    fig = plotting.cls_figure(review)
    assert fig.get_size_inches()[0] < 25
    png = plotting.write_review(review, tmp_path / "odd.png")
    assert png.stat().st_size > 0


def test_pairs_refuse_a_model_that_is_not_the_runs(en_run, tiny_zh_dir):
    review = plotting.load_review(en_run, longest_doc(en_run))
    with pytest.raises(
        plotting.InputError, match="is not the run's: it has other weights than the manifest records"
    ):
        plotting.add_pairs(review, en_run, model=str(tiny_zh_dir))


@pytest.mark.parametrize("store_text", [True, False])
def test_pairs_are_of_the_scored_review_with_its_inputs_gone(tiny_en_dir, tmp_path, store_text):
    """Token x token maps are computed on the token ids the run scored: a run made with --no-store-text
    whose inputs are gone draws them, and a null id's doc_id (its row number, which a real id may
    equal) does not pick another row's text."""
    src = tmp_path / "in.csv"
    src.write_text("id,text\n,first review has no id\n0,the real review zero\n")
    out = tmp_path / "run"
    r = CliRunner().invoke(
        app,
        [
            "extract",
            str(src),
            "--model",
            str(tiny_en_dir),
            "--out",
            str(out),
            "--id-col",
            "id",
            "--no-progress",
            "--store-text" if store_text else "--no-store-text",
        ],
    )
    assert r.exit_code == 0, r.output
    src.unlink()
    review = plotting.add_pairs(plotting.load_review(out, "0"), out)
    assert review.pair_tokens == ["[CLS]", "the", "real", "review", "zero", "[SEP]"]
    np.testing.assert_allclose(review.pairs[:, 0, 1:-1], review.weight, atol=1e-5)


def test_pictures_that_read(en_run, tmp_path):
    """Token x token maps of a selected range are labelled, share one colour scale and one bar; a
    PNG with --pairs holds the heads x tokens chart above them; layers are named both ways."""
    from PIL import Image

    doc = short_doc(en_run)
    review = plotting.add_pairs(plotting.load_review(en_run, doc), en_run)
    assert "layer 1 (\u22122)" in review.title()  # the 3-layer tiny model: 0-based, and from the end
    part = plotting.select(review, plotting.token_range("2:9"), specials=False)
    assert part.tokens == review.tokens[2:9] and part.scaled.shape == (review.num_heads, 7)
    assert part.pair_tokens == review.pair_tokens[3:10]  # content tokens 2..8, no [CLS]/[SEP]
    np.testing.assert_array_equal(part.pairs, review.pairs[:, 3:10, 3:10])
    fig = plotting.pairs_figure(part)
    images = [im for ax in fig.axes for im in ax.get_images()]
    assert len({im.get_clim() for im in images}) == 1  # one colour scale for every head
    assert sum(ax.get_label() == "<colorbar>" for ax in fig.axes) == 1
    png = plotting.write_review(part, tmp_path / "both.png", pairs=True)
    alone = Image.open(plotting.write_review(part, tmp_path / "cls.png"))
    assert Image.open(png).height > alone.height  # the heads x tokens chart, and the maps below it
    with pytest.raises(plotting.SpecError, match="--tokens takes a range"):
        plotting.token_range("0-40")
    with pytest.raises(plotting.SpecError, match=r"--tokens :0 selects none"):  # the range as typed
        plotting.select(review, plotting.token_range(":0"))


def _significant(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant digits, by its power of ten."""
    return 0.0 if x == 0 else round(x, digits - 1 - math.floor(math.log10(abs(x))))


@pytest.mark.parametrize("suffix", [".csv", ".xlsx"])
def test_the_seeds_table_for_a_spreadsheet(suffix, en_run, tmp_path):
    """A row per head and measure, a column per token, weights to 4 significant digits; the review's
    id, prediction, label and text on every row."""
    doc = short_doc(en_run)
    review = plotting.load_review(en_run, doc)
    pred = read_table(en_run, "predictions").to_pandas().set_index("doc_id").loc[doc]
    out = plotting.write_review(plotting.review_for_plot(en_run, doc), tmp_path / f"t{suffix}")
    if suffix == ".csv":
        read = pl.read_csv(out, infer_schema_length=None)  # the header first: polars reads it as a table
        assert read.height == 2 * review.num_heads
    else:
        import openpyxl

        book = openpyxl.load_workbook(out)
        sheets = [list(book[m].iter_rows(values_only=True)) for m in ("scaled", "raw")]
        read = pl.DataFrame([r for s in sheets for r in s[1:]], schema=list(sheets[0][0]), orient="row")
        assert book["review"]["A1"].value == review.title()
    about = ["review", "predicted", "probability", "label", "head", "measure"]
    assert read.columns[:6] == about and read.columns[-1] == "text"
    assert read.columns[6:-1] == [f"{p} {t}" for p, t in zip(review.positions, review.tokens, strict=True)]
    assert read.select("review", "predicted", "label", "text").unique().rows() == [
        (doc, pred["pred_label"], pred["label"], pred["text"])
    ]
    assert read["probability"][0] == _significant(float(pred["pred_prob"]))
    for measure, values in (("scaled", review.scaled), ("raw", review.weight)):
        rows = read.filter(pl.col("measure") == measure).sort("head")
        assert rows["head"].to_list() == list(range(review.num_heads))
        expected = [[_significant(float(v)) for v in head] for head in values]
        assert rows.select(read.columns[6:-1]).rows() == [tuple(r) for r in expected]


def test_the_plot_command_takes_negative_layers_token_ranges_and_leaves_out_the_specials(en_run, tmp_path):
    """What a user types: the layer counted from the end, a range of content tokens, the maps with and
    without [CLS] and [SEP]; the HTML page holds just those tokens and names the layer both ways (what
    the maps hold is checked in test_pictures_that_read)."""
    import re

    doc = short_doc(en_run)
    review = plotting.load_review(en_run, doc)
    args = ["plot", str(en_run), "--doc-id", doc, "--layer", "-2", "--tokens", "2:6", "--pairs"]
    pages = {}
    for specials in ("--specials", "--no-specials"):
        out = tmp_path / f"{specials}.html"
        r = CliRunner().invoke(app, [*args, specials, "--out", str(out)])
        assert r.exit_code == 0, r.output
        pages[specials] = out.read_text(encoding="utf-8")
    html = pages["--no-specials"]
    assert "layer 1 (\u22122)" in html  # the 3-layer tiny model: stored 1, asked -2
    first_table = html.split("</table>")[0]
    shown = [unescape(t) for t in re.findall(r'<th class="tok">(.*?)</th>', first_table)]
    assert shown == review.tokens[2:6]
    assert pages["--specials"] != html  # the maps (pictures) differ; their rows are checked above
    r = CliRunner().invoke(app, [*args[:-3], "--tokens", "0-4", "--out", str(tmp_path / "x.html")])
    assert r.exit_code == 1 and "--tokens takes a range" in r.output


@pytest.mark.parametrize("doc_id", ["北京市朝阳区餐厅评论第00001号" * 2, "समीक्षा-संख्या-एक-सौ-बीस"])
def test_the_whole_title_is_drawn_whatever_its_script(zh_run, doc_id):
    """The title fits the figure whatever its script: CJK characters (two cells wide) or
    characters no font here draws (written as U+XXXX codes)."""
    import dataclasses

    review = plotting.select(plotting.load_review(zh_run, "seed"), slice(0, 4))  # a short review
    review = dataclasses.replace(review, doc_id=doc_id)
    fig = plotting.cls_figure(review)
    fig.canvas.draw()
    (title,) = fig.texts
    assert title.get_text().endswith(f"label {review.label}")
    assert title.get_window_extent().x1 <= fig.bbox.x1


def test_chinese_is_drawn_in_the_chinese_face_of_a_font_collection():
    """Of a font collection, the simplified Chinese face draws (the first face, Japanese,
    draws 骨 and 直 in their Japanese forms), in figures and in the font that pages embed."""
    fonts.reset()
    found = fonts.cjk_font()
    if found is None or found.path.suffix != ".ttc":
        pytest.skip("no CJK font collection here")
    assert found.name.endswith(" SC")
    from fontTools.ttLib import TTFont

    assert TTFont(str(found.path), fontNumber=found.index)["name"].getDebugName(1) == found.name
    import matplotlib

    with figures.drawing("骨"):
        assert found.name in matplotlib.rcParams["font.family"]


def test_a_cjk_font_setting_that_is_no_font_is_said(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(fonts.ENV_VAR, str(tmp_path / "missing.ttf"))
    fonts.reset()
    try:
        with caplog.at_level(logging.WARNING, logger="bertattn_batch.render.fonts"):
            fonts.cjk_font()
        assert f"{fonts.ENV_VAR}={tmp_path / 'missing.ttf'} is no font file" in caplog.text
    finally:
        monkeypatch.delenv(fonts.ENV_VAR)
        fonts.reset()


def test_a_missing_glyph_that_is_not_cjk_gets_no_cjk_advice(caplog):
    fonts.reset()
    with caplog.at_level(logging.WARNING, logger="bertattn_batch.render.fonts"):
        assert fonts.label("कक") == "U+0915U+0915"
    assert "install a font that has them" in caplog.text and "noto-cjk" not in caplog.text
    fonts.reset()


def test_drawing_leaves_the_users_matplotlib_as_it_was(zh_run):
    """Drawing leaves a notebook's backend, fonts, math text and pyplot figures as they are."""
    import matplotlib
    import matplotlib.pyplot as plt

    before = matplotlib.get_backend()
    plt.switch_backend("svg")  # a backend of the user's own
    with matplotlib.rc_context({"font.family": ["serif"], "text.parse_math": True}):
        plt.figure()  # pyplot in use, as in a notebook
        plotting.review_png(plotting.load_review(zh_run, "seed"))
        plotting.plot_review(zh_run, "seed")
        assert matplotlib.rcParams["font.family"] == ["serif"] and matplotlib.rcParams["text.parse_math"]
        assert plt.get_fignums() == [1]  # none of its figures left with pyplot
        assert matplotlib.get_backend() == "svg"
        plt.close("all")
    plt.switch_backend(before)


def test_a_row_number_given_as_an_int_finds_its_review(tiny_en_dir, tmp_path):
    """Without an id column a review's id is its row number, stored as text: 0 finds review "0"."""
    src = tmp_path / "r.csv"
    src.write_text("text\na good drug\nslow and bad\n")
    run_job(JobSpec(inputs=[str(src)], model=str(tiny_en_dir), out=str(tmp_path / "run"), progress=False))
    assert plotting.load_review(tmp_path / "run", 1).doc_id == "1"


def test_plot_review_returns_figures_and_writes_nothing(en_run, tmp_path, monkeypatch):
    """The notebook API: the package's plot_review gives the heads x tokens figure of the stored weights
    (and with pairs=True the token x token maps too); only write_review writes a file."""
    import bertattn_batch

    monkeypatch.chdir(tmp_path)
    doc = short_doc(en_run)
    fig = bertattn_batch.plot_review(en_run, doc)
    drawn = np.concatenate([np.asarray(ax.images[0].get_array()) for ax in fig.axes if ax.images], axis=1)
    np.testing.assert_array_equal(drawn, stored(en_run, doc, 1, "weight_scaled"))
    heads_fig, maps = bertattn_batch.plot_review(en_run, doc, pairs=True, tokens="0:5")
    assert [t.get_text() for t in heads_fig.axes[0].get_xticklabels()] == plotting.load_review(
        en_run, doc
    ).tokens[:5]
    assert maps.axes[0].images[0].get_array().shape == (7, 7)  # [CLS], 5 tokens, [SEP]
    assert list(tmp_path.iterdir()) == []


_CODE = """import pathlib
from transformers import BertForSequenceClassification
class Custom(BertForSequenceClassification):
    def __init__(self, config):
        pathlib.Path({marker!r}).write_text("ran")
        super().__init__(config)
"""


def test_plot_and_faithfulness_run_a_model_folders_code_only_when_their_caller_trusts_it(
    tiny_en_dir, drug_sample, tmp_path
):
    """A run's model folder whose config names its own code (auto_map): plot (--pairs, --text) and
    faithfulness import it only with --trust-remote-code on their own command line, whatever the run
    recorded; and the code is part of the model: edited since the run, the folder is not the run's."""
    import json
    import shutil

    model = shutil.copytree(tiny_en_dir, tmp_path / "model")
    marker, runner = tmp_path / "ran", CliRunner()
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoModelForSequenceClassification": "modeling_custom.Custom"}
    (model / "config.json").write_text(json.dumps(config))
    (model / "modeling_custom.py").write_text(_CODE.format(marker=str(marker)))
    run = tmp_path / "run"
    args = ["extract", str(drug_sample), "--model", str(model), "--out", str(run), "--id-col", "doc_id",
            "--limit", "12", "--no-progress", "--trust-remote-code"]  # fmt: skip
    assert runner.invoke(app, args).exit_code == 0
    assert marker.exists()
    doc = short_doc(run)
    plots = {
        "pairs": ["plot", str(run), "--doc-id", doc, "--pairs", "--out", str(tmp_path / "p.png")],
        "text": ["plot", "--text", "good", "--model", str(model), "--out", str(tmp_path / "t.png")],
        "faithfulness": ["faithfulness", str(run), "--sample", "2", "--device", "cpu"],
    }
    for name, command in plots.items():
        for trusted in (False, True):
            marker.unlink(missing_ok=True)
            r = runner.invoke(app, command + ["--trust-remote-code"] * trusted)
            assert r.exit_code == 0, (name, r.output)
            assert marker.exists() == trusted, (name, trusted)
    (model / "modeling_custom.py").write_text(_CODE.format(marker=str(marker)) + "# edited\n")
    for name in ("pairs", "faithfulness"):
        r = runner.invoke(app, plots[name] + ["--trust-remote-code"])
        assert r.exit_code == 1 and "has another config.json or Python code than the manifest" in r.output, (
            r.output
        )
