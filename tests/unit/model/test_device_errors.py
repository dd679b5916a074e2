"""A device that is not there, or too small for the model, is one line, and leaves nothing held."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from bertattn_batch.errors import ModelError, SpecError
from bertattn_batch.model import Classifier, resolve_device


def test_a_cuda_device_past_the_last_one_is_named_with_the_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(
        SpecError, match=r"'cuda:2' asked for, but this machine has 2 CUDA device\(s\) \(cuda:0 to cuda:1\)"
    ):
        resolve_device("cuda:2")


@pytest.mark.parametrize(("dtype", "hint"), [("float32", True), ("bfloat16", False)])
def test_a_model_that_does_not_fit_is_one_line_and_is_let_go(tiny_en_dir, monkeypatch, dtype, hint):
    moved = []

    def full(self, *args, **kwargs):  # as a device out of memory halfway through the weights
        moved.append(weakref.ref(self))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    monkeypatch.setattr(torch.nn.Module, "to", full)
    with pytest.raises(
        ModelError, match=r"does not fit on cpu: free the device or choose another \(--device\)"
    ) as e:
        Classifier.load(str(tiny_en_dir), device="cpu", dtype=dtype)
    assert ("--dtype bfloat16" in str(e.value)) == hint  # half the memory, where it is not half already
    gc.collect()
    assert moved and moved[0]() is None  # while the error, and its traceback, are still held
