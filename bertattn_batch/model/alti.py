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
for token i (as ``torch.nn.LayerNorm``, so that ``Σ_j T_i(x_j) + s_i · L(b_O) + β`` is the block's real
output ``y_i``; docs/measures.md). Then ``c_ij = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)``, each row normalised
to sum to 1; the feed-forward block passes contributions through unchanged. The rollout
``R = C^L ⋯ C^1`` is accumulated bottom up, keeping only ``R[0]``, so a trimmed last layer (its rows cut
to ``[CLS]``) needs no more than it computes.

The distances ``‖y_i − T_i(x_j)‖₁`` are the cost. A layer is decomposed in chunks of reviews that fit
:func:`block_bytes`; on a CPU, once a capture has run :data:`COMPILE_AFTER_S` seconds eagerly, a chunk
runs under ``torch.compile`` (:func:`chunk_distances`); a trimmed layer's one row takes one matmul
(:func:`row_distances`). Memory stays bounded whatever the review length.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..errors import first_line
from .capture import SelfAttention, self_attentions

#: The bytes a chunk's attention and value terms, and an eager block of the decomposition (j, rows,
#: hidden), aim at on a CPU: a few cores' L2 caches, inside a shared L3 (a GPU takes 64 times more).
BLOCK_BYTES = 4 << 20


def block_bytes(device: torch.device) -> int:
    """:data:`BLOCK_BYTES` on a CPU; 64 times that on a GPU, for few, large launches."""
    return BLOCK_BYTES if device.type == "cpu" else 64 * BLOCK_BYTES


#: inductor's thresholds for storing an intermediate, raised so that a term's sum over every head (12 or
#: 16 of them, each a read) stays inside the one kernel that measures its distance; and its products and
#: sums contracted into fused multiply-adds (one rounding in place of two: 6 to 10% of the kernel's time)
FUSE_EVERY_HEAD = {
    "realize_reads_threshold": 1 << 10,
    "realize_cpu_acc_reads_threshold": 1 << 10,
    "realize_cpu_opcount_threshold": 1 << 10,
    "cpp.enable_floating_point_contract_flag": "fast",
}

#: Seconds of ALTI a capture runs eagerly before it compiles its kernel: compiling costs seconds once a
#: process, which a small job never earns back and a corpus does in its first minutes.
COMPILE_AFTER_S = 10.0

#: graphs one process may compile: 2 a model (a chunk of one review, or of more), for the models a
#: process loads
RECOMPILES = 32

log = logging.getLogger(__name__)


def chunk_distances(
    q: Tensor, k: Tensor, v: Tensor, s: Tensor, own: Tensor, y: Tensor, mask: Tensor, w: Tensor, scale: float
) -> Tensor:
    """``‖y_i − T_i(x_j)‖₁`` (b, m, n) for a chunk of b reviews, their m rows i and n tokens j: ``q``
    (b, m, H*D) the rows' queries; ``k`` and ``v`` (b, n, H*D) the tokens' keys and values; ``s`` (b, m, 1)
    the LayerNorm's scales; ``own`` and ``y`` (b, m, hidden) each row's own term and the block's output;
    ``mask`` (b, n); ``w`` (H, D, hidden) W_O with L folded in; ``scale`` the attention scores'; ``s``,
    ``own`` and ``y`` in float32."""
    heads, size = w.shape[:2]
    q, k, v = (t.float() for t in (q, k, v))
    q, k = (t.unflatten(-1, (heads, size)).transpose(1, 2) for t in (q * scale, k))  # (b, H, rows, D)
    a = torch.softmax((k @ q.transpose(-1, -2)).masked_fill(~mask[:, None, :, None], -torch.inf), dim=-2)
    a = a * s.transpose(1, 2)[:, None]  # (b, H, n, m): a^h_ij at [h, j, i], with s_i folded in
    return (row_distances if q.shape[2] == 1 else distances)(a, v, w, own, y).transpose(1, 2)


def distances(a: Tensor, v: Tensor, w: Tensor, own: Tensor, y: Tensor) -> Tensor:
    """``‖y_i − T_i(x_j)‖₁`` (b, n, m) from the attention ``a`` (b, H, n, m) with s_i folded in, the values
    ``v`` (b, n, H*D), ``w``, ``own`` and ``y`` as :func:`chunk_distances` has them."""
    b, heads, n, m = a.shape
    f = torch.bmm(v.reshape(b * n, heads, -1).transpose(0, 1), w)  # (H, b*n, hidden): L(W_O^h v^h_j)
    f = f.view(heads, b, n, -1).transpose(0, 1)  # (b, H, n, hidden)
    d = head_distances(a, f, y)  # without token i's own term where j = i
    mine = (a[:, :, :m].diagonal(dim1=2, dim2=3)[..., None] * f[:, :, :m]).sum(dim=1) + own  # T_i(x_i)
    diagonal = torch.arange(n, device=d.device)[:, None] == torch.arange(m, device=d.device)  # (n, m)
    return torch.where(diagonal, (y - mine).abs().sum(dim=-1)[:, None, :], d)


