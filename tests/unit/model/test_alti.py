"""ALTI captured in a padded SDPA batch equals an independent per-review computation from transformers'
eager attentions and hidden states, and its decomposition reproduces every attention block's output."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import ARCHITECTURES, alti_reference, save_tiny_classifier
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from bertattn_batch.errors import ModelError
from bertattn_batch.model import Classifier
from bertattn_batch.model.alti import AltiCapture

#: Every test here that compiles runs in one worker, which then compiles each graph once.
pytestmark = pytest.mark.xdist_group("compile")


@pytest.fixture
def compiled_from_the_start(monkeypatch):
    """The values through the compiled kernel, the CPU's way once a job has run a few seconds of ALTI."""
    import bertattn_batch.model.alti as alti_module

    monkeypatch.setattr(alti_module, "COMPILE_AFTER_S", 0.0)


TEXTS = [
    "The food was great but the service was painfully slow.",
    "Terrible.",
    "I would come back for the dumplings alone, they were that good, and the staff were kind.",
    "ok",
]


def _contributions(model_dir) -> torch.Tensor:
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    batch = AutoTokenizer.from_pretrained(model_dir)(TEXTS, padding=True, return_tensors="pt")
    alti = AltiCapture(model)
    with torch.inference_mode(), alti.forward(batch["attention_mask"]):
        model(**batch)
    return alti.cls_contributions()


def _check(model_dir) -> None:
    eager = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    batch = AutoTokenizer.from_pretrained(model_dir)(TEXTS, padding=True, return_tensors="pt")
    got = _contributions(model_dir)  # (B, S)
    lengths = batch["attention_mask"].sum(dim=1).tolist()
    for b, n in enumerate(lengths):
        with torch.inference_mode():
            expected, gaps = alti_reference(eager, batch["input_ids"][b : b + 1, :n])
        assert max(gaps) < 1e-5, gaps
        torch.testing.assert_close(got[b, :n].double(), expected, atol=1e-5, rtol=0)
        assert (got[b, n:] == 0).all()
        assert 0.99 < float(expected.sum()) < 1.01


@pytest.mark.usefixtures("compiled_from_the_start")
def test_alti_matches_eager_on_tiny_bert(tiny_en_dir):
    _check(tiny_en_dir)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_the_classifier_gives_eager_alti_on_every_architecture(arch, tiny_en_dir, tmp_path):
    """Through the job's own path (padded SDPA batches, the last layer trimmed where it can be): BERT's kin,
    DistilBERT (its LayerNorm beside its attention), ALBERT (one layer called at every depth); a
    pre-LayerNorm encoder (Megatron-BERT) is refused in one line. A short job's way: eager (the compiled
    kernel has its own oracle tests here)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_en_dir)
    save_tiny_classifier(arch, tokenizer, tmp_path)
    if arch == "megatron-bert":
        with pytest.raises(ModelError, match=r"post-LayerNorm.*run without --contributions"):
            Classifier.load(str(tmp_path), contributions="alti")
        return
    ids = [np.asarray(tokenizer(text)["input_ids"]) for text in TEXTS]
    got = Classifier.load(str(tmp_path), contributions="alti").forward(ids).contributions  # (B, S)
    eager = AutoModelForSequenceClassification.from_pretrained(tmp_path, attn_implementation="eager").eval()
    for b, row in enumerate(ids):
        with torch.inference_mode():
            expected, gaps = alti_reference(eager, torch.as_tensor(row)[None])
        assert max(gaps) < 1e-5, gaps
        np.testing.assert_allclose(got[b, : len(row)], expected.numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.usefixtures("compiled_from_the_start")
def test_alti_matches_eager_on_minilm(minilm_dir):
    _check(minilm_dir)


@pytest.mark.usefixtures("compiled_from_the_start")
def test_the_fused_kernel_and_the_blocks_give_the_same_values(tiny_en_dir, monkeypatch):
    """The compiled kernel (the CPU's way) against the matmul in blocks (a GPU's, and the fallback), the
    blocks both of whole reviews and of one token j at a time."""
    import bertattn_batch.model.alti as alti_module

    fused = _contributions(tiny_en_dir)
    monkeypatch.setattr(alti_module, "compiled_chunk_distances", lambda: None)
    for block_bytes in (64 << 20, 1):
        monkeypatch.setattr(alti_module, "BLOCK_BYTES", block_bytes)
        torch.testing.assert_close(_contributions(tiny_en_dir), fused, atol=1e-6, rtol=0)


@pytest.mark.usefixtures("compiled_from_the_start")
def test_a_kernel_that_fails_to_compile_leaves_the_blocks(tiny_en_dir, monkeypatch, caplog):
    import bertattn_batch.model.alti as alti_module

    expected = _contributions(tiny_en_dir)

    def fails(*_args):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    monkeypatch.setattr(alti_module, "compiled_chunk_distances", lambda: fails)
    torch.testing.assert_close(_contributions(tiny_en_dir), expected, atol=1e-6, rtol=0)
    assert "torch.compile fails here (InvalidCxxCompiler: No working C++ compiler" in caplog.text


def test_a_small_job_does_not_pay_for_compiling(tiny_en_dir, monkeypatch):
    """Below COMPILE_AFTER_S seconds of ALTI a capture stays eager; past it, it compiles once."""
    import bertattn_batch.model.alti as alti_module

    asked = []
    monkeypatch.setattr(alti_module, "compiled_chunk_distances", lambda: asked.append(1) or None)
    monkeypatch.setattr(alti_module, "COMPILE_AFTER_S", 3600.0)
    _contributions(tiny_en_dir)
    assert not asked
    monkeypatch.setattr(alti_module, "COMPILE_AFTER_S", 0.0)
    _contributions(tiny_en_dir)
    assert asked
