"""Faithfulness per head: the table equals a direct computation with transformers' own model, the
sample and the random ranking are reproducible under their seed, and the pieces do what they say."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import read_table
from transformers import AutoModelForSequenceClassification

from bertattn_batch import schema
from bertattn_batch.analysis import faithfulness as fa
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.errors import ModelError, SpecError


def tiny_run(tiny_en_dir, drug_rows, tmp_path_factory, name: str, **options) -> Path:
    """A run of the tiny model over 12 drug reviews, 48 tokens at most, with the job's ``options``."""
    base = tmp_path_factory.mktemp(name)
    src = base / "reviews.parquet"
    pq.write_table(pa.Table.from_pylist([dict(r) for r in drug_rows[:12]]), src)
    out = base / "run"
    run_job(JobSpec(InputSpec([str(src)], id_col="doc_id"), str(tiny_en_dir), str(out), max_length=48,
                    progress=False, **options))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def run_dir(tiny_en_dir, drug_rows, tmp_path_factory):
    return tiny_run(tiny_en_dir, drug_rows, tmp_path_factory, "faith", layers=[-2, 0], value_zeroing=True)


@pytest.fixture(scope="module")
def result(run_dir):
    return fa.faithfulness(run_dir, sample=5, seed=3, device="cpu")


def _direct(model, ids: list[int], ranking: list[int], k: float, label: int) -> tuple[float, float]:
    """Comprehensiveness and sufficiency of one review, written out with the model itself."""
    content = ids[1:-1]
    top = set(ranking[: math.ceil(k * len(content))])
    without = [ids[0], *[t for j, t in enumerate(content) if j not in top], ids[-1]]
    alone = [ids[0], *[t for j, t in enumerate(content) if j in top], ids[-1]]

    def p(seq: list[int]) -> float:
        with torch.no_grad():
            return torch.softmax(model(input_ids=torch.tensor([seq])).logits, -1)[0, label].item()

    return p(ids) - p(without), p(ids) - p(alone)


