"""The ``[CLS]`` query's attention row at chosen layers, its norms and value zeroing, without n x n attention:
``softmax(q_cls . K^T * scaling + padding mask)`` per head in float32, from the layer's own projections
(SDPA returns no weights). Layers are counted by the call order of their projections (ALBERT shares one).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

#: (query, key, value) projection names of the self-attention modules we support.
_PROJECTIONS = (("query", "key", "value"), ("q_lin", "k_lin", "v_lin"))
#: (context (N, H*D), residual (N, hidden)) -> the layer's output (N, hidden) for those rows.
LayerTail = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def find_self_attention(model: nn.Module) -> list[tuple[nn.Module, nn.Linear, nn.Linear, nn.Linear]]:
    """Self-attention modules in forward order (each once), with their query, key and value projections."""
    found = []
    for module in model.modules():
        if not (hasattr(module, "scaling") or hasattr(module, "attention_head_size")):
            continue
        for names in _PROJECTIONS:
            q, k, v = (getattr(module, name, None) for name in names)
            if all(isinstance(p, nn.Linear) for p in (q, k, v)):
                found.append((module, q, k, v))
                break
    return found


def output_projection(model: nn.Module, self_attention: nn.Module) -> nn.Linear | None:
    """The linear map from a self-attention module's heads to the hidden size (``out_lin``, ``dense`` or
    the sibling block's ``output.dense``)."""
    for name in ("out_lin", "dense"):
        if isinstance(getattr(self_attention, name, None), nn.Linear):
            return getattr(self_attention, name)
    dense = getattr(getattr(attention_block(model, self_attention), "output", None), "dense", None)
    return dense if isinstance(dense, nn.Linear) else None


def attention_block(model: nn.Module, self_attention: nn.Module) -> nn.Module | None:
    """The block that holds a self-attention module as ``.self``, beside its ``.output`` (BERT's layout)."""
    blocks = (m for m in model.modules() if getattr(m, "self", None) is self_attention)
    return next((m for m in blocks if isinstance(getattr(m, "output", None), nn.Module)), None)


def layer_tail(model: nn.Module, attention: nn.Module) -> LayerTail | None:
    """What follows a self-attention module's weighted sum of values in a post-LayerNorm encoder layer
    (BERT and its kin, DistilBERT, ALBERT); None for others (Megatron-BERT)."""

    def has(module: nn.Module, *names: str) -> bool:
        return all(hasattr(module, n) for n in names)

    for layer in model.modules():
        block = getattr(layer, "attention", None)
        if block is None:
            continue
        if getattr(block, "self", None) is attention and has(layer, "intermediate", "output"):
            if not hasattr(block.output, "LayerNorm"):
                return None

            def bert(ctx: torch.Tensor, x: torch.Tensor, layer=layer) -> torch.Tensor:
                a = layer.attention.output(ctx, x)
                return layer.output(layer.intermediate(a), a)

            return bert
        if block is attention and has(layer, "sa_layer_norm", "ffn", "output_layer_norm"):

            def distilbert(ctx: torch.Tensor, x: torch.Tensor, layer=layer) -> torch.Tensor:
                a = layer.sa_layer_norm(layer.attention.out_lin(ctx) + x)
                return layer.output_layer_norm(layer.ffn(a) + a)

            return distilbert
        if block is attention and has(layer, "ffn", "ffn_output", "full_layer_layer_norm"):

            def albert(ctx: torch.Tensor, x: torch.Tensor, layer=layer) -> torch.Tensor:
                a = layer.attention.LayerNorm(layer.attention.dense(ctx) + x)
                return layer.full_layer_layer_norm(layer.ffn_output(layer.activation(layer.ffn(a))) + a)

            return albert
    return None


def head_geometry(module: nn.Module, query: nn.Linear) -> tuple[int, int, float]:
    """(heads, head size, score scaling) of a self-attention module and its query projection."""
    heads = int(getattr(module, "num_attention_heads", None) or module.n_heads)
    size = int(getattr(module, "attention_head_size", None) or query.out_features // heads)
    return heads, size, float(getattr(module, "scaling", size**-0.5))  # eager-only modules have none


class ClsRowCapture:
    """Forward hooks that keep, for the chosen layers of one forward, the [CLS] query and input and every key
    and value."""

    def __init__(self, model: nn.Module, layers: list[int]) -> None:
        self.layers = list(layers)
        self.modules = find_self_attention(model)
        self._per_module = []  # (heads H, head size D, scaling, (H, D, D) Gram matrix or None, tail or None)
        for module, q, *_ in self.modules:
            heads, size, scaling = head_geometry(module, q)
            gram = None
            if (projection := output_projection(model, module)) is not None:
                w = projection.weight.detach().float()  # (hidden, H*D): y = x Wᵀ
                w = w.view(w.shape[0], heads, size).permute(1, 0, 2)  # (H, hidden, D)
                gram = w.transpose(1, 2) @ w  # (H, D, D)
            self._per_module.append((heads, size, scaling, gram, layer_tail(model, module)))
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._calls = dict.fromkeys("qkv", 0)
        # by layer: "q" (B, H*D) the [CLS] query, "x" (B, hidden) the layer's input at [CLS] (its
        # residual), "k" and "v" (B, S, H*D)
        self._kept: dict[str, dict[int, torch.Tensor]] = {name: {} for name in "qxkv"}
        self._owner: dict[int, int] = {}  # layer -> index of its module (ALBERT shares one)

    def supports_value_zeroing(self) -> bool:
        return all(tail is not None for *_, tail in self._per_module)

    def __enter__(self) -> ClsRowCapture:
        self.release()
        self._calls = dict.fromkeys("qkv", 0)
        for i, (_, *projections) in enumerate(self.modules):
            for name, projection in zip("qkv", projections, strict=True):
                self._handles.append(projection.register_forward_hook(partial(self._keep, name, i)))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
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
        heads, size, *_ = self._per_module[self._owner[layer]]
        return self._kept[name][layer].float().unflatten(-1, (heads, size))

    def rows(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The [CLS] rows: (B, len(layers), H, S) float32, exactly 0 on padding."""
        if missing := [layer for layer in self.layers if layer not in self._kept["k"]]:
            raise RuntimeError(f"layers {missing} were not reached in the forward pass")
        keep = attention_mask.bool()[:, None, :]  # (B, 1, S)
        out = []
        for layer in self.layers:
            scaling = self._per_module[self._owner[layer]][2]
            scores = torch.einsum("bhd,bshd->bhs", self._heads("q", layer), self._heads("k", layer)) * scaling
            out.append(torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1))  # (B, H, S)
        return torch.stack(out, dim=1)  # (B, L, H, S)

    def norms(self, rows: torch.Tensor) -> torch.Tensor:
        """Norm-based weights (Kobayashi et al., 2020): ``‖α_j · v_j W_hᵀ‖``, (B, L, H, S) float32, 0 on
        padding; ``‖v W_hᵀ‖² = v G_h vᵀ`` with ``G_h = W_hᵀ W_h``, so no (B, S, H, hidden) tensor is made."""
        out = []
        for i, layer in enumerate(self.layers):
            gram = self._per_module[self._owner[layer]][3]  # (H, D, D)
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
            tail = self._per_module[self._owner[layer]][4]
            if tail is None:
                raise RuntimeError("value zeroing does not know this model's encoder layer layout")
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
