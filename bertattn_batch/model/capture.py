"""The ``[CLS]`` query's attention row at chosen layers, without materialising n x n attention.

Usage::

    capture = ClsRowCapture(model, layers=[4])     # hooks the query/key projections
    with capture:
        logits = model(input_ids, attention_mask=mask).logits
    rows = capture.rows(mask)                      # (B, len(layers), H, S) float32

Why: under SDPA transformers returns no attention weights, and eager attention materialises
layers x heads x n x n floats per review. We need one row of one layer, so we recompute it from that
layer's own projections: ``softmax(q_cls . K^T * scaling + padding mask)`` per head, in float32.
Layers are counted by call order of their self-attention projections, which also covers encoders
that share one layer's weights across depth (ALBERT).
"""

from __future__ import annotations

import torch
from torch import nn

#: (query, key) projection names of the self-attention modules we support.
_PROJECTIONS = (("query", "key"), ("q_lin", "k_lin"))


def find_self_attention(model: nn.Module) -> list[tuple[nn.Module, nn.Linear, nn.Linear]]:
    """Unique self-attention modules in forward order, each with its query and key projections."""
    found = []
    seen: set[int] = set()
    for module in model.modules():
        for q_name, k_name in _PROJECTIONS:
            q, k = getattr(module, q_name, None), getattr(module, k_name, None)
            if isinstance(q, nn.Linear) and isinstance(k, nn.Linear) and _has_geometry(module):
                if id(module) not in seen:
                    seen.add(id(module))
                    found.append((module, q, k))
                break
    return found


def _has_geometry(module: nn.Module) -> bool:
    return hasattr(module, "scaling") or hasattr(module, "attention_head_size")


def head_geometry(module: nn.Module) -> tuple[int, int]:
    """(heads, head size) of a self-attention module."""
    heads = getattr(module, "num_attention_heads", None) or module.n_heads
    size = getattr(module, "attention_head_size", None) or module.q_lin.out_features // heads
    return int(heads), int(size)


class ClsRowCapture:
    """Forward hooks that keep the [CLS] query and all keys of the chosen layers during one forward."""

    def __init__(self, model: nn.Module, layers: list[int]) -> None:
        self.layers = list(layers)
        attn = find_self_attention(model)
        if not attn:
            raise ValueError("no self-attention modules with query/key projections found")
        self._modules = attn
        self._wanted = {layer: i for i, layer in enumerate(self.layers)}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._q: dict[int, torch.Tensor] = {}
        self._k: dict[int, torch.Tensor] = {}
        self._q_calls = 0
        self._k_calls = 0
        self._geometry: dict[int, tuple[int, int, float]] = {}

    def __enter__(self) -> ClsRowCapture:
        self._q.clear()
        self._k.clear()
        self._q_calls = self._k_calls = 0
        for module, q, k in self._modules:
            heads, size = head_geometry(module)
            scaling = float(getattr(module, "scaling", size**-0.5))  # eager-only modules have none
            self._handles.append(q.register_forward_hook(self._on_query(heads, size, scaling)))
            self._handles.append(k.register_forward_hook(self._on_key))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _on_query(self, heads: int, size: int, scaling: float):
        def hook(_m: nn.Module, _inp: tuple, out: torch.Tensor) -> None:
            layer = self._q_calls
            self._q_calls += 1
            if layer in self._wanted:
                self._q[layer] = out[:, 0, :]  # (B, H*D): the [CLS] query only
                self._geometry[layer] = (heads, size, scaling)

        return hook

    def _on_key(self, _m: nn.Module, _inp: tuple, out: torch.Tensor) -> None:
        layer = self._k_calls
        self._k_calls += 1
        if layer in self._wanted:
            self._k[layer] = out  # (B, S, H*D)

    def rows(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The captured [CLS] rows: (B, len(layers), H, S) float32, exactly 0 on padding."""
        missing = [layer for layer in self.layers if layer not in self._q or layer not in self._k]
        if missing:
            raise RuntimeError(f"layers {missing} were not reached in the forward pass")
        keep = attention_mask.bool()[:, None, :]  # (B, 1, S)
        out = []
        for layer in self.layers:
            heads, size, scaling = self._geometry[layer]
            q = self._q[layer].float().view(-1, heads, size)  # (B, H, D)
            k = self._k[layer].float()
            k = k.view(k.shape[0], k.shape[1], heads, size)  # (B, S, H, D)
            scores = torch.einsum("bhd,bshd->bhs", q, k) * scaling  # (B, H, S)
            scores = scores.masked_fill(~keep, float("-inf"))
            out.append(torch.softmax(scores, dim=-1))  # (B, H, S)
        return torch.stack(out, dim=1)  # (B, L, H, S)


def eager_rows(attentions: tuple[torch.Tensor, ...], layers: list[int]) -> torch.Tensor:
    """The reference: [CLS] rows from transformers' ``output_attentions`` (B, L, H, S) float32."""
    return torch.stack([attentions[layer][:, :, 0, :].float() for layer in layers], dim=1)