def test_the_table_equals_a_direct_computation(run_dir, result, tiny_en_dir):
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_en_dir, attn_implementation="eager"
    ).eval()
    meta = pq.read_schema(result.path).metadata
    docs = json.loads(meta[b"doc_ids"])
    assert len(docs) == 5 and result.options["n_reviews"] == 5
    preds = {p["doc_id"]: p for p in read_table(run_dir, "predictions").to_pylist()}
    attn = pl.from_arrow(read_table(run_dir, "cls_attention"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_en_dir)
    for score, layer, head in (("weight", 1, 2), ("weight_norm", 0, 1), ("value_zeroing", 1, None)):
        for k in fa.FRACTIONS:
            comps, suffs = [], []
            for doc in docs:
                rows = attn.filter(
                    (pl.col("doc_id") == doc) & (pl.col("layer") == layer) & (pl.col("head") == (head or 0))
                )
                rows = rows.sort("position")
                ranking = sorted(range(rows.height), key=lambda j: (-rows[score][j], j))
                ids = tok(preds[doc]["text"], truncation=True, max_length=48)["input_ids"]
                c, s = _direct(model, ids, ranking, k, preds[doc]["pred_id"])
                comps.append(c)
                suffs.append(s)
            got = result.table.filter(
                (pl.col("score") == score)
                & (pl.col("layer") == layer)
                & (pl.col("head").eq_missing(head))
                & (pl.col("k") == k)
            )
            assert got.height == 1
            assert got["comprehensiveness"][0] == pytest.approx(np.mean(comps), abs=1e-5)
            assert got["sufficiency"][0] == pytest.approx(np.mean(suffs), abs=1e-5)


def test_aopc_rows_are_the_means_over_k_and_references_have_no_head(result):
    t = result.table
    assert set(t["score"]) == {"weight", "weight_norm", "value_zeroing", "random", "gradient_x_input"}
    for (score, layer, head), group in t.group_by("score", "layer", "head"):
        assert group.height == len(fa.FRACTIONS) + 1
        per_k = group.filter(pl.col("k").is_not_null())
        aopc = group.filter(pl.col("k").is_null())
        assert aopc["comprehensiveness"][0] == pytest.approx(per_k["comprehensiveness"].mean(), abs=1e-12)
        assert (layer is None) == (score in fa.REFERENCES)
        assert (head is None) == (score in fa.REFERENCES or score in fa.LAYER_SCORES)
    # weight and weight_norm per layer and head, value zeroing per layer, and the two references
    assert t.height == (2 * 2 * 4 + 2 + 2) * (len(fa.FRACTIONS) + 1)
    assert schema.check(pq.read_schema(result.path), "head_faithfulness") == []
    assert "comprehensiveness" in result.summary()


def test_the_sample_and_the_random_ranking_follow_their_seed(run_dir, result):
    again = fa.faithfulness(run_dir, sample=5, seed=3, device="cpu")
    assert again.table.equals(result.table)
    other = fa.faithfulness(run_dir, sample=5, seed=4, device="cpu")
    random = pl.col("score") == "random"
    assert not other.table.filter(random).equals(result.table.filter(random))
    for sample, seed, message in [
        (0, 0, "--sample must be at least 1, got 0"),
        (5, -1, r"--seed must be in \[0"),
    ]:
        with pytest.raises(SpecError, match=message):
            fa.faithfulness(run_dir, sample=sample, seed=seed, device="cpu")


def test_the_sample_is_stratified_by_predicted_label():
    preds = pl.DataFrame(
        {"doc_id": [f"d{i:03d}" for i in range(100)], "pred_label": ["neg"] * 70 + ["pos"] * 30}
    )
    picked = fa.stratified_sample(preds, 10, seed=0)
    assert picked["pred_label"].value_counts().sort("pred_label").rows() == [("neg", 7), ("pos", 3)]
    assert picked.equals(fa.stratified_sample(preds.reverse(), 10, seed=0))  # whatever the input order
    rare = preds.with_columns(
        pred_label=pl.when(pl.col("doc_id") == "d000").then(pl.lit("mid")).otherwise("pred_label")
    )
    assert set(fa.stratified_sample(rare, 10, seed=0)["pred_label"]) == {"neg", "pos", "mid"}
    assert fa.stratified_sample(rare, 10, seed=0).height == 10
    assert fa.stratified_sample(preds, 500, seed=0).height == 100


def test_ranking_breaks_ties_by_position_and_erasure_keeps_the_ends():
    scores = np.array([0.2, 0.5, 0.5, 0.1])
    assert fa.top_tokens(scores, 0.5).tolist() == [1, 2]
    assert fa.top_tokens(scores, 0.01).tolist() == [1]  # ⌈0.04⌉ = 1
    ids = np.array([101, 7, 8, 9, 10, 102])
    without, alone = fa.erased(ids, np.array([2, 0]))
    assert without.tolist() == [101, 8, 10, 102] and alone.tolist() == [101, 7, 9, 102]


def test_the_runs_model_is_found_from_any_directory_or_given_where_it_moved(
    run_dir, result, tiny_en_dir, tmp_path, monkeypatch
):
    """A job that named its model by a relative path: the run records the folder's absolute path, so
    faithfulness finds it from elsewhere; a moved model is named as the run's, and --model finds it."""
    import shutil

    monkeypatch.chdir(tiny_en_dir.parent)
    out = tmp_path / "run"
    spec = json.loads((run_dir / "manifest.json").read_text())["spec"]
    run_job(
        JobSpec(
            inputs=InputSpec(spec["inputs"], id_col="doc_id"),
            model=tiny_en_dir.name,
            out=str(out),
            layers=[-2, 0],
            max_length=48,
            value_zeroing=True,
            progress=False,
        )
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["spec"]["model"] == manifest["model"]["source"] == str(tiny_en_dir)
    monkeypatch.chdir(tmp_path)
    got = fa.faithfulness(out, sample=5, seed=3, device="cpu")
    assert got.table.equals(result.table)

    moved = shutil.copytree(tiny_en_dir, tmp_path / "moved")
    manifest["spec"]["model"] = manifest["model"]["source"] = "models/gone"  # as a run made elsewhere
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelError, match="the model the run recorded; pass it with --model"):
        fa.faithfulness(out, sample=5, seed=3, device="cpu")
    assert fa.faithfulness(out, sample=5, seed=3, device="cpu", model=str(moved)).table.equals(result.table)


def test_a_run_it_cannot_write_to_is_said_before_anything_is_measured(run_dir, tmp_path, monkeypatch):
    """It measured for minutes, then failed at the write with pyarrow's own words."""
    import shutil

    from bertattn_batch.errors import WriteError

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    shutil.rmtree(run / "faithfulness", ignore_errors=True)
    (run / "faithfulness").write_text("a file where its folder goes")  # as a read-only place, for root too
    monkeypatch.setattr(fa, "load_run_model", lambda *a, **k: pytest.fail("measured before the check"))
    with pytest.raises(WriteError, match=r"cannot write the faithfulness table into .*faithfulness: "):
        fa.faithfulness(run, sample=5, seed=3, device="cpu")


def test_a_run_that_is_not_complete_is_said_to_be_sampled_in_part(run_dir, tmp_path, caplog):
    import json
    import logging
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps(manifest | {"status": "interrupted"}))
    with caplog.at_level(logging.WARNING, logger="bertattn_batch.analysis.faithfulness"):
        fa.faithfulness(run, sample=5, seed=3, device="cpu")
    assert "is interrupted: its committed parts alone are sampled" in caplog.text


