"""Pictures and tables of one review, drawn from made-up attention (no model): every token labelled,
rows of even length, rounded tables with the review's text, a text read from a file as it is."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from bertattn_batch.config import JobSpec, from_dict, parse_label_map
from bertattn_batch.errors import InputError, SpecError
from bertattn_batch.render import figures, plot, report
from bertattn_batch.render.plot import ReviewAttention


def made_up(n: int, heads: int = 3, pairs: bool = True) -> ReviewAttention:
    """A review of ``n`` content tokens with random rows (and token x token maps with [CLS]/[SEP])."""
    rng = np.random.default_rng(n)
    weight = rng.dirichlet(np.ones(n), size=heads)  # (H, n)
    lo, hi = weight.min(1, keepdims=True), weight.max(1, keepdims=True)
    tokens = [chr(0x4E00 + i) for i in range(n)]
    review = ReviewAttention(
        doc_id="d1", layer=0, tokens=tokens, token_ids=list(range(n)), positions=list(range(1, n + 1)),
        weight=weight, scaled=(weight - lo) / (hi - lo), pred_label="negative", prob=0.93, label="2",
        text="上菜慢，\xa0服务态度差\n第二行",
    )  # fmt: skip
    if pairs:
        review.pairs = rng.dirichlet(np.ones(n + 2), size=(heads, n + 2))  # (H, S, S)
        review.pair_tokens = ["[CLS]", *tokens, "[SEP]"]
    return review


@pytest.mark.parametrize(("n", "most"), [(1, 64), (64, 64), (65, 64), (69, 64), (200, 64), (74, 40)])
def test_spans_are_the_fewest_of_even_length(n, most):
    spans = figures.spans(n, most)
    lengths = [len(s) for s in spans]
    assert [i for s in spans for i in s] == list(range(n))
    assert len(spans) == math.ceil(n / most) and max(lengths) <= most and max(lengths) - min(lengths) <= 1


def test_heads_by_tokens_rows_wrap_evenly():
    review = made_up(69, pairs=False)
    fig = plot.cls_figure(review)
    rows = [[t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes[:-1]]  # the colour bar last
    assert [len(r) for r in rows] == [35, 34]  # not 64 and a row of five
    assert [t for r in rows for t in r] == review.tokens


@pytest.mark.parametrize("n", [20, 100])
def test_token_by_token_maps_label_every_token(n):
    """Every panel labels each of its rows and columns; a long review is cut into windows along the
    diagonal, each window's panel holding exactly those rows and columns of the head's map."""
    review = made_up(n)
    fig = plot.pairs_figure(review)
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.get_images()]
    size = n + 2
    windows = figures.spans(size, plot.PAIR_WINDOW)
    assert len(panels) == len(windows) * review.num_heads
    seen: dict[int, list[str]] = {}
    for ax in panels:
        (image,) = ax.get_images()
        x = [t.get_text() for t in ax.get_xticklabels()]
        y = [t.get_text() for t in ax.get_yticklabels()]
        assert x == y and len(x) == image.get_array().shape[0] == image.get_array().shape[1]
        head = int(ax.get_title().split()[1])
        start = len(seen.get(head, []))
        np.testing.assert_array_equal(
            image.get_array(), review.pairs[head, start : start + len(x), start : start + len(x)]
        )
        seen.setdefault(head, []).extend(x)
    assert all(labels == review.pair_tokens for labels in seen.values())
    scales = {im.get_clim() for ax in panels for im in ax.get_images()}
    assert len(scales) == 1  # one colour scale, up to the largest weight drawn
    assert scales.pop()[1] == max(float(im.get_array().max()) for ax in panels for im in ax.get_images())


def test_a_table_holds_rounded_weights_and_the_review(tmp_path):
    review = made_up(12, pairs=False)
    review.weight[0, 0] = 0.000123456789
    out = plot.write_review(review, tmp_path / "t.csv")
    read = pl.read_csv(out)
    assert read["text"].unique().to_list() == [review.text]  # its no-break space and line break kept
    assert read.select("review", "predicted", "probability", "label").unique().rows() == [
        ("d1", "negative", 0.93, 2)
    ]
    raw = read.filter(pl.col("measure") == "raw").sort("head").select(read.columns[6:-1]).to_numpy()
    assert raw[0, 0] == 0.0001235
    digits = [len(f"{v:e}".split("e")[0].replace(".", "").rstrip("0")) for v in raw.ravel()]
    assert max(digits) <= 4
    np.testing.assert_allclose(raw, review.weight, rtol=5e-4)


def test_a_text_file_is_read_as_it_is(tmp_path):
    path = tmp_path / "review.txt"
    path.write_bytes("\ufeff上菜慢，\xa0服务\r\n态度差\n".encode())
    assert plot.read_text_file(path) == "上菜慢，\xa0服务\r\n态度差\n"  # only the byte-order mark dropped
    with pytest.raises(SpecError, match="--text or --text-file, not both"):
        plot.read_text_file(path, "text")
    path.write_bytes("差评".encode("gb18030"))
    with pytest.raises(InputError, match="not UTF-8 text"):
        plot.read_text_file(path)
    with pytest.raises(InputError, match="cannot read the text file"):
        plot.read_text_file(tmp_path / "missing.txt")


def test_a_label_map_is_parsed_and_checked():
    assert parse_label_map(" 1, 2 = negative ; 4,5=positive;") == {
        "1": "negative", "2": "negative", "4": "positive", "5": "positive"
    }  # fmt: skip
    assert parse_label_map(None) == {}
    for bad in ("", "1,2", "=negative", "1,,2=negative", "1=negative; 1=positive"):
        with pytest.raises(SpecError, match="label_map"):
            parse_label_map(bad)
    with pytest.raises(SpecError, match="maps to 'good', which the model does not predict"):
        parse_label_map("5=good", ["negative", "positive"])
    job = {
        "inputs": ["r.parquet"],
        "model": "m",
        "out": "o",
        "label_col": "stars",
        "label_map": "1,2=negative",
    }
    assert from_dict(JobSpec, job).to_dict()["label_map"] == "1,2=negative"  # what the manifest records
    with pytest.raises(SpecError, match="label_map"):
        from_dict(JobSpec, {**job, "label_map": "1,2"})
    del job["label_col"]
    with pytest.raises(SpecError, match="label_map maps the source's labels: name their column, label_col"):
        from_dict(JobSpec, job)


def test_a_label_the_map_leaves_out_stays_out_of_the_accuracy():
    """Even where it is spelled as one of the model's labels: a source that mixes stars with words."""
    preds = pl.DataFrame({
        "status": ["ok"] * 6, "label": ["1", "positive", "3", None, "5", "5"],
        "pred_label": ["negative", "positive", "negative", "positive", "positive", "negative"],
    })  # fmt: skip
    labels = ["negative", "positive"]
    mapped = preds.with_columns(
        label=report.mapped_labels(pl.col("label"), {"1": "negative", "5": "positive"}, labels)
    )
    assert mapped["label"].to_list() == [
        "negative",
        "positive (not in the map)",
        "3",
        None,
        "positive",
        "positive",
    ]
    conf = report.confusion(mapped, labels)
    assert (conf["n_known"], conf["n_unknown"], conf["accuracy"]) == (3, 2, 2 / 3)
    assert report.mapped_labels(pl.col("label"), {}, labels).meta.eq(pl.col("label"))  # no map: as they are


def test_examples_are_typical_of_their_label_not_its_capped_largest_margins():
    """A third of the reviews sit at the margin label smoothing caps: the examples are those nearest
    the median margin, correctly predicted before those whose label the model does not know."""
    margins = [0.88] * 4 + [0.795, 0.815, 0.79, 0.60, 0.50, 0.82, 0.84]
    preds = pl.DataFrame(
        {
            "doc_id": [f"d{i}" for i in range(len(margins))],
            "status": "ok",
            "label": ["negative"] * 9 + ["3", "negative"],
            "pred_label": "negative",
            "probs": [[(1 + m) / 2, (1 - m) / 2] for m in margins],
            "n_tokens": 50,
        }
    )
    assert sorted(margins)[len(margins) // 2] == 0.82  # the median: d9's, whose label is no model's
    chosen = report.pick(preds, 2, ["negative", "positive"])
    assert [e.doc_id for e in chosen] == ["d5", "d10"]  # 0.005 and 0.02 from it
    assert report.misclassified(preds, 2, ["negative", "positive"]) == []
    wrong = preds.with_columns(label=pl.Series(["positive"] * 2 + ["negative"] * 9))
    assert [e.doc_id for e in report.misclassified(wrong, 1, ["negative", "positive"])] == ["d0"]
