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

from .value_zeroing import layer_tail, zeroing_distances

#: (query, key, value) projection names of the self-attention modules we support.
_PROJECTIONS = (("query", "key", "value"), ("q_lin", "k_lin", "v_lin"))


def find_self_attention(model: nn.Module) -> list[tuple[nn.Module, nn.Linear, nn.Linear, nn.Linear]]:
    """Unique self-attention modules in forward order, each with its query, key and value projections."""
    found = []
    seen: set[int] = set()
    for module in model.modules():
        for names in _PROJECTIONS:
            q, k, v = (getattr(module, name, None) for name in names)
            linear = all(isinstance(p, nn.Linear) for p in (q, k, v))
            if linear and _has_geometry(module):
                if id(module) not in seen:
                    seen.add(id(module))
                    found.append((module, q, k, v))
                break
    return found


def output_projection(model: nn.Module, self_attention: nn.Module) -> nn.Linear | None:
    """The linear map from a self-attention module's heads to the hidden size: DistilBERT's ``out_lin``,
    ALBERT's ``dense``, else (BERT and its kin) the sibling block's ``output.dense``."""
    for name in ("out_lin", "dense"):
        if isinstance(getattr(self_attention, name, None), nn.Linear):
            return getattr(self_attention, name)
    for module in model.modules():
        if getattr(module, "self", None) is self_attention:
            dense = getattr(getattr(module, "output", None), "dense", None)
            return dense if isinstance(dense, nn.Linear) else None
    return None


def _has_geometry(module: nn.Module) -> bool:
    return hasattr(module, "scaling") or hasattr(module, "attention_head_size")


def head_geometry(module: nn.Module) -> tuple[int, int]:
    """(heads, head size) of a self-attention module."""
    heads = getattr(module, "num_attention_heads", None) or module.n_heads
    size = getattr(module, "attention_head_size", None) or module.q_lin.out_features // heads
    return int(heads), int(size)