def test_a_run_without_its_text_is_measured_from_its_tokens_with_its_inputs_gone(run_dir, result, tmp_path):
    """The reviews erased are the token ids the run scored, so a --no-store-text run whose inputs are
    gone (a stream, a deleted file) is measured, and measures what a run with its text does."""
    import shutil

    spec = json.loads((run_dir / "manifest.json").read_text())["spec"]
    src = shutil.copy(spec["inputs"][0], tmp_path / "reviews.parquet")
    out = tmp_path / "run"
    run_job(
        JobSpec(
            inputs=InputSpec([src], id_col="doc_id"),
            model=spec["model"],
            out=str(out),
            layers=[-2, 0],
            max_length=48,
            value_zeroing=True,
            store_text=False,
            progress=False,
        )
    )
    assert read_table(out, "predictions")["text"].null_count == 12
    (tmp_path / "reviews.parquet").unlink()
    assert fa.faithfulness(out, sample=5, seed=3, device="cpu").table.equals(result.table)


def test_a_tokens_table_short_of_a_reviews_positions_is_named(run_dir, tmp_path):
    import shutil

    from bertattn_batch.errors import RunDirError

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    for part in (run / "tokens").glob("*.parquet"):
        table = pl.read_parquet(part)
        moved = pl.when(pl.col("position") == 3).then(99).otherwise(pl.col("position")).alias("position")
        pq.write_table(schema.cast(table.with_columns(moved).to_arrow(), "tokens"), part)  # rows kept
    with pytest.raises(RunDirError, match=r"the tokens table does not hold positions 1 to \d+ of review"):
        fa.faithfulness(run, sample=5, seed=3, device="cpu")


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ("hidden_act", "it has another config.json or Python code than the manifest records"),
        ("id2label", "its label names differ from what the manifest records"),
    ],
)
def test_a_model_folder_edited_since_the_run_is_not_the_runs(run_dir, tiny_en_dir, tmp_path, edit, said):
    """Beside the same weights, a config.json or label names edited since the run measured another
    model's faithfulness (and plot --pairs drew it, or failed in numpy) without a word."""
    import shutil

    from bertattn_batch.errors import InputError

    model = shutil.copytree(tiny_en_dir, tmp_path / "model")
    settings = json.loads((model / "config.json").read_text())
    if edit == "id2label":
        settings[edit] = {k: f"new {v}" for k, v in settings[edit].items()}
    else:
        settings[edit] = "relu"
    (model / "config.json").write_text(json.dumps(settings))
    with pytest.raises(InputError, match=f"is not the run's: {said}; pass the run's model with --model"):
        fa.faithfulness(run_dir, sample=2, seed=3, device="cpu", model=str(model))


def test_a_tokenizer_that_does_otherwise_is_warned_of_and_the_runs_token_ids_scored(
    run_dir, result, tiny_en_dir, tmp_path, caplog
):
    """The run's stored token ids are what is erased: a tokenizer edited since (or read by another
    tokenizers version) changes nothing measured, but is said."""
    import logging
    import shutil

    model = shutil.copytree(tiny_en_dir, tmp_path / "model")
    settings = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**settings, "do_lower_case": False}))
    with caplog.at_level(logging.WARNING):
        got = fa.faithfulness(run_dir, sample=5, seed=3, device="cpu", model=str(model))
    assert got.table.equals(result.table)
    assert "does otherwise than the run's (edited since, or another tokenizers version)" in caplog.text


