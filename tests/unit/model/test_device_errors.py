"""A device that is not there, or too small for the model, is one line, and leaves nothing held."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from bertattn_batch.errors import ModelError, SpecError
from bertattn_batch.model import Classifier, resolve_device, resolve_dtype


def test_a_cuda_device_past_the_last_one_is_named_with_the_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(
        SpecError, match=r"'cuda:2' asked for, but this machine has 2 CUDA device\(s\) \(cuda:0 to cuda:1\)"
    ):
        resolve_device("cuda:2")


@pytest.mark.parametrize(("capability", "dtype"), [((7, 5), torch.float16), ((8, 0), torch.bfloat16)])
def test_auto_dtype_is_float16_on_a_gpu_that_only_emulates_bfloat16(monkeypatch, capability, dtype):
    asked = []

    def capability_of(device):  # as a T4 (7.5) or an A100 (8.0); torch's check says yes to both
        asked.append(device)
        return capability

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability_of)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", torch.device("cuda:1")) == dtype
    assert asked == [torch.device("cuda:1")]  # the device asked for, not the current one


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


@pytest.mark.parametrize("fails", [False, True], ids=["done", "out of memory"])
def test_a_batchs_activations_are_let_go_once_its_outputs_are_made(tiny_en_dir, fails):
    """Else a GPU keeps every key and value of the last batch (all its tokens) while the host works, and
    through the emptying of its cache before a batch out of memory is retried in halves."""
    clf = Classifier.load(str(tiny_en_dir), device="cpu", value_zeroing=True)
    keys = []
    module = clf.model.bert.encoder.layer[-2].attention.self.key
    module.register_forward_hook(lambda _m, _i, out: keys.append(weakref.ref(out)))
    if fails:

        def full(_m, _i, _out):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

        clf.model.bert.encoder.layer[-1].register_forward_hook(full)
    ids = [np.arange(5, 12), np.arange(5, 9)]
    if fails:
        with pytest.raises(torch.OutOfMemoryError):
            clf.forward(ids)
    else:
        pending = clf.launch(ids)  # outputs not read back yet, as a job's batch ahead
    gc.collect()
    assert keys and keys[0]() is None
    if not fails:
        assert len(pending.result().probs) == 2


def test_loading_a_model_draws_no_progress_bar_of_transformers(tiny_en_dir, capfd):
    """transformers' "Loading weights" bar came on every load, whatever the caller's progress=False
    (a loop of plot_review calls filled stderr with them)."""
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    Classifier.load(str(tiny_en_dir), device="cpu")
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()  # the caller's setting, as it was
