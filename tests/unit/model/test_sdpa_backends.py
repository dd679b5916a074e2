"""Every forward the classifier runs keeps cuDNN's SDPA kernel out: it builds an execution plan for each
new (batch, length) shape. The flags are process-wide, so the check runs on the CPU: they are what a CUDA
device would read at each SDPA call."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from bertattn_batch.model import Classifier, encode_texts
from bertattn_batch.model.classifier import no_cudnn_attention


@pytest.fixture
def cudnn_at_each_call(monkeypatch) -> list[bool]:
    """Whether cuDNN's SDPA kernel was allowed at each SDPA call."""
    seen: list[bool] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return seen


def test_no_forward_lets_cudnn_attention_run(tiny_en_dir, drug_rows, cudnn_at_each_call):
    clf = Classifier.load(str(tiny_en_dir), device="cpu")
    assert clf.trim is not None  # the trimmed last layer calls SDPA through its own function
    ids = [e.ids for e in encode_texts(clf.tokenizer, [r["text"][:300] for r in drug_rows[:5]], 64)]
    assert torch.backends.cuda.cudnn_sdp_enabled()
    cudnn_at_each_call.clear()  # the load's probe of the trim
    clf.forward(ids)
    clf.probabilities(ids)
    clf.gradient_x_input(ids, np.zeros(len(ids), np.int64))
    layers = clf.num_layers
    assert len(cudnn_at_each_call) == 3 * layers and not any(cudnn_at_each_call)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # put back for the rest of the process


def test_the_flag_stays_off_while_any_thread_is_inside_and_comes_back_after():
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with no_cudnn_attention():
            inside.set()
            leave.wait()

    thread = threading.Thread(target=other)
    thread.start()
    inside.wait()
    with no_cudnn_attention():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        leave.set()
        thread.join()  # the other thread left first: still off for this one
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled()
