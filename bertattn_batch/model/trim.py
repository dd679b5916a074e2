"""The last encoder layer computed for the ``[CLS]`` position only: same outputs, less work.

Usage::

    trim = LastLayerTrim.find(model)       # None where the model's layout does not allow it
    with trim:
        logits = model(input_ids, attention_mask=mask).logits

Why: a sequence classifier reads only the ``[CLS]`` position of the last layer's output (BERT's
pooler, RoBERTa's and ELECTRA's heads all take position 0). Every other position of the last layer
feeds nothing, yet plain inference computes its attention output, its residual and its feed-forward
block: on a 2-layer model that is over a third of all the work, on a 6-layer one about a tenth.
The last layer still attends over every token (its keys and values need them, and so does a
``[CLS]`` row captured from that layer); only the rows after attention are cut to position 0, by
two hooks:

- a forward hook on the last self-attention module keeps position 0 of its output;
- a forward pre-hook on its sibling output block (dense + residual + LayerNorm) keeps position 0 of
  the residual, so the rest of the layer runs on one position.

Under SDPA the last layer's attention itself is also computed for the ``[CLS]`` query alone (keys and
values of every token), through an attention function registered with transformers'
``AttentionInterface`` (:data:`CLS_SDPA`): the model runs under it while trimmed, and every other layer
gets plain SDPA from it. Measured on the default 2-layer model, 8192 reviews on 2 cores: the model stage
12% (float32) to 18% (bfloat16) faster than with the last layer's full attention.

Only layouts where that is exact are trimmed: the last self-attention module sits in a parent
attention block as ``.self`` next to ``.output`` (BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA, ERNIE,
Megatron-BERT), and a probe batch gives the same logits trimmed and untrimmed (:func:`verified`),
which also rules out a layer shared across depth (ALBERT) and a head that reads more than position 0.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .capture import find_self_attention

log = logging.getLogger(__name__)

#: The attention implementation a trimmed SDPA model runs under: SDPA, with SDPA's masks, except in the
#: self-attention modules of trims that are entered, where only the [CLS] query is computed.
CLS_SDPA = "bertattn_cls_sdpa"
_CLS_QUERY_ONLY: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _cls_sdpa(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, **kw
):
    """SDPA; for a trimmed last layer, for query position 0 only (query (B, H, S, d)).

    Returns the (B, S, H, d) output that the module reshapes; in a trimmed layer every position holds
    [CLS]'s output (a broadcast view), of which the trim keeps position 0 alone.
    """
    if module not in _CLS_QUERY_ONLY:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-2] > 1:
        attention_mask = attention_mask[:, :, :1]  # (B, 1 or H, S, S) -> the [CLS] query's row
    out, weights = sdpa_attention_forward(module, query[:, :, :1], key, value, attention_mask, **kw)
    return out.expand(query.shape[0], query.shape[2], *out.shape[2:]), weights


def _sdpa_mask(*args: Any, **kw: Any) -> Any:
    """SDPA's mask, made without reading a given padding mask on the device to see whether it could be
    dropped (transformers' ``padding_mask.all()``). That read waits for every batch queued before it, so
    a GPU idled while the host launched each batch: 98% of the model stage's time on an H200. A caller
    passes no mask for a batch without padding instead (:meth:`Classifier.launch`)."""
    if kw.get("attention_mask") is not None:
        kw["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kw)


def register_attention() -> None:
    """Register :data:`CLS_SDPA` with transformers (idempotent): done when a model is first run under it,
    not on import, so that importing this module changes no library's state."""
    AttentionInterface.register(CLS_SDPA, _cls_sdpa)
    AttentionMaskInterface.register(CLS_SDPA, _sdpa_mask)


@contextlib.contextmanager
def cls_sdpa(config: Any) -> Iterator[None]:
    """Run the SDPA model of this config under :data:`CLS_SDPA` (plain SDPA where no trim is entered),
    for its masks; any other model, or one already under it, as it is."""
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    register_attention()
    config._attn_implementation = CLS_SDPA
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"  # what it was (checked above)


class LastLayerTrim:
    """Context manager: while entered, the model's last layer runs for [CLS] only past its keys and values."""

    def __init__(self, self_attention: nn.Module, output_block: nn.Module) -> None:
        self._self_attention = self_attention
        self._output_block = output_block
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._mode = contextlib.ExitStack()  # cls_sdpa() while entered
        # the model's config (every layer reads the same object); SDPA models only
        config = getattr(self_attention, "config", None)
        self._config = config if getattr(config, "_attn_implementation", None) == "sdpa" else None

    @classmethod
    def find(cls, model: nn.Module) -> LastLayerTrim | None:
        """The trim for ``model``'s last layer, or None where its layout is not the one we know."""
        found = find_self_attention(model)
        if not found:
            return None
        last = found[-1][0]
        for module in model.modules():
            if getattr(module, "self", None) is last and isinstance(
                getattr(module, "output", None), nn.Module
            ):
                return cls(last, module.output)
        return None

    def __enter__(self) -> LastLayerTrim:
        self._handles.append(self._self_attention.register_forward_hook(_keep_first_output))
        self._handles.append(self._output_block.register_forward_pre_hook(_keep_first_residual))
        if self._config is not None:
            self._mode.enter_context(cls_sdpa(self._config))
            _CLS_QUERY_ONLY.add(self._self_attention)
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._config is not None:
            _CLS_QUERY_ONLY.discard(self._self_attention)
            self._mode.close()


def _keep_first_output(_m: nn.Module, _args: tuple, out: Any) -> Any:
    """Self-attention returns (output (B, S, D), weights or None): keep position 0 of the output."""
    if isinstance(out, tuple):
        return (out[0][:, :1], *out[1:])
    return out[:, :1]


def _keep_first_residual(_m: nn.Module, args: tuple) -> tuple:
    """The output block is called as (attention output (B, 1, D), residual (B, S, D))."""
    if len(args) != 2:
        raise RuntimeError(f"unexpected call of the last layer's output block with {len(args)} arguments")
    hidden, residual = args
    return hidden, residual[:, :1]


@torch.inference_mode()
def verified(
    model: nn.Module, trim: LastLayerTrim, vocab_size: int, device: torch.device, max_length: int
) -> bool:
    """Whether a probe batch (two lengths, one padded) gives the same logits with and without the trim.

    Catches a classifier head that reads more than position 0 (mean pooling, last token) and any layout
    the hooks do not fit; ``False`` means: run the model untrimmed. The probe stays within the model's
    ``max_length`` positions and its vocabulary.
    """
    length = max(3, min(12, max_length))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (2, length), generator=gen).to(device)  # (B, S)
    mask = torch.ones_like(ids)
    mask[1, length // 2 + 1 :] = 0  # one padded review
    full = model(input_ids=ids, attention_mask=mask).logits.float()
    try:
        with trim:
            cut = model(input_ids=ids, attention_mask=mask).logits.float()
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        log.info("last-layer trim does not fit this model (%s); running it untrimmed", e)
        return False
    # exact in float32 up to kernel order; bfloat16/float16 keep about 3 significant digits
    tol = 1e-4 if next(model.parameters()).dtype == torch.float32 else 5e-2
    ok = cut.shape == full.shape and bool(torch.allclose(cut, full, atol=tol, rtol=tol))
    if not ok:
        log.info("last-layer trim changes this model's logits; running it untrimmed")
    return ok
