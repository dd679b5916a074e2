"""The last encoder layer computed for ``[CLS]`` only, which is all a classifier reads: its attention for the
[CLS] query (:data:`CLS_SDPA`), then position 0 of the attention output and residual (two hooks). Only
``.self`` beside ``.output`` layouts, and only where a probe batch gives the same logits (:func:`verified`).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .capture import self_attentions

log = logging.getLogger(__name__)

#: SDPA with SDPA's masks, except in the self-attention of entered trims, where only [CLS]'s query runs.
CLS_SDPA = "bertattn_cls_sdpa"
_CLS_QUERY_ONLY: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _cls_sdpa(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, **kw
):
    """SDPA; in a trimmed layer for query 0 only, broadcast. (B, H, S, D) each -> (B, S, H, D)."""
    if module not in _CLS_QUERY_ONLY:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)
    if attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[-2] > 1:
        attention_mask = attention_mask[:, :, :1]  # (B, 1 or H, S, S) -> (B, 1 or H, 1, S): [CLS]'s row
    out, weights = sdpa_attention_forward(
        module, query[:, :, :1], key, value, attention_mask, **kw
    )  # (B, 1, H, D)
    return out.expand(query.shape[0], query.shape[2], *out.shape[2:]), weights  # (B, S, H, D)


def _sdpa_mask(*args: Any, **kw: Any) -> Any:
    """SDPA's mask, without reading a padding mask back to see whether it could be dropped (that waits for
    every queued batch): a batch without padding passes none."""
    if kw.get("attention_mask") is not None:
        kw["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kw)


def use_cls_sdpa(model: nn.Module) -> None:
    """Run an SDPA model under :data:`CLS_SDPA` from now on (registered on first use, not on import)."""
    AttentionInterface.register(CLS_SDPA, _cls_sdpa)
    AttentionMaskInterface.register(CLS_SDPA, _sdpa_mask)
    model.set_attn_implementation(CLS_SDPA)


class LastLayerTrim:
    """Context manager: while entered, the model's last layer runs for [CLS] only past its keys and values."""

    def __init__(self, self_attention: nn.Module, output_block: nn.Module) -> None:
        self._self_attention, self._output_block = self_attention, output_block
        self._stack = contextlib.ExitStack()

    @classmethod
    def find(cls, model: nn.Module) -> LastLayerTrim | None:
        """The trim for ``model``'s last layer, or None where its layout is not the one we know."""
        found = self_attentions(model)
        block = found[-1].block if found else None
        return cls(block.self, block.output) if block is not None else None

    def __enter__(self) -> LastLayerTrim:
        self._stack.enter_context(self._self_attention.register_forward_hook(_keep_first_output))
        self._stack.enter_context(self._output_block.register_forward_pre_hook(_keep_first_residual))
        _CLS_QUERY_ONLY.add(self._self_attention)  # read by CLS_SDPA, where the model runs under it
        self._stack.callback(_CLS_QUERY_ONLY.discard, self._self_attention)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def _keep_first_output(_m: nn.Module, _args: tuple, out: Any) -> Any:
    """Self-attention returns (output (B, S, D), weights or None): keep (B, 1, D)."""
    if isinstance(out, tuple):
        return (out[0][:, :1], *out[1:])
    return out[:, :1]


def _keep_first_residual(_m: nn.Module, args: tuple) -> tuple:
    """The output block's (attention output (B, 1, D), residual (B, S, D)): keep (B, 1, D)."""
    if len(args) != 2:  # verified() then runs the model untrimmed
        raise RuntimeError(f"unexpected call of the last layer's output block with {len(args)} arguments")
    hidden, residual = args
    return hidden, residual[:, :1]


@torch.inference_mode()
def verified(
    model: nn.Module, trim: LastLayerTrim, vocab_size: int, device: torch.device, max_length: int
) -> bool:
    """Whether a probe batch (two reviews, one padded) gives the same logits with and without the trim."""
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
    tol = tolerance(next(model.parameters()).dtype)
    if not (ok := cut.shape == full.shape and bool(torch.allclose(cut, full, atol=tol, rtol=tol))):
        log.info("last-layer trim changes this model's logits; running it untrimmed")
    return ok


def tolerance(dtype: torch.dtype) -> float:
    """How far two kernels' outputs may differ: float32 up to summation order, else 3 significant digits."""
    return 1e-4 if dtype == torch.float32 else 5e-2
