"""--compile refuses, on load, a compile that fails on this machine or changes the outputs: a job
does not find out at its first batch, or write other numbers. (That a working compile writes
transformers' own weights is tests/integration/test_attention_oracle.py's.)"""

from __future__ import annotations

import pytest
import torch

from bertattn_batch.errors import ModelError
from bertattn_batch.model import Classifier


class _Doubled(torch.nn.Module):
    """A stand-in for a compiled model that computes other logits, on the batches ``wrong`` picks (a
    graph of its own, such as the unpadded batches', can be the one that is wrong)."""

    def __init__(self, model: torch.nn.Module, wrong) -> None:
        super().__init__()
        self.inner = model
        self.wrong = wrong

    def forward(self, **inputs):
        out = self.inner(**inputs)
        if self.wrong(inputs):
            out.logits = out.logits * 2
        return out


def _failing(model, **_options):
    def call(**_inputs):
        raise RuntimeError("InductorError: CppCompileError: no working C++ compiler found\nmore detail")

    return call


def test_a_compile_that_fails_here_is_one_line(tiny_en_dir, monkeypatch):
    monkeypatch.setattr(torch, "compile", _failing)
    with pytest.raises(ModelError) as e:
        Classifier.load(str(tiny_en_dir), compile=True)
    assert str(e.value) == (
        f"--compile: torch.compile fails for {tiny_en_dir} here (InductorError: CppCompileError: no "
        "working C++ compiler found); run without --compile"
    )


@pytest.mark.parametrize(
    "wrong",
    [
        lambda inputs: True,
        lambda inputs: inputs.get("attention_mask") is None,  # unpadded batches only
        lambda inputs: len(inputs["input_ids"]) == 1,  # a single review only
    ],
    ids=["every batch", "unpadded", "single"],
)
def test_a_compile_that_changes_the_outputs_is_refused(tiny_en_dir, monkeypatch, wrong):
    monkeypatch.setattr(torch, "compile", lambda model, **_options: _Doubled(model, wrong))
    with pytest.raises(
        ModelError, match=r"compiled gives outputs .* away from its eager ones on probe batches"
    ):
        Classifier.load(str(tiny_en_dir), compile=True)
