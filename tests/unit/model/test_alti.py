"""ALTI captured in a padded SDPA batch equals an independent per-review computation from transformers'
eager attentions and hidden states, and its decomposition reproduces every attention block's output."""

from __future__ import annotations

import pytest
import torch
from helpers import alti_reference
from transformers import (
    AlbertConfig,
    AlbertForSequenceClassification,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DistilBertConfig,
    DistilBertForSequenceClassification,
)

from bertattn_batch.model.alti import AltiCapture

TEXTS = [
    "The food was great but the service was painfully slow.",
    "Terrible.",
    "I would come back for the dumplings alone, they were that good, and the staff were kind.",
    "ok",
]


def _check(model_dir, tokenizer_dir=None) -> None:
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    eager = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir or model_dir)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    alti = AltiCapture(model)
    with torch.inference_mode(), alti.forward(batch["attention_mask"]):
        model(**batch)
    got = alti.cls_contributions()  # (B, S)
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    for b, n in enumerate(lengths):
        with torch.inference_mode():
            expected, gaps = alti_reference(eager, batch["input_ids"][b : b + 1, :n])
        assert max(gaps) < 1e-5, gaps
        torch.testing.assert_close(got[b, :n].double(), expected, atol=1e-5, rtol=0)
        assert (got[b, n:] == 0).all()
        assert 0.99 < float(expected.sum()) < 1.01


def test_alti_matches_eager_on_tiny_bert(tiny_en_dir):
    _check(tiny_en_dir)


@pytest.mark.parametrize("kind", ["distilbert", "albert"])
def test_alti_matches_eager_on_distilbert_and_albert(kind, tiny_en_dir, tmp_path):
    """DistilBERT's LayerNorm sits beside its attention; ALBERT's one layer is called once per depth."""
    torch.manual_seed(0)
    vocab = AutoTokenizer.from_pretrained(tiny_en_dir).vocab_size
    if kind == "distilbert":
        config = DistilBertConfig(vocab_size=vocab, dim=32, n_layers=3, n_heads=4, hidden_dim=64)
        model = DistilBertForSequenceClassification(config)
    else:
        config = AlbertConfig(vocab_size=vocab, embedding_size=16, hidden_size=32, num_hidden_layers=3,
                              num_attention_heads=4, intermediate_size=64)  # fmt: skip
        model = AlbertForSequenceClassification(config)
    model.save_pretrained(tmp_path)
    _check(tmp_path, tokenizer_dir=tiny_en_dir)


@pytest.mark.slow
def test_alti_matches_eager_on_minilm(minilm_dir):
    _check(minilm_dir)


def test_alti_blocks_give_the_same_values(tiny_en_dir, monkeypatch):
    import bertattn_batch.model.alti as alti_module

    model = AutoModelForSequenceClassification.from_pretrained(tiny_en_dir, attn_implementation="sdpa").eval()
    batch = AutoTokenizer.from_pretrained(tiny_en_dir)(TEXTS, padding=True, return_tensors="pt")
    results = []
    for block_bytes in (64 << 20, 1):  # whole reviews, then one token j at a time
        monkeypatch.setattr(alti_module, "BLOCK_BYTES", block_bytes)
        alti = AltiCapture(model)
        with torch.inference_mode(), alti.forward(batch["attention_mask"]):
            model(**batch)
        results.append(alti.cls_contributions())
    torch.testing.assert_close(results[0], results[1], atol=1e-6, rtol=0)