class ClsRowCapture:
    """Forward hooks that keep the [CLS] query, all keys and all values of the chosen layers during one
    forward: enough for the [CLS] row of attention weights and for their norms (:meth:`norms`)."""

    def __init__(self, model: nn.Module, layers: list[int]) -> None:
        self.layers = list(layers)
        attn = find_self_attention(model)
        if not attn:
            raise ValueError("no self-attention modules with query/key projections found")
        self._modules = attn
        self._outputs = [output_projection(model, module) for module, *_ in attn]
        self._tails = [layer_tail(model, module) for module, *_ in attn]
        self._wanted = {layer: i for i, layer in enumerate(self.layers)}
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._q: dict[int, torch.Tensor] = {}
        self._k: dict[int, torch.Tensor] = {}
        self._v: dict[int, torch.Tensor] = {}
        self._x: dict[int, torch.Tensor] = {}  # the layer's input at [CLS]: its residual
        self._calls = {"q": 0, "k": 0, "v": 0}
        self._geometry: dict[int, tuple[int, int, float]] = {}
        self._gram: dict[int, torch.Tensor] = {}  # layer -> (H, D, D), made on first use
        self._owner: dict[int, int] = {}  # layer -> index of its module in _modules (ALBERT shares them)

    def __enter__(self) -> ClsRowCapture:
        self.release()
        self._calls = dict.fromkeys(self._calls, 0)
        for i, (module, q, k, v) in enumerate(self._modules):
            heads, size = head_geometry(module)
            scaling = float(getattr(module, "scaling", size**-0.5))  # eager-only modules have none
            self._handles.append(q.register_forward_hook(self._on_query(i, heads, size, scaling)))
            self._handles.append(k.register_forward_hook(self._keep("k", self._k)))
            self._handles.append(v.register_forward_hook(self._keep("v", self._v)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if exc[0] is not None:  # a forward that failed (out of memory): nothing of it is read
            self.release()

    def release(self) -> None:
        """Let go of the captured activations (a batch's keys and values, all its tokens): once its
        outputs are made, and before a batch out of memory is retried in halves."""
        for store in (self._q, self._k, self._v, self._x):
            store.clear()

    def _on_query(self, index: int, heads: int, size: int, scaling: float):
        def hook(_m: nn.Module, inp: tuple, out: torch.Tensor) -> None:
            layer = self._calls["q"]
            self._calls["q"] += 1
            if layer in self._wanted:
                self._q[layer] = out[:, 0, :]  # (B, H*D): the [CLS] query only
                self._x[layer] = inp[0][:, 0, :]  # (B, hidden)
                self._geometry[layer] = (heads, size, scaling)
                self._owner[layer] = index

        return hook

    def _keep(self, name: str, store: dict[int, torch.Tensor]):
        def hook(_m: nn.Module, _inp: tuple, out: torch.Tensor) -> None:
            layer = self._calls[name]
            self._calls[name] += 1
            if layer in self._wanted:
                store[layer] = out  # (B, S, H*D)

        return hook

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

    def norms(self, rows: torch.Tensor) -> torch.Tensor:
        """Norm-based weights (Kobayashi et al., 2020) of the captured rows: ``‖α_j · f_h(x_j)‖``, where
        ``f_h(x_j)`` is token j's value vector of head h (its bias included) through that head's slice of
        the layer's output projection. (B, L, H, S) float32, 0 on padding.

        ``‖v W_hᵀ‖² = v G_h vᵀ`` with ``G_h = W_hᵀ W_h`` (D x D per head), so no (B, S, H, hidden)
        tensor is ever made: the cost is that of one more small matmul per captured layer.
        """
        out = []
        for i, layer in enumerate(self.layers):
            heads, size, _ = self._geometry[layer]
            gram = self._gram_of(layer, heads, size)  # (H, D, D)
            v = self._v[layer].float()
            v = v.view(v.shape[0], v.shape[1], heads, size)  # (B, S, H, D)
            squared = torch.einsum("bshd,hde,bshe->bhs", v, gram, v)  # (B, H, S)
            out.append(rows[:, i] * squared.clamp_min(0).sqrt())  # (B, H, S)
        return torch.stack(out, dim=1)  # (B, L, H, S)

    def value_zeroing(self, rows: torch.Tensor) -> torch.Tensor:
        """Value zeroing of the captured rows (see :mod:`.value_zeroing`): for each layer and token, the
        cosine distance of the layer's [CLS] output with that token's values zeroed in every head.
        (B, L, S) float32 in [0, 2], 0 on padding."""
        out = []
        for i, layer in enumerate(self.layers):
            heads, size, _ = self._geometry[layer]
            tail = self._tails[self._owner[layer]]
            if tail is None:
                raise RuntimeError("value zeroing does not know this model's encoder layer layout")
            out.append(zeroing_distances(tail, rows[:, i], self._v[layer], self._x[layer], heads, size))
        return torch.stack(out, dim=1)  # (B, L, S)

    def supports_value_zeroing(self) -> bool:
        return all(tail is not None for tail in self._tails)

    def _gram_of(self, layer: int, heads: int, size: int) -> torch.Tensor:

        if layer not in self._gram:
            projection = self._outputs[self._owner[layer]]
            if projection is None:
                raise RuntimeError("no output projection found beside the self-attention module")
            w = projection.weight.detach().float()  # (hidden, H*D): y = x Wᵀ
            w = w.view(w.shape[0], heads, size).permute(1, 0, 2)  # (H, hidden, D)
            self._gram[layer] = w.transpose(1, 2) @ w  # (H, D, D)
        return self._gram[layer]


def eager_rows(attentions: tuple[torch.Tensor, ...], layers: list[int]) -> torch.Tensor:
    """The reference: [CLS] rows from transformers' ``output_attentions`` (B, L, H, S) float32."""
    return torch.stack([attentions[layer][:, :, 0, :].float() for layer in layers], dim=1)
