"""Words of Chinese reviews: the word rows equal jieba's own segmentation (``jieba.tokenize`` spans) applied
to the tokens table by hand, on reviews the tokenizer was not built from; a user dictionary adds words."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import jieba
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import SEED_TEXT
from helpers import read_table

import bertattn_batch.analysis.aggregate as agg
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job

MIXED = "这台ThinkPad才1999元，质量不错！"


@pytest.fixture(scope="module")
def zh_run(tiny_zh_dir, zh_rows, tmp_path_factory) -> Path:
    """Held-out reviews (the tiny tokenizer saw the first 3000), the seed's review and a mixed one."""
    base = tmp_path_factory.mktemp("words")
    rows = [dict(r) for r in zh_rows[-40:]]
    rows += [{"doc_id": "seed", "text": SEED_TEXT, "label": "negative"}]
    rows += [{"doc_id": "mixed", "text": MIXED, "label": "positive"}]
    pq.write_table(pa.Table.from_pylist(rows), base / "reviews.parquet")
    spec = JobSpec(
        inputs=InputSpec([str(base / "reviews.parquet")], id_col="doc_id", label_col="label"),
        model=str(tiny_zh_dir),
        out=str(base / "run"),
        window=16,
        progress=False,
    )
    run_job(spec)
    return base / "run"


def oracle_words(run: Path, user_dict: str | None = None) -> dict[tuple, list]:
    """(doc_id, layer, head) -> [(word, raw, norm, scaled)] in word order: jieba's spans, each token in the
    span holding its first character, weights summed, scaled min-max over the review's words."""
    seg = jieba.Tokenizer()
    if user_dict:
        seg.load_userdict(user_dict)
    texts = {
        p["doc_id"]: p["text"] for p in read_table(run, "predictions").to_pylist() if p["status"] == "ok"
    }
    spans = {d: list(seg.tokenize(t)) for d, t in texts.items()}
    starts = {(t["doc_id"], t["position"]): t["start"] for t in read_table(run, "tokens").to_pylist()}
    acc: dict[tuple, dict] = defaultdict(dict)
    for a in read_table(run, "cls_attention").to_pylist():
        at = starts[(a["doc_id"], a["position"])]
        i = next(i for i, (_, s, e) in enumerate(spans[a["doc_id"]]) if s <= at < e)
        word = acc[(a["doc_id"], a["layer"], a["head"])].setdefault(
            i, [spans[a["doc_id"]][i][0].lower(), 0, 0]
        )
        word[1] += a["weight"]
        word[2] += a["weight_norm"]
    out = {}
    for key, words in acc.items():
        raw = np.array([w[1] for _, w in sorted(words.items())])
        lo, hi = raw.min(), raw.max()
        scaled = (raw - lo) / (hi - lo) if hi > lo else np.zeros_like(raw)
        out[key] = [(w[0], w[1], w[2], s) for (_, w), s in zip(sorted(words.items()), scaled, strict=True)]
    return out


def word_rows_of(run: Path, user_dict: str | None = None) -> dict[tuple, list]:
    """The same, from the code under test: every part's word rows by doc_id."""
    out: dict[tuple, list] = {}
    for part in agg.committed_parts(run):
        rows = agg.review_rows(part, text=True)
        words = rows.words("jieba", user_dict).join(
            rows.reviews.lazy().select("review", "doc_id"), on="review"
        )
        for (doc, layer, head), g in (
            words.collect().sort("position").group_by(["doc_id", "layer", "head"], maintain_order=True)
        ):
            out[(doc, layer, head)] = list(
                zip(g["token"], g["weight"], g["weight_norm"], g["weight_scaled"], strict=True)
            )
    return out


def _same(got: dict[tuple, list], want: dict[tuple, list]) -> None:
    assert got.keys() == want.keys() and len(want) > 100
    for key, rows in want.items():
        assert [w for w, *_ in got[key]] == [w for w, *_ in rows], key
        np.testing.assert_allclose([r[1:] for r in got[key]], [r[1:] for r in rows], rtol=1e-6, atol=1e-9)


def test_word_rows_equal_jiebas_segmentation_of_the_tokens(zh_run):
    assert json.loads((zh_run / "manifest.json").read_text())["model"]["words"] == "jieba"
    want = oracle_words(zh_run)
    _same(word_rows_of(zh_run), want)
    mixed = [w for w, *_ in want[("mixed", 0, 0)]]
    assert {"thinkpad", "1999", "不错", "质量"} <= set(mixed)
    seed = [w for w, *_ in want[("seed", 0, 0)]]
    assert {"服务态度", "差评"} <= set(seed)


def test_aggregate_counts_jieba_words(zh_run):
    """The table's word rows (split 'all') equal the oracle's rows counted and averaged by word."""
    table = agg.aggregate(zh_run, min_reviews=1).table.filter(
        (pl.col("unit") == "word") & (pl.col("split") == "all")
    )
    acc: dict[tuple, list] = defaultdict(lambda: [0, 0.0, 0.0])
    for (_, layer, head), rows in oracle_words(zh_run).items():
        for word, raw, _, scaled in rows:
            a = acc[(layer, head, word)]
            a[0], a[1], a[2] = a[0] + 1, a[1] + raw, a[2] + scaled
    got = {(r["layer"], r["head"], r["token"]): r for r in table.iter_rows(named=True)}
    assert got.keys() == acc.keys()
    for key, (n, raw, scaled) in acc.items():
        assert got[key]["n_occurrences"] == n
        assert got[key]["mean_weight"] == pytest.approx(raw / n, rel=1e-9)
        assert got[key]["mean_scaled"] == pytest.approx(scaled / n, rel=1e-9, abs=1e-12)


def test_a_user_dictionary_adds_its_words(zh_run, tmp_path):
    user = tmp_path / "user.txt"
    user.write_text("超级差评 100 n\n服务态度超级差 50\n", encoding="utf-8")
    want = oracle_words(zh_run, str(user))
    _same(word_rows_of(zh_run, str(user)), want)
    assert "超级差评" in [w for w, *_ in want[("seed", 0, 0)]]
    result = agg.aggregate(zh_run, min_reviews=1, words="jieba", user_dict=str(user), into=tmp_path / "agg")
    assert "超级差评" in result.table.filter(pl.col("unit") == "word")["token"].to_list()


def test_words_none_and_wordpiece_are_chosen_per_aggregate(zh_run, tmp_path):
    none = agg.aggregate(zh_run, min_reviews=1, words="none", into=tmp_path / "none")
    assert set(none.table["unit"]) == {"token"} and none.options["words"] is None
    pieces = agg.aggregate(zh_run, min_reviews=1, words="wordpiece", into=tmp_path / "wp")
    words = pieces.table.filter(pl.col("unit") == "word")["token"].to_list()
    assert "thinkpad" in words and "不错" not in words  # ## pieces join Latin letters, never characters
