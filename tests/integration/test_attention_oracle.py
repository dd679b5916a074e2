"""The written weights equal transformers' own eager attention, review by review, in padded batches."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import eager_oracle, minmax, plain_probs, read_attention, read_table
from transformers import AutoConfig

from bertattn_batch.config import JobSpec, from_dict
from bertattn_batch.engines import run_job


def _by_doc(table) -> dict[str, dict[str, np.ndarray]]:
    cols = {c: table.column(c).to_numpy() for c in ("layer", "head", "position", "weight", "weight_scaled")}
    docs = np.asarray(table.column("doc_id").to_pylist())
    out = {}
    for d in np.unique(docs):
        sel = docs == d
        out[d] = {k: v[sel] for k, v in cols.items()}
    return out


def _run_in_small_batches(model_dir, sample, tmp_path, **options):
    """run_job with a small token budget: many padded batches of mixed lengths; returns the run dir."""
    out = tmp_path / "run"
    spec = from_dict(
        JobSpec,
        {
            "inputs": [str(sample)],
            "id_col": "doc_id",
            "model": str(model_dir),
            "out": str(out),
            "batch_tokens": 1200,
            "max_batch_size": 8,
            "progress": False,
            **options,
        },
    )
    run_job(spec)
    return out


@pytest.mark.parametrize("model_fixture", ["minilm_dir", "tiny_en_dir"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_weights_match_eager_output_attentions(request, model_fixture, attention, drug_sample, tmp_path):
    model_dir = request.getfixturevalue(model_fixture)
    out = _run_in_small_batches(
        model_dir, drug_sample, tmp_path, label_col="label", window=10, attention=attention
    )
    texts = pq.read_table(drug_sample).column("text").to_pylist()
    ids = pq.read_table(drug_sample).column("doc_id").to_pylist()
    oracle = eager_oracle(model_dir, texts, layer=-2)
    written = _by_doc(read_attention(out))
    num_layers = 6 if model_fixture == "minilm_dir" else 3
    assert set(written) == set(ids)
    for doc_id, expected in zip(ids, oracle, strict=True):
        got = written[doc_id]
        assert (got["layer"] == num_layers - 2).all()
        heads, n = expected.shape
        order = np.lexsort((got["position"], got["head"]))
        weight = got["weight"][order].reshape(heads, n)
        scaled = got["weight_scaled"][order].reshape(heads, n)
        assert got["position"][order].reshape(heads, n)[0].tolist() == list(range(1, n + 1))
        np.testing.assert_allclose(weight, expected, atol=1e-5, rtol=0)
        np.testing.assert_allclose(scaled, minmax(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_fixture", ["minilm_dir", "tiny_en_dir"])
def test_predictions_and_last_layer_match_plain_transformers(request, model_fixture, drug_sample, tmp_path):
    """With the last layer trimmed to [CLS] (the default), probabilities and the last layer's rows
    still equal transformers' own: a plain forward per review, and eager ``attentions[-1]``."""
    model_dir = request.getfixturevalue(model_fixture)
    out = _run_in_small_batches(model_dir, drug_sample, tmp_path, layers=[-1])
    _assert_as_transformers(out, model_dir, drug_sample, [-1])


def _assert_as_transformers(out, model_dir, sample, layers: list[int]) -> None:
    """A run's probabilities equal a plain forward per review, and its weights at each of ``layers`` eager
    ``output_attentions``, within 1e-5."""
    source = pq.read_table(sample)
    texts, ids = source.column("text").to_pylist(), source.column("doc_id").to_pylist()
    preds = {r["doc_id"]: r for r in read_table(out, "predictions").to_pylist()}
    np.testing.assert_allclose(
        np.array([preds[d]["probs"] for d in ids]), plain_probs(model_dir, texts), atol=1e-5, rtol=0
    )
    written = _by_doc(read_attention(out))
    num_layers = AutoConfig.from_pretrained(model_dir).num_hidden_layers
    for layer in layers:
        for doc_id, expected in zip(ids, eager_oracle(model_dir, texts, layer=layer), strict=True):
            got = written[doc_id]
            sel = got["layer"] == num_layers + layer
            order = np.lexsort((got["position"][sel], got["head"][sel]))
            weight = got["weight"][sel][order].reshape(expected.shape)
            np.testing.assert_allclose(weight, expected, atol=1e-5, rtol=0)


def test_head_mass_closes_to_one(minilm_dir, drug_sample, tmp_path):
    out = tmp_path / "run"
    run_job(
        JobSpec(
            inputs=[str(drug_sample)], model=str(minilm_dir), out=str(out), layers=[-2, 0], progress=False
        )
    )
    attn = read_attention(out)
    summary = read_table(out, "head_summary")
    sums: dict[tuple, float] = {}
    for d, layer, head, w in zip(
        attn.column("doc_id").to_pylist(),
        attn.column("layer").to_pylist(),
        attn.column("head").to_pylist(),
        attn.column("weight").to_pylist(),
        strict=True,
    ):
        sums[(d, layer, head)] = sums.get((d, layer, head), 0.0) + w
    assert summary.num_rows == len(sums) == 24 * 2 * 12
    for row in summary.to_pylist():
        total = sums[(row["doc_id"], row["layer"], row["head"])] + row["weight_cls"] + row["weight_sep"]
        assert total == pytest.approx(1.0, abs=1e-4)
        assert row["weight_min"] <= row["weight_max"]


@pytest.mark.xdist_group("compile")  # with the other tests that compile: each graph compiled once
def test_compiled_model_matches_eager_output_attentions(tiny_en_dir, drug_sample, tmp_path):
    """--compile (torch.compile, dynamic shapes) traces the hooks that capture the rows and trim the
    last layer: its weights and probabilities still equal transformers' own, over batches of many
    shapes, padded and not."""
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    out = _run_in_small_batches(tiny_en_dir, drug_sample, tmp_path, layers=[-2, -1], window=10, compile=True)
    assert counters["stats"]["unique_graphs"] > graphs  # the batches ran compiled (CPU: in this process)
    _assert_as_transformers(out, tiny_en_dir, drug_sample, [-2, -1])
