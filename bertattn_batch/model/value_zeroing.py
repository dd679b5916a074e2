"""Value zeroing (Mohebbi, Zuidema, Chrupała & Alishahi, EACL 2023) for the [CLS] row: how far the
layer's [CLS] output moves when one token's value vector is zeroed in every head.

Usage::

    tail = layer_tail(model, self_attention_module)      # None where the layout is not supported
    distances = zeroing_distances(tail, rows, values, cls_input, heads, size)   # (B, S) in [0, 2]

Zeroing v_j changes only the attention output, by ``-α_hj v_hj`` in head h, so the [CLS] row is
recomputed from the captured weights and values through the rest of the layer (output projection,
residual, LayerNorm, feed-forward) once per token, batched, instead of a rerun of the layer per token.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

#: (context (N, H*D), residual (N, hidden)) -> the layer's output (N, hidden) for those rows.
LayerTail = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def layer_tail(model: nn.Module, attention: nn.Module) -> LayerTail | None:
    """What follows a self-attention module's weighted sum of values in its encoder layer, for the
    post-LayerNorm layouts: BERT and its kin (RoBERTa, ELECTRA, ERNIE, XLM-R), DistilBERT and ALBERT.
    None for others (Megatron-BERT's pre-LayerNorm layer reads a residual the capture does not keep)."""
    for module in model.modules():
        block = getattr(module, "attention", None)
        if block is None:
            continue
        if getattr(block, "self", None) is attention and _has(module, "intermediate", "output"):
            if not hasattr(block.output, "LayerNorm"):
                return None

            def bert(ctx: torch.Tensor, x: torch.Tensor, layer=module) -> torch.Tensor:
                a = layer.attention.output(ctx, x)
                return layer.output(layer.intermediate(a), a)

            return bert
        if block is attention and _has(module, "sa_layer_norm", "ffn", "output_layer_norm"):

            def distilbert(ctx: torch.Tensor, x: torch.Tensor, layer=module) -> torch.Tensor:
                a = layer.sa_layer_norm(layer.attention.out_lin(ctx) + x)
                return layer.output_layer_norm(layer.ffn(a) + a)

            return distilbert
        if block is attention and _has(module, "ffn", "ffn_output", "full_layer_layer_norm"):

            def albert(ctx: torch.Tensor, x: torch.Tensor, layer=module) -> torch.Tensor:
                a = layer.attention.LayerNorm(layer.attention.dense(ctx) + x)
                return layer.full_layer_layer_norm(layer.ffn_output(layer.activation(layer.ffn(a))) + a)

            return albert
    return None


def _has(module: nn.Module, *names: str) -> bool:
    return all(hasattr(module, n) for n in names)


def zeroing_distances(
    tail: LayerTail,
    rows: torch.Tensor,
    values: torch.Tensor,
    cls_input: torch.Tensor,
    heads: int,
    size: int,
) -> torch.Tensor:
    """Cosine distance, for every token j, between the layer's [CLS] output and that output with v_j
    zeroed in all heads. ``rows`` (B, H, S) float32 attention weights, ``values`` (B, S, H*D),
    ``cls_input`` (B, hidden): the layer's input at [CLS] (its residual). Returns (B, S) float32,
    0 on padding (whose weights are 0)."""
    dtype = values.dtype
    B, S = values.shape[:2]
    v = values.float().view(B, S, heads, size)  # (B, S, H, D)
    alpha = rows.permute(0, 2, 1).unsqueeze(-1)  # (B, S, H, 1)
    part = alpha * v  # (B, S, H, D): token j's term in each head's context
    context = part.sum(dim=1, keepdim=True)  # (B, 1, H, D)
    contexts = torch.cat([context, context - part], dim=1).view(B, S + 1, heads * size)  # row 0: intact
    residual = cls_input.unsqueeze(1).expand(B, S + 1, cls_input.shape[-1])
    out = tail(contexts.to(dtype).reshape(B * (S + 1), -1), residual.to(dtype).reshape(B * (S + 1), -1))
    unit = torch.nn.functional.normalize(out.float().view(B, S + 1, -1), dim=-1)
    # 1 - cos(a, b) = |a/|a| - b/|b||² / 2: exact in float32 for the small distances that are usual,
    # where 1 - cos would lose most digits
    distance = (unit[:, 1:] - unit[:, :1]).pow(2).sum(dim=-1) / 2  # (B, S)
    return distance.clamp(0, 2) * (rows.sum(dim=1) > 0)