@pytest.mark.parametrize("given", [{}, {"trust_remote_code": True, "allow_pickle": True}])
def test_trust_is_the_callers_never_the_runs(run_dir, tmp_path, monkeypatch, given):
    """A run whose manifest says to trust its model's code is loaded without trust unless the caller
    gives it: a shared run directory cannot make faithfulness import a model folder's Python."""
    import json
    import shutil

    from bertattn_batch.model import Classifier

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["spec"].update(trust_remote_code=True, allow_pickle=True)
    (run / "manifest.json").write_text(json.dumps(manifest))
    seen, load = [], Classifier.load
    monkeypatch.setattr(Classifier, "load", lambda *a, **k: seen.append(k) or load(*a, **k))
    fa.faithfulness(run, sample=3, seed=3, device="cpu", **given)
    assert [(k["trust_remote_code"], k["allow_pickle"]) for k in seen] == [(bool(given), bool(given))]


@pytest.fixture(scope="module")
def alti_result(tiny_en_dir, drug_rows, tmp_path_factory):
    out = tiny_run(tiny_en_dir, drug_rows, tmp_path_factory, "faith_alti", contributions="alti")
    return out, fa.faithfulness(out, sample=5, seed=3, device="cpu")


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks, written out: ties share the mean of their places."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    ranks[order] = np.arange(len(x))
    return np.array([ranks[x == v].mean() for v in x])


def test_alti_ranks_tokens_from_the_runs_contributions_and_heads_say_how_they_track_it(
    alti_result, tiny_en_dir
):
    run_dir, result = alti_result
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_en_dir, attn_implementation="eager"
    ).eval()
    docs = json.loads(pq.read_schema(result.path).metadata[b"doc_ids"])
    preds = {p["doc_id"]: p for p in read_table(run_dir, "predictions").to_pylist()}
    alti = pl.from_arrow(read_table(run_dir, "contributions"))
    tokens = pl.from_arrow(read_table(run_dir, "tokens"))
    attn = pl.from_arrow(read_table(run_dir, "cls_attention"))
    layer, head = int(attn["layer"][0]), 1
    rhos = []
    for k in fa.FRACTIONS:
        comps, suffs = [], []
        for doc in docs:
            values = alti.filter(pl.col("doc_id") == doc).sort("position")["alti"].to_numpy()
            ranking = sorted(range(len(values)), key=lambda j: (-values[j], j))
            content = tokens.filter(pl.col("doc_id") == doc).sort("position")["token_id"].to_list()
            c, s = _direct(model, [101, *content, 102], ranking, k, preds[doc]["pred_id"])
            comps.append(c)
            suffs.append(s)
            if k == fa.FRACTIONS[0]:
                w = attn.filter(
                    (pl.col("doc_id") == doc) & (pl.col("layer") == layer) & (pl.col("head") == head)
                )
                rx, ry = _ranks(w.sort("position")["weight"].to_numpy()), _ranks(values.astype(np.float64))
                if len(values) > 1 and rx.std() > 0 and ry.std() > 0:
                    rhos.append(np.corrcoef(rx, ry)[0, 1])
        got = result.table.filter((pl.col("score") == "alti") & (pl.col("k") == k))
        assert got.height == 1 and got["layer"][0] is None and got["alti_spearman"][0] is None
        assert got["comprehensiveness"][0] == pytest.approx(np.mean(comps), abs=1e-5)
        assert got["sufficiency"][0] == pytest.approx(np.mean(suffs), abs=1e-5)
    tracked = result.table.filter(
        (pl.col("score") == "weight") & (pl.col("layer") == layer) & (pl.col("head") == head)
    )["alti_spearman"]
    assert tracked.n_unique() == 1 and tracked[0] == pytest.approx(np.mean(rhos), abs=1e-9)
    assert schema.check(pq.read_schema(result.path), "head_faithfulness") == []


def test_without_contributions_there_is_no_alti_ranking(result):
    assert "alti" not in set(result.table["score"])
    assert result.table["alti_spearman"].is_null().all()


def test_the_report_names_the_heads_that_track_whole_model_influence(alti_result):
    from bertattn_batch.render.report import _faithfulness_html

    html = "\n".join(_faithfulness_html(alti_result[1].table, 3, {}))
    assert "tracks ALTI (Spearman)" in html
    assert "whole-model influence" in html and "ALTI's own comprehensiveness" in html
