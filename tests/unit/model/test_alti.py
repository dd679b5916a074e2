"""ALTI captured in a padded SDPA batch equals an independent per-review computation from transformers'
eager attentions and hidden states, and its decomposition reproduces every attention block's output."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from bertattn_batch.model.alti import AltiCapture

TEXTS = [
    "The food was great but the service was painfully slow.",
    "Terrible.",
    "I would come back for the dumplings alone, they were that good, and the staff were kind.",
    "ok",
]


def _reference(model, ids: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """R[0, :] for one unpadded review, from eager ``attentions`` and ``hidden_states``, with full C
    matrices; also each layer's largest gap between the decomposition and the block's real output."""
    out = model(ids, output_attentions=True, output_hidden_states=True)
    bert = model.base_model
    n = ids.shape[1]
    rollout = torch.eye(n, dtype=torch.float64)
    gaps = []
    for layer, block in enumerate(bert.encoder.layer):
        x = out.hidden_states[layer][0].double()  # (n, hidden)
        a = out.attentions[layer][0].double()  # (H, n, n)
        sa, so = block.attention.self, block.attention.output
        heads, size = sa.num_attention_heads, sa.attention_head_size
        v = (x @ sa.value.weight.double().T + sa.value.bias.double()).view(n, heads, size)  # (n, H, D)
        w = so.dense.weight.double()  # (hidden, H*D)
        terms = torch.zeros(n, n, x.shape[1], dtype=torch.float64)  # (i, j, hidden)
        for h in range(heads):
            fh = v[:, h] @ w[:, h * size : (h + 1) * size].T  # (n, hidden): W_O^h v^h_j
            terms += a[h][:, :, None] * fh[None, :, :]
        terms[range(n), range(n)] += x
        z = terms.sum(dim=1) + so.dense.bias.double()  # the LayerNorm's input
        ln = so.LayerNorm
        scale = 1 / torch.sqrt(z.var(dim=-1, unbiased=False, keepdim=True) + ln.eps)  # (n, 1)
        gamma = ln.weight.double()
        t = scale[:, None] * gamma * (terms - terms.mean(dim=-1, keepdim=True))  # (i, j, hidden)
        bias_term = scale * gamma * (so.dense.bias.double() - so.dense.bias.double().mean())
        y_decomposed = t.sum(dim=1) + bias_term + ln.bias.double()
        ctx = (a @ v.transpose(0, 1)).transpose(0, 1).reshape(1, n, heads * size)  # (1, n, H*D)
        y = so(ctx.float(), x[None].float())[0].double()  # the block's real output
        gaps.append(float((y_decomposed - y).abs().max()))
        d = (y[:, None, :] - t).abs().sum(dim=-1)  # (i, j)
        c = (y.abs().sum(dim=-1, keepdim=True) - d).clamp_min(0)
        c = c / c.sum(dim=-1, keepdim=True)
        rollout = c @ rollout
    return rollout[0], gaps


def _check(model_dir) -> None:
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    eager = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    alti = AltiCapture(model)
    with torch.inference_mode(), alti.forward(batch["attention_mask"]):
        model(**batch)
    got = alti.cls_contributions()  # (B, S)
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    for b, n in enumerate(lengths):
        with torch.inference_mode():
            expected, gaps = _reference(eager, batch["input_ids"][b : b + 1, :n])
        assert max(gaps) < 1e-5, gaps
        torch.testing.assert_close(got[b, :n].double(), expected, atol=1e-5, rtol=0)
        assert (got[b, n:] == 0).all()
        assert 0.99 < float(expected.sum()) < 1.01


def test_alti_matches_eager_on_tiny_bert(tiny_en_dir):
    _check(tiny_en_dir)


@pytest.mark.slow
def test_alti_matches_eager_on_minilm(minilm_dir):
    _check(minilm_dir)


def test_alti_chunks_give_the_same_values(tiny_en_dir, monkeypatch):
    import bertattn_batch.model.alti as alti_module

    model = AutoModelForSequenceClassification.from_pretrained(tiny_en_dir, attn_implementation="sdpa").eval()
    batch = AutoTokenizer.from_pretrained(tiny_en_dir)(TEXTS, padding=True, return_tensors="pt")
    results = []
    for chunk_bytes in (64 << 20, 1):  # whole layers, then one row at a time
        monkeypatch.setattr(alti_module, "CHUNK_BYTES", chunk_bytes)
        alti = AltiCapture(model)
        with torch.inference_mode(), alti.forward(batch["attention_mask"]):
            model(**batch)
        results.append(alti.cls_contributions())
    torch.testing.assert_close(results[0], results[1], atol=1e-6, rtol=0)
