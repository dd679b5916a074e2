"""The ``[CLS]`` query's attention row at chosen layers, its norms and value zeroing, without n x n attention:
``softmax(q_cls . K^T * scaling + padding mask)`` per head in float32, from the layer's own projections
(SDPA returns no weights). Layers are counted by the call order of their projections (ALBERT shares one).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import nn

#: (query, key, value) projection names of the self-attention modules we support.
_PROJECTIONS = (("query", "key", "value"), ("q_lin", "k_lin", "v_lin"))
#: (context (N, H*D), residual (N, hidden)) -> the layer's output (N, hidden) for those rows.
LayerTail = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class SelfAttention(NamedTuple):
    """A self-attention module, its projections and heads, and the parts of its encoder layer that the
    measures read; None where the layout has no such part."""

    module: nn.Module
    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    heads: int
    size: int  # of a head
    scaling: float  # of the scores (eager-only modules have none: size ** -0.5)
    dense: nn.Linear | None  # from the heads to the hidden size
    norm: nn.LayerNorm | None  # the LayerNorm that closes the attention block, residual included
    tail: LayerTail | None  # what follows the weighted sum of values, in a post-LayerNorm layer
    block: nn.Module | None  # BERT's layout: the block that holds the module as ``.self`` beside ``.output``


def self_attentions(model: nn.Module) -> list[SelfAttention]:
    """The self-attention modules in forward order (each once, though ALBERT's layers share one), in BERT's
    layout and its kin's, DistilBERT's and ALBERT's."""
    parent = {}
    for module in model.modules():
        for child in module.children():
            parent.setdefault(child, module)
    found = []
    for module in model.modules():
        if not (hasattr(module, "scaling") or hasattr(module, "attention_head_size")):
            continue
        names = [n for n in _PROJECTIONS if all(isinstance(getattr(module, x, None), nn.Linear) for x in n)]
        if not names:
            continue
        q, k, v = (getattr(module, name) for name in names[0])
        heads = int(getattr(module, "num_attention_heads", None) or module.n_heads)
        size = int(getattr(module, "attention_head_size", None) or q.out_features // heads)
        block = parent.get(module)
        output = getattr(block, "output", None)
        if getattr(block, "self", None) is not module or not isinstance(output, nn.Module):
            block = output = None  # not BERT's layout, of .self beside .output
        layer = parent.get(module if block is None else block)
        tail = None
        if block is not None and _has(layer, "intermediate", "output") and _has(output, "LayerNorm"):
            tail = partial(_bert_tail, block, layer)
        elif block is None and _has(layer, "sa_layer_norm", "ffn", "output_layer_norm"):
            tail = partial(_distilbert_tail, layer)
        elif block is None and _has(layer, "ffn", "ffn_output", "full_layer_layer_norm"):
            tail = partial(_albert_tail, layer)
        found.append(SelfAttention(
            module, q, k, v, heads, size, float(getattr(module, "scaling", size**-0.5)),
            _first(nn.Linear, [(module, "out_lin"), (module, "dense"), (output, "dense")]),
            _first(nn.LayerNorm, [(module, "LayerNorm"), (output, "LayerNorm"), (layer, "sa_layer_norm")]),
            tail, block,
        ))  # fmt: skip
    return found


def _has(module: nn.Module | None, *names: str) -> bool:
    return all(hasattr(module, n) for n in names)


def _first(kind: type[nn.Module], places: list[tuple[nn.Module | None, str]]) -> Any:
    """The first ``owner.name`` of ``places`` that is a ``kind``, or None."""
    return next((m for owner, name in places if isinstance(m := getattr(owner, name, None), kind)), None)


def _bert_tail(block: nn.Module, layer: nn.Module, ctx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    a = block.output(ctx, x)
    return layer.output(layer.intermediate(a), a)


def _distilbert_tail(layer: nn.Module, ctx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    a = layer.sa_layer_norm(layer.attention.out_lin(ctx) + x)
    return layer.output_layer_norm(layer.ffn(a) + a)


def _albert_tail(layer: nn.Module, ctx: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    a = layer.attention.LayerNorm(layer.attention.dense(ctx) + x)
    return layer.full_layer_layer_norm(layer.ffn_output(layer.activation(layer.ffn(a))) + a)


class ClsRowCapture:
    """Forward hooks that keep, for the chosen layers of one forward, the [CLS] query and input and every key
    and value."""

    def __init__(self, model: nn.Module, layers: list[int]) -> None:
        self.layers = list(layers)
        self.attentions = self_attentions(model)
        self._grams = []  # per module: its heads' (H, D, D) Gram matrices of W_O, or None
        for a in self.attentions:
            gram = None
            if a.dense is not None:
                w = a.dense.weight.detach().float()  # (hidden, H*D): y = x Wᵀ
                w = w.view(w.shape[0], a.heads, a.size).permute(1, 0, 2)  # (H, hidden, D)
                gram = w.transpose(1, 2) @ w  # (H, D, D)
            self._grams.append(gram)
        self._hooks = ExitStack()
        self._calls = dict.fromkeys("qkv", 0)
        # by layer: "q" (B, H*D) the [CLS] query, "x" (B, hidden) the layer's input at [CLS] (its
        # residual), "k" and "v" (B, S, H*D)
        self._kept: dict[str, dict[int, torch.Tensor]] = {name: {} for name in "qxkv"}
        self._owner: dict[int, int] = {}  # layer -> index of its module (ALBERT shares one)

    def supports_value_zeroing(self) -> bool:
        return all(a.tail is not None for a in self.attentions)

    def __enter__(self) -> ClsRowCapture:
        self.release()
        self._calls = dict.fromkeys("qkv", 0)
        for i, a in enumerate(self.attentions):
            for name, projection in zip("qkv", (a.q, a.k, a.v), strict=True):
                self._hooks.enter_context(projection.register_forward_hook(partial(self._keep, name, i)))
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.close()
        if exc[0] is not None:  # a forward that failed (out of memory): nothing of it is read
            self.release()

    def release(self) -> None:
        """Let go of a batch's activations."""
        for store in self._kept.values():
            store.clear()

    def _keep(self, name: str, index: int, _m: nn.Module, inp: tuple, out: torch.Tensor) -> None:
        layer = self._calls[name]
        self._calls[name] += 1
        if layer not in self.layers:
            return
        if name == "q":
            self._kept["q"][layer] = out[:, 0, :]  # (B, S, H*D) -> (B, H*D)
            self._kept["x"][layer] = inp[0][:, 0, :]  # (B, S, hidden) -> (B, hidden)
            self._owner[layer] = index
        else:
            self._kept[name][layer] = out  # (B, S, H*D)

    def _heads(self, name: str, layer: int) -> torch.Tensor:
        """A kept projection in float32, split into heads: (B, H, D) for "q", (B, S, H, D) for "k", "v"."""
        a = self.attentions[self._owner[layer]]
        return self._kept[name][layer].float().unflatten(-1, (a.heads, a.size))

    def rows(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The [CLS] rows: (B, len(layers), H, S) float32, exactly 0 on padding."""
        if missing := [layer for layer in self.layers if layer not in self._kept["k"]]:
            raise RuntimeError(f"layers {missing} were not reached in the forward pass")
        keep = attention_mask.bool()[:, None, :]  # (B, 1, S)
        out = []
        for layer in self.layers:
            scaling = self.attentions[self._owner[layer]].scaling
            scores = torch.einsum("bhd,bshd->bhs", self._heads("q", layer), self._heads("k", layer)) * scaling
            out.append(torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1))  # (B, H, S)
        return torch.stack(out, dim=1)  # (B, L, H, S)

    def norms(self, rows: torch.Tensor) -> torch.Tensor:
        """Norm-based weights (Kobayashi et al., 2020): ``‖α_j · v_j W_hᵀ‖``, (B, L, H, S) float32, 0 on
        padding; ``‖v W_hᵀ‖² = v G_h vᵀ`` with ``G_h = W_hᵀ W_h``, so no (B, S, H, hidden) tensor is made."""
        out = []
        for i, layer in enumerate(self.layers):
            gram = self._grams[self._owner[layer]]  # (H, D, D)
            if gram is None:
                raise RuntimeError("no output projection found beside the self-attention module")
            v = self._heads("v", layer)  # (B, S, H, D)
            squared = torch.einsum("bshd,hde,bshe->bhs", v, gram, v)  # (B, H, S)
            out.append(rows[:, i] * squared.clamp_min(0).sqrt())  # (B, H, S)
        return torch.stack(out, dim=1)  # (B, L, H, S)

    def value_zeroing(self, rows: torch.Tensor) -> torch.Tensor:
        """Value zeroing (Mohebbi et al., 2023): per token j, the cosine distance of the layer's [CLS] output
        to that output with v_j zeroed in every head, (B, L, S) float32, 0 on padding. Zeroing v_j takes
        ``α_hj v_hj`` off the attention output, so only the rest of the layer is run again, batched."""
        out = []
        for i, layer in enumerate(self.layers):
            tail = self.attentions[self._owner[layer]].tail  # not None: Classifier.load refuses the model
            dtype = self._kept["v"][layer].dtype
            v = self._heads("v", layer)  # (B, S, H, D)
            B, S, H, D = v.shape
            part = rows[:, i].permute(0, 2, 1).unsqueeze(-1) * v  # (B, S, H, D): token j's term in each head
            context = part.sum(dim=1, keepdim=True)  # (B, 1, H, D)
            contexts = torch.cat([context, context - part], dim=1).view(B * (S + 1), H * D)  # row 0: intact
            x = self._kept["x"][layer]  # (B, hidden)
            residual = x.unsqueeze(1).expand(B, S + 1, x.shape[-1]).reshape(B * (S + 1), -1)
            after = tail(contexts.to(dtype), residual.to(dtype)).float().view(B, S + 1, -1)  # (B, S+1, E)
            unit = nn.functional.normalize(after, dim=-1)
            # 1 - cos(a, b) = |a/|a| - b/|b||² / 2: exact in float32 for small distances, where 1 - cos is not
            distance = (unit[:, 1:] - unit[:, :1]).pow(2).sum(dim=-1) / 2  # (B, S)
            out.append(distance.clamp(0, 2) * (rows[:, i].sum(dim=1) > 0))
        return torch.stack(out, dim=1)  # (B, L, S)


def eager_rows(attentions: tuple[torch.Tensor, ...], layers: list[int]) -> torch.Tensor:
    """The reference: [CLS] rows (B, L, H, S) float32 from ``output_attentions``' (B, H, S, S) per layer."""
    return torch.stack([attentions[layer][:, :, 0, :].float() for layer in layers], dim=1)
