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

A layer's ``(B, S, rows, hidden)`` decomposition is made in chunks of rows in one reused buffer of
:data:`CHUNK_BYTES` (larger only where one row of a batch needs more), so memory stays bounded whatever
the review length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from .capture import find_self_attention, head_geometry, output_projection

#: The most bytes one chunk of a layer's decomposition (B, S, rows, hidden) float32 may take: few large
#: operations (many small ones cost more on a CPU whose threads wait for each other).
CHUNK_BYTES = 64 << 20


def attention_layer_norm(model: nn.Module, attention: nn.Module) -> nn.LayerNorm | None:
    """The LayerNorm that closes a self-attention block (residual included): BERT and its kin's
    ``attention.output.LayerNorm``, DistilBERT's ``sa_layer_norm``, ALBERT's ``attention.LayerNorm``."""
    if isinstance(getattr(attention, "LayerNorm", None), nn.LayerNorm):  # ALBERT
        return attention.LayerNorm
    for module in model.modules():
        block = getattr(module, "attention", None)
        if block is None:
            continue
        if getattr(block, "self", None) is attention:
            norm = getattr(getattr(block, "output", None), "LayerNorm", None)
            return norm if isinstance(norm, nn.LayerNorm) else None
        if block is attention and isinstance(getattr(module, "sa_layer_norm", None), nn.LayerNorm):
            return module.sa_layer_norm
    return None


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
        self._work = torch.empty(0)  # reused: a fresh buffer a layer costs the kernel's page faults

    @contextlib.contextmanager
    def forward(self, attention_mask: torch.Tensor) -> Iterator[AltiCapture]:
        """Hooks in place for one forward over a batch with this (B, S) mask."""
        self._mask, self._rollout, self._seen = attention_mask.bool(), None, {}
        if self._work.device != attention_mask.device or not self._work.numel():
            self._work = torch.empty(CHUNK_BYTES // 4, device=attention_mask.device)
        handles = []
        for n, (module, q, k, v, dense, norm) in enumerate(self._blocks, 1):
            heads, size, scaling = head_geometry(module, q)
            handles += [
                q.register_forward_hook(self._keep("q", with_input=True)),
                k.register_forward_hook(self._keep("k")),
                v.register_forward_hook(self._keep("v")),
                norm.register_forward_hook(
                    self._on_norm(heads, size, scaling, dense, n == len(self._blocks))
                ),
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

    def _on_norm(self, heads: int, size: int, scaling: float, dense: nn.Linear, last: bool):
        def hook(norm: nn.LayerNorm, inp: tuple, out: torch.Tensor) -> None:
            z, y = (inp[0][:, :1], out[:, :1]) if last else (inp[0], out)  # the top: [CLS]'s row alone
            seen = self._seen
            c = layer_contributions(
                seen["q"], seen["k"], seen["v"], seen["x"], z, y, self._mask, norm, dense, heads, size, scaling,
                self._work,
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
    norm: nn.LayerNorm,
    dense: nn.Linear,
    heads: int,
    size: int,
    scaling: float,
    work: torch.Tensor,
) -> torch.Tensor:
    """One layer's normalised contributions ``C`` (B, rows, S) float32, for the ``rows`` positions the
    LayerNorm saw (all of them, or ``[CLS]`` alone in a trimmed layer); 0 at padding. ``q, k, v``
    (B, S, H*D) are the projections, ``x`` (B, S, hidden) the block's input, ``z`` and ``y``
    (B, rows, hidden) the LayerNorm's input and output, ``mask`` (B, S) bool; ``work`` is a float32
    buffer the decomposition is made in, a chunk of rows at a time (a larger one where one row needs it)."""
    B, S = k.shape[:2]
    rows, hidden = z.shape[1:]
    q = q[:, :rows].float().view(B, rows, heads, size).transpose(1, 2)  # (B, H, rows, D)
    k = k.float().view(B, S, heads, size).transpose(1, 2)  # (B, H, S, D)
    scores = (q @ k.transpose(-1, -2)) * scaling  # (B, H, rows, S)
    a = torch.softmax(scores.masked_fill(~mask[:, None, None, :], float("-inf")), dim=-1)  # (B, H, rows, S)
    w = dense.weight.detach().float().view(hidden, heads, size)  # (hidden, H, D)
    gamma = norm.weight.detach().float() if norm.weight is not None else torch.ones_like(w[:, 0, 0])
    s = torch.rsqrt(z.float().var(dim=-1, unbiased=False, keepdim=True) + norm.eps)  # (B, rows, 1)
    # L is linear: each head's term is centred and scaled before the sum over heads, the residual x_i is
    # one more "head" that token i alone reads, and s_i is folded into the weights, so that
    # Σ_h a^h_ij f^h_j is T_i(x_j): one matmul of inner dimension H + 1 per token j
    a = torch.cat([a, torch.eye(rows, S, device=a.device).expand(B, 1, rows, S)], dim=1) * s[:, None]
    a = a.permute(0, 3, 2, 1)  # (B, S, rows, H+1): s_i a^h_ij, by token j
    f = torch.einsum("bshd,ehd->bshe", v.float().view(B, S, heads, size), w)  # (B, S, H, hidden): W_O^h v^h_j
    f = torch.cat([f, x.float()[:, :, None]], dim=2)  # (B, S, H+1, hidden): then x_j
    f = ((f - f.mean(dim=-1, keepdim=True)) * gamma).view(B * S, heads + 1, hidden)  # L(·)
    y = y.float()
    if work.numel() < B * S * hidden:
        work = torch.empty(B * S * hidden, device=y.device)
    chunk = work.numel() // (B * S * hidden)
    c = torch.empty(B, rows, S, device=y.device)
    for start in range(0, rows, chunk):
        i = slice(start, min(start + chunk, rows))
        t = work[: B * S * (i.stop - i.start) * hidden].view(B * S, -1, hidden)  # (B*S, i, hidden)
        torch.bmm(a[:, :, i].reshape(B * S, -1, heads + 1), f, out=t)  # T_i(x_j), by token j
        t = t.view(B, S, -1, hidden).sub_(y[:, None, i])  # (B, j, i, hidden): T_i(x_j) − y_i
        c[:, i] = t.abs_().sum(dim=-1).transpose(1, 2)  # ‖y_i − T_i(x_j)‖₁ (vector_norm's ord=1 is slower)
    c = (y.abs().sum(dim=-1, keepdim=True) - c).clamp_min(0) * mask[:, None, :]  # (B, rows, S), 0 at padding
    return c / c.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(c.dtype).tiny)
