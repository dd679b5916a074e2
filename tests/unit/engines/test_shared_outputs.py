"""The model's outputs through shared memory (engines/shared_outputs.py): read back as they were put, a
block lent to one window at a time and lent again once released, the pipe where shared memory is short,
and nothing left in /dev/shm once closed."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bertattn_batch.engines import shared_outputs
from bertattn_batch.engines.shared_outputs import OutputBlocks, SharedOutputs, take
from bertattn_batch.model.encode import Outputs

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")


def _window(seed: int, batches: int = 2) -> list[list[Outputs]]:
    rng = np.random.default_rng(seed)
    out = []
    for b in range(batches):
        n, s = 3 + b, 7 + b
        rows, norms = rng.random((n, 1, 4, s), np.float32), rng.random((n, 1, 4, s), np.float32)
        out.append(
            [Outputs(rng.random((n, 2), np.float32), rows, norms, None, rng.random((n, s), np.float32))]
        )
    return out


def _same(got: list[list[Outputs]], expected: list[list[Outputs]]) -> None:
    assert len(got) == len(expected)
    for pieces, want in zip(got, expected, strict=True):
        for out, w in zip(pieces, want, strict=True):
            for a, b in zip(out, w, strict=True):
                assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b))


def test_outputs_are_read_back_as_they_were_put_and_blocks_are_lent_one_window_at_a_time():
    blocks = OutputBlocks()
    try:
        first, second = _window(0), _window(1)
        sent, block = blocks.put(first)
        assert isinstance(sent, SharedOutputs) and block is not None
        _same(take(sent), first)
        sent2, block2 = blocks.put(second)  # the first window's block is still lent
        assert sent2.name != sent.name
        _same(take(sent2), second)
        _same(take(sent), first)  # untouched by the second window
        blocks.release(block)
        third = _window(2)
        sent3, _ = blocks.put(third)
        assert sent3.name == sent.name  # lent again, its pages already mapped
        _same(take(sent3), third)
        blocks.release(block2)
        sent4, _ = blocks.put(_window(3, batches=40))  # larger than any free block: a new one
        assert sent4.name not in (sent.name, sent2.name)
        _same(take(sent4), _window(3, batches=40))
    finally:
        blocks.close()
    for name in (sent.name, sent2.name, sent4.name):
        assert not os.path.exists(f"/dev/shm/{name.lstrip('/')}")


def test_where_shared_memory_is_short_the_outputs_go_through_the_pipe(monkeypatch, caplog):
    monkeypatch.setattr(shared_outputs, "room_for", lambda size: False)
    blocks = OutputBlocks()
    window = _window(0)
    sent, block = blocks.put(window)
    assert sent is window and block is None and take(sent) is window
    blocks.put(window)
    assert caplog.text.count("the model's outputs go through pipes") == 1
    blocks.close()
