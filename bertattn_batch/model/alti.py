"""ALTI (Ferrando, Gállego & Costa-jussà, EMNLP 2022): each token's contribution to the ``[CLS]``
representation after the last layer, rolled out over every layer, captured during the job's own forward.

Usage::

    alti = AltiCapture(model)
    with alti.forward(attention_mask):
        logits = model(input_ids, attention_mask=attention_mask).logits
    contributions = alti.cls_contributions()      # (B, S) float32, 0 on padding

Per layer, the attention block's output for token i is decomposed over the tokens j it reads::

    T_i(x_j) = s_i · L(Σ_h a^h_ij W_O^h v^h_j + [i = j] x_i)

where ``L`` is the block's LayerNorm centring times its weight and ``s_i`` that LayerNorm's own scale
for token i (biased variance plus epsilon, as ``torch.nn.LayerNorm``), so that
``Σ_j T_i(x_j) + s_i · L(b_O) + β`` is the block's real output ``y_i``. Then
``c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)``, each row normalised to sum to 1; the feed-forward block
passes contributions through unchanged. The rollout ``R = C^L ⋯ C^1`` is accumulated bottom up, and only
``R[0]`` is kept, so a trimmed last layer (its rows cut to ``[CLS]``) needs no more than it computes.
The authors' code scales by an unbiased standard deviation without epsilon; this one reproduces the
block's output exactly (docs/measures.md).

A layer's ``(B, S, rows, hidden)`` decomposition is made in blocks whose terms fit :data:`BLOCK_BYTES`
(several whole reviews, or one review's tokens j a block at a time), each cut to its longest review's
tokens: the matmul that makes the terms has an inner dimension of only H (heads), so its speed is that of
the memory it writes, and a block that stays in a core's cache is read back by the L1 distance at the
cache's speed. Memory stays bounded whatever the review length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from .capture import attention_block, find_self_attention, head_geometry, output_projection

#: The bytes one block of the decomposition (j, rows, hidden) float32 aims at on a CPU: a few cores' L2
#: caches, well inside a shared L3 (a GPU takes blocks 64 times larger).
BLOCK_BYTES = 4 << 20


def attention_layer_norm(model: nn.Module, attention: nn.Module) -> nn.LayerNorm | None:
    """The LayerNorm that closes a self-attention block (residual included): BERT and its kin's
    ``attention.output.LayerNorm``, DistilBERT's ``sa_layer_norm``, ALBERT's ``attention.LayerNorm``."""
    norm = getattr(attention, "LayerNorm", None)  # ALBERT
    if norm is None:
        norm = getattr(getattr(attention_block(model, attention), "output", None), "LayerNorm", None)
    if norm is None:  # DistilBERT: a layer's sa_layer_norm beside its attention
        layer = next((m for m in model.modules() if getattr(m, "attention", None) is attention), None)
        norm = getattr(layer, "sa_layer_norm", None)
    return norm if isinstance(norm, nn.LayerNorm) else None


class AltiCapture:
    """Forward hooks that decompose every attention block of one forward pass (see the module's doc)."""

    def __init__(self, model: nn.Module) -> None:
        self._blocks = []
        for module, q, k, v in find_self_attention(model):
            dense, norm = output_projection(model, module), attention_layer_norm(model, module)
            if dense is None or norm is None:
                raise ValueError(
                    "ALTI needs post-LayerNorm attention blocks (BERT, RoBERTa, DistilBERT, ALBERT)"
                )
            self._blocks.append((module, q, k, v, dense, norm))
        if not self._blocks:
            raise ValueError("no self-attention modules with query/key/value projections found")
        self._seen: dict[str, torch.Tensor] = {}
        self._rollout: torch.Tensor | None = None  # (B, rows, S): C^l ⋯ C^1 so far
        self._mask: torch.Tensor | None = None
        # a forward calls the hooks once per layer, several times for a module that layers share (ALBERT)
        self._layers, self._calls = model.config.num_hidden_layers, 0
        self._lengths: list[int] = []

    @contextlib.contextmanager
    def forward(
        self, attention_mask: torch.Tensor, lengths: Sequence[int] | None = None
    ) -> Iterator[AltiCapture]:
        """Hooks in place for one forward over a batch with this (B, S) mask; ``lengths``: where each review's
        tokens end, if the caller knows it (a right-padded batch's lengths), else read back from the mask."""
        self._mask, self._rollout, self._seen, self._calls = attention_mask.bool(), None, {}, 0
        if lengths is None:  # past the last unmasked position
            lengths = (attention_mask.cumsum(dim=-1) * attention_mask).argmax(dim=-1).add(1).tolist()
        self._lengths = list(lengths)
        handles = []
        for module, q, k, v, dense, norm in self._blocks:
            heads, size, scaling = head_geometry(module, q)
            handles += [
                q.register_forward_hook(self._keep("q", with_input=True)),
                k.register_forward_hook(self._keep("k")),
                v.register_forward_hook(self._keep("v")),
                norm.register_forward_hook(self._on_norm(heads, size, scaling, dense)),
            ]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            self._seen = {}

    def cls_contributions(self) -> torch.Tensor:
        """``R[0, :]``: each token's contribution to ``[CLS]`` after the last layer, (B, S) float32."""
        if self._rollout is None:
            raise RuntimeError("no forward pass was captured")
        return self._rollout[:, 0]  # (B, S)

    def _keep(self, name: str, with_input: bool = False):
        def hook(_m: nn.Module, inp: tuple, out: torch.Tensor) -> None:
            self._seen[name] = out  # (B, S, H*D)
            if with_input:
                self._seen["x"] = inp[0]  # (B, S, hidden): the block's input, its residual

        return hook

    def _on_norm(self, heads: int, size: int, scaling: float, dense: nn.Linear):
        def hook(norm: nn.LayerNorm, inp: tuple, out: torch.Tensor) -> None:
            self._calls += 1
            last = self._calls == self._layers
            z, y = (inp[0][:, :1], out[:, :1]) if last else (inp[0], out)  # the top: [CLS]'s row alone
            seen = self._seen
            c = layer_contributions(
                seen["q"], seen["k"], seen["v"], seen["x"], z, y, self._mask, self._lengths, norm, dense,
                heads, size, scaling,
            )  # fmt: skip
            # (B, rows, S) @ (B, S, S): the last layer's one row is all the rollout keeps
            self._rollout = c if self._rollout is None else torch.bmm(c, self._rollout)

        return hook


def layer_contributions(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    x: torch.Tensor,
    z: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor,
    lengths: list[int],
    norm: nn.LayerNorm,
    dense: nn.Linear,
    heads: int,
    size: int,
    scaling: float,
) -> torch.Tensor:
    """One layer's normalised contributions ``C`` (B, rows, S) float32, for the ``rows`` positions the
    LayerNorm saw (all of them, or ``[CLS]`` alone in a trimmed layer); 0 at padding. ``q, k, v``
    (B, S, H*D) are the projections, ``x`` (B, S, hidden) the block's input, ``z`` and ``y``
    (B, rows, hidden) the LayerNorm's input and output, ``mask`` (B, S) bool, ``lengths`` each review's
    tokens (padding after them is neither read nor reading)."""
    B, S = k.shape[:2]
    rows, hidden = z.shape[1:]
    q = q[:, :rows].float().view(B, rows, heads, size).transpose(1, 2) * scaling  # (B, H, rows, D)
    k = k.float().view(B, S, heads, size).transpose(1, 2)  # (B, H, S, D)
    # (B, H, S, rows), a^h_ij at [h, j, i]: by token j, the (i, h) matrices the matmul below reads as they lie
    a = torch.softmax((k @ q.transpose(-1, -2)).masked_fill_(~mask[:, None, :, None], float("-inf")), dim=-2)
    s = torch.rsqrt(z.float().var(dim=-1, unbiased=False, keepdim=True) + norm.eps)  # (B, rows, 1)
    # s_i is folded into the attention, and L, being linear, into W_O, so that Σ_h a^h_ij f^h_j (one matmul
    # of inner dimension H per token j) plus token i's own term s_i L(x_i) where j = i is T_i(x_j)
    a.mul_(s.view(B, 1, 1, rows))
    gamma = norm.weight.detach().float() if norm.weight is not None else torch.ones(hidden, device=a.device)
    w = dense.weight.detach().float()  # (hidden, H*D)
    w = ((w - w.mean(dim=0)) * gamma[:, None]).view(hidden, heads, size).permute(1, 2, 0)  # (H, D, hidden)
    f = v.float().view(B, S, heads, size).transpose(1, 2) @ w  # (B, H, S, hidden): L(W_O^h v^h_j)
    x = x[:, :rows].float()
    own = (x - x.mean(dim=-1, keepdim=True)) * gamma * s  # (B, rows, hidden): s_i L(x_i)
    y = y.float()
    budget = BLOCK_BYTES if y.device.type == "cpu" else 64 * BLOCK_BYTES  # a GPU: few, large launches
    block = max(1, budget // (4 * rows * hidden))  # tokens j a block holds
    work = torch.empty(block * rows * hidden, device=y.device)
    c = torch.zeros(B, rows, S, device=y.device)
    reviews = max(1, block // S)  # whole reviews a block holds, or one review's tokens in blocks of j
    for b in range(0, B, reviews):
        r = slice(b, min(b + reviews, B))
        n = max(lengths[r])  # the longest of these reviews: its tokens j and rows i
        m, step = min(rows, n), max(1, block // (r.stop - r.start))
        for j in range(0, n, step):
            js = slice(j, min(j + step, n))
            t = work[: (r.stop - r.start) * (js.stop - js.start) * m * hidden].view(-1, m, hidden)
            heads_j = a[r, :, js, :m].permute(0, 2, 3, 1).flatten(0, 1)  # (b*j, i, H)
            torch.bmm(heads_j, f[r, :, js].transpose(1, 2).flatten(0, 1), out=t)  # the heads' terms, by j
            t = t.view(r.stop - r.start, -1, m, hidden)  # (b, j, i, hidden)
            mine = t.diagonal(offset=j, dim1=1, dim2=2)  # (b, hidden, i = j): where i reads itself
            mine.add_(own[r, j : j + mine.shape[-1]].transpose(1, 2))  # T_i(x_j)
            c[r, :m, js] = t.sub_(y[r, None, :m]).abs_().sum(dim=-1).transpose(1, 2)  # ‖y_i − T_i(x_j)‖₁
    c = (y.abs().sum(dim=-1, keepdim=True) - c).clamp_min(0) * mask[:, None, :]  # (B, rows, S), 0 at padding
    return c / c.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(c.dtype).tiny)
