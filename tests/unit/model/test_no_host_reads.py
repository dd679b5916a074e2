"""Launching a batch reads no value of the device's tensors on the host: such a read (``bool(t)``,
``t.item()``) waits for every batch queued before it, and on a GPU the device then idles while the host
launches the next one. Checked on the CPU by the torch functions the launch calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from bertattn_batch.model import Classifier

#: The Tensor methods that hand a value to Python, which on a GPU means waiting for it.
_READS = {
    torch.Tensor.__bool__, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__,
    torch.Tensor.__float__, torch.Tensor.__index__,
}  # fmt: skip


class HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _READS:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("trim", [True, False])
@pytest.mark.parametrize("lengths", [(7, 5, 3), (6, 6)], ids=["padded", "unpadded"])
def test_launch_reads_nothing_back(tiny_en_dir, trim, lengths):
    clf = Classifier.load(str(tiny_en_dir), device="cpu", dtype="float32", trim_last_layer=trim)
    assert (clf.trim is not None) == trim
    ids = [np.array([clf.tokenizer.cls_token_id] + [100 + i for i in range(n - 2)]
                    + [clf.tokenizer.sep_token_id]) for n in lengths]  # fmt: skip
    with HostReads() as reads:
        pending = clf.launch(ids)
    assert reads.seen == []
    got = pending.result()
    for i, x in enumerate(ids):  # each review alone, without padding
        alone = clf.forward([x])
        np.testing.assert_allclose(got.rows[i, ..., : len(x)], alone.rows[0], atol=1e-6)
        np.testing.assert_allclose(got.probs[i], alone.probs[0], atol=1e-6)


def test_a_read_is_seen():
    """The check itself sees a read."""
    mask = torch.ones(2, 4, dtype=torch.bool)
    with HostReads() as reads:
        if mask.all():
            pass
    assert reads.seen == ["__bool__"]
