"""Norm-based weights (``weight_norm``) against a direct computation from transformers' eager attention
weights and the layer's own value and output weights, on the real pretrained MiniLM and on the layouts
whose output projection lives elsewhere (DistilBERT, ALBERT)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import transformers as tf
from transformers import AutoTokenizer

from bertattn_batch.model import Classifier
from bertattn_batch.model.capture import ClsRowCapture

TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64)


def _bert_layer(model, layer):
    block = model.base_model.encoder.layer[layer].attention
    return block.self.value, block.output.dense, model.config.num_attention_heads


def _distilbert_layer(model, layer):
    attn = model.distilbert.transformer.layer[layer].attention
    return attn.v_lin, attn.out_lin, model.config.n_heads


def _albert_layer(model, layer):
    attn = model.albert.encoder.albert_layer_groups[0].albert_layers[0].attention  # shared by every layer
    return attn.value, attn.dense, model.config.num_attention_heads


def _texts(drug_sample, n: int = 6) -> list[str]:
    return pq.read_table(drug_sample).column("text").to_pylist()[:n]


def direct_norms(model, layout, ids: torch.Tensor, mask: torch.Tensor, layer: int):
    """(B, H, S) ``α_j · ‖v_j,h W_O[:, h]ᵀ‖`` from the eager attentions, the value projection's input
    (the layer's hidden states) and the two weight matrices, computed here in float64; also the [CLS]
    output of the attention sublayer before the residual, as the model computed it, and ``Σ_h Σ_j α f``."""
    value, dense, heads = layout(model, layer)
    seen: dict[str, list[torch.Tensor]] = {"x": [], "out": []}
    hooks = [
        value.register_forward_hook(lambda _m, inp, _o: seen["x"].append(inp[0])),
        dense.register_forward_hook(lambda _m, _i, out: seen["out"].append(out)),
    ]
    try:
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    pick = layer if len(seen["x"]) > 1 else 0  # ALBERT calls its one shared module once per layer
    x, dense_out = seen["x"][pick].double(), seen["out"][pick]

    B, S, _ = x.shape
    v = (x @ value.weight.double().T + value.bias.double()).view(B, S, heads, -1)  # (B, S, H, D)
    w_o = dense.weight.double().view(dense.weight.shape[0], heads, -1)  # (hidden, H, D)
    f = torch.einsum("bshd,ohd->bhso", v, w_o)  # (B, H, S, hidden): each head's part of the output
    alpha = out.attentions[layer][:, :, 0].double()  # (B, H, S): the [CLS] row
    norms = alpha * f.norm(dim=-1)
    summed = torch.einsum("bhs,bhso->bo", alpha, f) + dense.bias.double()  # (B, hidden)
    return norms, dense_out[:, 0].double(), summed


@pytest.fixture(scope="module")
def minilm_ids(minilm_dir, drug_sample):
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    batch = tok(_texts(drug_sample), truncation=True, max_length=96, padding=True, return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


@pytest.mark.parametrize("layers", [[-2], [-1, 0]])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_norms_equal_a_direct_computation_on_minilm(minilm_dir, minilm_ids, layers, attention):
    ids, mask = minilm_ids
    clf = Classifier.load(str(minilm_dir), layers=layers, attention=attention)
    norms = clf.forward([row[m.bool()].numpy() for row, m in zip(ids, mask, strict=True)]).norms
    eager = tf.AutoModelForSequenceClassification.from_pretrained(minilm_dir, attn_implementation="eager")
    for i, layer in enumerate(clf.layers):
        want, _, _ = direct_norms(eager.eval(), _bert_layer, ids, mask, layer)
        got = torch.from_numpy(norms[:, i, :, : ids.shape[1]]).double()
        torch.testing.assert_close(got * mask[:, None], want * mask[:, None], atol=1e-5, rtol=0)
        assert (norms[:, i] >= 0).all()


def test_heads_parts_add_up_to_the_attention_output_before_the_residual(minilm_dir, minilm_ids):
    """Σ_h Σ_j α_j f_h(x_j) + b_O is what the attention sublayer gives [CLS] before its residual and
    LayerNorm: the decomposition whose lengths ``weight_norm`` stores is the model's own."""
    ids, mask = minilm_ids
    eager = tf.AutoModelForSequenceClassification.from_pretrained(minilm_dir, attn_implementation="eager")
    for layer in (4, 5):
        _, model_out, summed = direct_norms(eager.eval(), _bert_layer, ids, mask, layer)
        torch.testing.assert_close(summed, model_out, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    "config_cls, model_cls, extra, layout",
    [
        (
            tf.DistilBertConfig,
            tf.DistilBertForSequenceClassification,
            dict(dim=32, n_layers=3, n_heads=4, hidden_dim=64),
            _distilbert_layer,
        ),
        (tf.AlbertConfig, tf.AlbertForSequenceClassification, TINY | {"embedding_size": 16}, _albert_layer),
        (tf.BertConfig, tf.BertForSequenceClassification, TINY, _bert_layer),
    ],
    ids=["distilbert", "albert", "bert"],
)
def test_norms_follow_each_layouts_output_projection(config_cls, model_cls, extra, layout, tmp_path):
    torch.manual_seed(0)
    model = model_cls(config_cls(vocab_size=60, **extra)).eval()
    model.save_pretrained(tmp_path)
    rng = np.random.default_rng(0)
    seqs = [np.concatenate([[2], rng.integers(5, 60, size=n), [3]]) for n in (9, 4, 13)]

    S = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), S), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)], mask[i, : len(s)] = torch.from_numpy(s), 1
    eager = model_cls.from_pretrained(tmp_path, attn_implementation="eager").eval()
    want, model_out, summed = direct_norms(eager, layout, ids, mask, 1)
    torch.testing.assert_close(summed, model_out, atol=1e-5, rtol=1e-5)
    with ClsRowCapture(model, [1]) as capture, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    got = capture.norms(capture.rows(mask))[:, 0].double()
    torch.testing.assert_close(got * mask[:, None], want * mask[:, None], atol=1e-5, rtol=0)


def test_bfloat16_gives_float32_measures_close_to_float32s(minilm_dir, minilm_ids):
    """In bfloat16 the model's values are rounded to 8 bits of mantissa; the measures are still
    computed and returned in float32, within that rounding of the float32 run's."""
    ids, mask = minilm_ids
    batch = [row[m.bool()].numpy() for row, m in zip(ids, mask, strict=True)]
    runs = {
        dt: Classifier.load(str(minilm_dir), dtype=dt, device="cpu", value_zeroing=True).forward(batch)
        for dt in ("float32", "bfloat16")
    }
    for name in ("norms", "value_zeroing"):
        want, got = getattr(runs["float32"], name), getattr(runs["bfloat16"], name)
        assert got.dtype == np.float32
        scale = np.abs(want).max()
        assert np.abs(got - want).max() < 0.1 * scale, name  # bf16 rounding of inputs and weights
        assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.95, name
