"""The model and tokenizer a training starts from: a small character BERT from scratch (BERT's Chinese
tokenizer splits CJK text into characters), or a pretrained base with a fresh classification head."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from ..config import FinetuneSpec
from ..errors import ModelError
from ..model import checks
from ..model.classifier import load_weights

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: The code-point ranges BERT's tokenizer splits into single characters.
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))  # fmt: skip


def start_model(
    spec: FinetuneSpec, names: list[str], train_texts: Sequence[str]
) -> tuple[Any, Any, str | None]:
    """(model, tokenizer, the base's local path or None): from ``spec.base``, checked as extract checks it,
    or from scratch over the characters of ``train_texts``."""
    if spec.base is None:
        vocab = build_char_vocab(train_texts, spec.min_char_count)
        tokenizer = char_tokenizer(vocab, spec.max_length)
        return scratch_model(spec, len(vocab), names, tokenizer.pad_token_id), tokenizer, None
    path = checks.resolve_source(spec.base)
    config = checks.load_config(path, allow_pickle=None)  # refused as extract would, before training
    tokenizer = checks.load_tokenizer(path)
    checks.check_tokenizer(tokenizer, config, spec.base)
    return base_model(path, names), tokenizer, path


def char_tokenizer(vocab: dict[str, int], max_length: int = 512) -> Any:
    """A BERT WordPiece tokenizer over ``vocab`` (lowercasing, CJK split into characters)."""
    from transformers import BertTokenizer

    tok = BertTokenizer(
        vocab=dict(vocab), do_lower_case=True, tokenize_chinese_chars=True, model_max_length=max_length
    )
    if len(tok) != len(vocab):
        raise ModelError(f"tokenizer holds {len(tok)} tokens, the vocabulary {len(vocab)}: it was ignored")
    return tok


def build_char_vocab(texts: Sequence[str], min_count: int = 2) -> dict[str, int]:
    """Special tokens, every character seen ``min_count`` times after the tokenizer's normalisation, then
    ``##c`` for the non-CJK ones seen inside a word, so that any word of known characters can be spelt."""
    base = char_tokenizer({t: i for i, t in enumerate(SPECIAL_TOKENS)}).backend_tokenizer
    counts: Counter[str] = Counter()
    inner: set[str] = set()
    for text in texts:
        for word, _ in base.pre_tokenizer.pre_tokenize_str(base.normalizer.normalize_str(text)):
            counts.update(word)
            inner.update(ch for ch in word[1:] if not any(a <= ord(ch) <= b for a, b in _CJK))
    kept = sorted((c for c, n in counts.items() if n >= min_count), key=lambda c: (-counts[c], c))
    tokens = [*SPECIAL_TOKENS, *kept, *(f"##{c}" for c in kept if c in inner)]
    return {t: i for i, t in enumerate(tokens)}


def scratch_model(spec: FinetuneSpec, vocab_size: int, names: list[str], pad_id: int) -> Any:
    """A random BERT classifier of the spec's shape, with positions for ``spec.max_length`` tokens only."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_length, hidden_dropout_prob=spec.dropout,
        attention_probs_dropout_prob=spec.attention_dropout, pad_token_id=pad_id,
        id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)},
        attn_implementation="sdpa",
    )  # fmt: skip
    return BertForSequenceClassification(config)


def base_model(path: str, names: list[str]) -> Any:
    """A pretrained base as a float32 single-label classifier of ``names``, its head initialised anew."""
    # single-label whatever the base was trained as; a classifier base may have other labels
    model, info = load_weights(
        path, path, torch.float32, for_training=True, num_labels=len(names), id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)}, problem_type="single_label_classification",
        trust_remote_code=False,
    )  # fmt: skip
    # every module outside the encoder made anew, unless the load did: a classifier base's head would keep
    # the meaning of its own label ids
    new = set(info.get("missing_keys", [])) | {
        k if isinstance(k, str) else k[0] for k in info.get("mismatched_keys", [])
    }
    prefix = f"{model.base_model_prefix}."
    if all(name in new for name, _ in model.named_parameters() if not name.startswith(prefix)):
        return model
    std = float(getattr(model.config, "initializer_range", 0.02))
    with torch.no_grad():
        for name, child in model.named_children():
            if name == model.base_model_prefix:
                continue
            for module in child.modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0.0, std)
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, torch.nn.LayerNorm):
                    module.reset_parameters()
    return model