def row_distances(a: Tensor, v: Tensor, w: Tensor, own: Tensor, y: Tensor) -> Tensor:
    """:func:`distances` for one row i (a trimmed layer's ``[CLS]``): each term
    ``T_i(x_j) = s_i L(W_O (a_ij ⊙ v_j))`` by one matmul over the heads' values weighted by their
    attention, where the per-head terms of :func:`distances` would hold H times as many numbers."""
    b, heads, n, _ = a.shape
    weighted = v.unflatten(-1, (heads, -1)) * a.view(b, heads, n, 1).transpose(1, 2)  # (b, n, H, D)
    t = weighted.flatten(2) @ w.flatten(0, 1)  # (b, n, hidden)
    t[:, :1] += own  # token i's own term, where j = i
    return t.sub_(y).abs_().sum(dim=-1, keepdim=True)


def head_distances(a: Tensor, f: Tensor, y: Tensor) -> Tensor:
    """``‖y_i − Σ_h a[h, j, i] f[h, j]‖₁`` for every review, token j and row i: ``a`` (b, H, n, m), ``f``
    (b, H, n, hidden), ``y`` (b, m, hidden) -> (b, n, m). Under ``torch.compile``, one expression that it
    fuses into a kernel storing no term; eagerly, the terms made by a matmul of inner dimension H in
    blocks of tokens j that fit :func:`block_bytes`, each read back by the L1 distance while it is in
    cache."""
    b, heads, n, m = a.shape
    if torch.compiler.is_compiling():
        t = -y[:, None]
        for h in range(heads):  # unrolled: H multiply-adds a term, in registers
            t = t + a[:, h, :, :, None] * f[:, h, :, None, :]
        return t.abs().sum(dim=-1)
    hidden = y.shape[-1]
    step = max(1, block_bytes(y.device) // (4 * b * m * hidden))
    d = torch.empty(b, n, m, device=y.device)
    for j in range(0, n, step):
        js = slice(j, min(j + step, n))
        heads_j = a[:, :, js].permute(0, 2, 3, 1).flatten(0, 1)  # (b*j, m, H)
        t = torch.bmm(heads_j, f[:, :, js].transpose(1, 2).flatten(0, 1))  # (b*j, m, hidden)
        d[:, js] = t.unflatten(0, (b, -1)).sub_(y[:, None]).abs_().sum(dim=-1)
    return d


@functools.cache
def compiled_chunk_distances() -> Callable[..., Tensor]:
    """:func:`chunk_distances` under ``torch.compile``: it compiles at its first call, a few seconds once a
    process for each head count (cached on disk after); where it cannot (no C++ compiler, more shapes
    than :data:`RECOMPILES`), it raises, and the caller runs :func:`chunk_distances` eagerly."""
    return torch.compile(
        chunk_distances, dynamic=True, fullgraph=True, recompile_limit=RECOMPILES, options=FUSE_EVERY_HEAD
    )


class AltiCapture:
    """Forward hooks that decompose every attention block of one forward pass (see the module's doc)."""

    def __init__(self, model: nn.Module) -> None:
        self._blocks = self_attentions(model)
        if any(block.dense is None or block.norm is None for block in self._blocks):
            raise ValueError("ALTI needs post-LayerNorm attention blocks (BERT, RoBERTa, DistilBERT, ALBERT)")
        if not self._blocks:
            raise ValueError("no self-attention modules with query/key/value projections found")
        self._seen: dict[str, Tensor] = {}  # this layer's "q", "k", "v" and "x", the block's input
        self._rollout: Tensor | None = None  # (B, rows, S): C^l ⋯ C^1 so far
        self._mask: Tensor | None = None
        # a forward calls the hooks once per layer, several times for a module that layers share (ALBERT)
        self._layers, self._calls = model.config.num_hidden_layers, 0
        self._lengths: list[int] = []
        self._fused: Callable[..., Tensor] | None = None  # chunk_distances compiled, once it pays
        self._eager_s, self._may_compile = 0.0, True

    @contextlib.contextmanager
    def forward(self, attention_mask: Tensor, lengths: Sequence[int] | None = None) -> Iterator[AltiCapture]:
        """Hooks in place for one forward over a batch with this (B, S) mask; ``lengths``: where each review's
        tokens end, if the caller knows it (a right-padded batch's lengths), else read back from the mask."""
        self._mask, self._rollout, self._seen, self._calls = attention_mask.bool(), None, {}, 0
        if lengths is None:  # past the last unmasked position
            lengths = (attention_mask.cumsum(dim=-1) * attention_mask).argmax(dim=-1).add(1).tolist()
        self._lengths = list(lengths)
        with contextlib.ExitStack() as hooks:
            for block in self._blocks:
                for name, module in zip("qkv", (block.q, block.k, block.v), strict=True):
                    hooks.enter_context(module.register_forward_hook(functools.partial(self._keep, name)))
                hooks.enter_context(block.norm.register_forward_hook(functools.partial(self._on_norm, block)))
            try:
                yield self
            finally:
                self._seen = {}

    def cls_contributions(self) -> Tensor:
        """``R[0, :]``: each token's contribution to ``[CLS]`` after the last layer, (B, S) float32."""
        if self._rollout is None:
            raise RuntimeError("no forward pass was captured")
        return self._rollout[:, 0]  # (B, S)

    def _keep(self, name: str, _m: nn.Module, inp: tuple, out: Tensor) -> None:
        self._seen[name] = out  # (B, S, H*D)
        if name == "q":
            self._seen["x"] = inp[0]  # (B, S, hidden): the block's input, its residual

    def _on_norm(self, block: SelfAttention, _norm: nn.Module, inp: tuple, out: Tensor) -> None:
        """Decompose the block that this LayerNorm closes, and roll its contributions out."""
        self._calls += 1
        last = self._calls == self._layers
        z, y = (inp[0][:, :1], out[:, :1]) if last else (inp[0], out)  # the top: [CLS]'s row alone
        cpu = y.device.type == "cpu"
        if cpu and self._fused is None and self._may_compile and self._eager_s >= COMPILE_AFTER_S:
            self._fused = compiled_chunk_distances()
        fused = self._fused if cpu else None
        t0 = time.perf_counter()
        try:
            c = self._contributions(block, z, y, fused)
        except Exception as e:  # what torch raises varies: no C++ compiler, an op inductor cannot lower
            if fused is None:
                raise
            log.warning(
                "ALTI: torch.compile fails here (%s); its distances run eagerly, slower", first_line(e)
            )
            self._fused, self._may_compile = None, False
            c = self._contributions(block, z, y)
        if fused is None:
            self._eager_s += time.perf_counter() - t0
        # (B, rows, S) @ (B, S, S): the last layer's one row is all the rollout keeps
        self._rollout = c if self._rollout is None else torch.bmm(c, self._rollout)

    def _contributions(
        self, block: SelfAttention, z: Tensor, y: Tensor, fused: Callable | None = None
    ) -> Tensor:
        """One layer's normalised contributions ``C`` (B, rows, S) float32, for the ``rows`` positions the
        LayerNorm saw (all of them, or ``[CLS]`` alone in a trimmed layer); 0 at padding. ``z`` and ``y``
        (B, rows, hidden) are the LayerNorm's input and output; padding after a review's length is neither
        read nor reading. ``fused``: :func:`chunk_distances` compiled, or None to run it eagerly."""
        q, k, v, x = (self._seen[name] for name in "qkvx")
        mask, lengths = self._mask, self._lengths
        heads, size = block.heads, block.size
        B, S = k.shape[:2]
        rows, hidden = z.shape[1:]
        z = z.float()
        z = z - z.mean(dim=-1, keepdim=True)
        s = torch.rsqrt(z.square().mean(dim=-1, keepdim=True) + block.norm.eps)  # (B, rows, 1)
        # s_i is folded into the attention, and L, being linear, into W_O, so that Σ_h a^h_ij f^h_j plus
        # token i's own term s_i L(x_i) where j = i is T_i(x_j)
        weight = block.norm.weight
        gamma = weight.detach().float() if weight is not None else torch.ones(hidden, device=z.device)
        w = block.dense.weight.detach().float()  # (hidden, H*D)
        w = ((w - w.mean(dim=0)) * gamma[:, None]).view(hidden, heads, size).permute(1, 2, 0).contiguous()
        x = x[:, :rows].float()
        own = (x - x.mean(dim=-1, keepdim=True)) * gamma * s  # (B, rows, hidden): s_i L(x_i)
        y = y.float()
        c = torch.zeros(B, rows, S, device=y.device)  # ‖y_i − T_i(x_j)‖₁, then the contributions
        # reviews whose attention and value terms fit a block
        per_review = 4 * S * (heads * (S + hidden) if rows > 1 else 2 * hidden)  # bytes of its terms
        step = max(1, block_bytes(y.device) // per_review)
        for b in range(0, B, step):
            r = slice(b, min(b + step, B))
            n = max(lengths[r])  # the longest of these reviews: its tokens j and rows i
            m = min(rows, n)
            chunk = (q[r, :m], k[r, :n], v[r, :n], s[r, :m], own[r, :m], y[r, :m], mask[r, :n], w)
            if fused is None or m == 1:  # a trimmed layer's one row: cheap eagerly
                c[r, :m, :n] = chunk_distances(*chunk, block.scaling)
            else:  # contiguous: one graph then holds for every chunk's strides
                c[r, :m, :n] = fused(*(t.contiguous() for t in chunk), block.scaling)
        c = (y.abs().sum(dim=-1, keepdim=True) - c).clamp_min(0) * mask[:, None, :]  # 0 at padding
        return c / c.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(c.dtype).tiny)
