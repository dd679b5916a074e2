"""The model a training starts from: a small BERT from scratch, or a pretrained base with a fresh head."""

from __future__ import annotations

from typing import Any

import torch

from ..config import FinetuneSpec
from ..errors import ModelError, first_line
from ..model.checks import check_loaded_weights, check_positions, transformers_log_level


def scratch_model(spec: FinetuneSpec, vocab_size: int, names: list[str], pad_id: int) -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_length,  # only positions it is trained on: no untrained ones
        hidden_dropout_prob=spec.dropout,
        attention_probs_dropout_prob=spec.attention_dropout,
        pad_token_id=pad_id,
        id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)},
        attn_implementation="sdpa",
    )
    return BertForSequenceClassification(config)


def base_model(path: str, names: list[str]) -> Any:
    from transformers import AutoModelForSequenceClassification

    try:
        # quiet: its load report lists the new head as missing, which is expected here
        with transformers_log_level("error"):
            model, info = AutoModelForSequenceClassification.from_pretrained(
                path,
                num_labels=len(names),
                id2label=dict(enumerate(names)),
                label2id={n: i for i, n in enumerate(names)},
                # trained as a single-label softmax in float32, whatever the base was saved as: a
                # multi-label or regression base's problem_type, or float16 weights, would otherwise stay
                problem_type="single_label_classification",
                dtype=torch.float32,
                use_safetensors=True,
                # no attn_implementation: SDPA where the architecture has it, else its eager attention
                trust_remote_code=False,
                ignore_mismatched_sizes=True,  # a classifier base with another number of labels
                output_loading_info=True,
            )
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelError(f"cannot load base model {path}: {first_line(e)}") from None
    new = set(info.get("missing_keys", [])) | {
        k if isinstance(k, str) else k[0] for k in info.get("mismatched_keys", [])
    }
    check_positions(model, path)
    check_loaded_weights(model, info, path, for_training=True)
    _fresh_head(model, new)
    return model


def _fresh_head(model: Any, new: set[str]) -> None:
    """Initialise every module outside the encoder anew (seeded by the caller), unless none of its
    parameters came from the checkpoint (``new``: the keys the load initialised itself).

    A base that is itself a classifier would otherwise keep its head, and with it the meaning of its
    label ids under the new names: ``--labels pos,neg`` on a neg,pos model would invert every prediction.
    """
    prefix = f"{model.base_model_prefix}."
    if all(name in new for name, _ in model.named_parameters() if not name.startswith(prefix)):
        return  # a plain encoder: its head is new already
    std = float(getattr(model.config, "initializer_range", 0.02))
    with torch.no_grad():
        for name, child in model.named_children():
            if name == model.base_model_prefix:
                continue
            for module in child.modules():  # as BERT initialises: N(0, std) weights, zero biases
                if isinstance(module, torch.nn.Linear):
                    module.weight.normal_(0.0, std)
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, torch.nn.LayerNorm):
                    module.reset_parameters()
