"""score_batches: each batch is queued on the device before the one before it is read back, and the
outputs still come back in order, halves included."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bertattn_batch.errors import ModelError
from bertattn_batch.extract.score import score_batches


class Recorder:
    """A classifier stand-in that logs when each batch is queued and when it is read back."""

    device = torch.device("cpu")

    def __init__(self, limit: int = 1_000, error: type[Exception] = torch.OutOfMemoryError) -> None:
        self.log: list[str] = []
        self.limit = limit  # batches over this many reviews run out of memory
        self.error = error
        self.oom_tokens = None

    def launch(self, ids: list[np.ndarray]) -> SimpleNamespace:
        name = ",".join(str(int(x[0])) for x in ids)
        if len(ids) > self.limit:
            self.log.append(f"oom {name}")
            raise self.error("CUDA error: out of memory (simulated)")
        self.log.append(f"launch {name}")

        def result() -> str:
            self.log.append(f"result {name}")
            return name

        return SimpleNamespace(result=result)


def batches(*sizes: int) -> list[list[np.ndarray]]:
    out, k = [], 0
    for n in sizes:
        out.append([np.array([k + i]) for i in range(n)])
        k += n
    return out


def test_the_next_batch_is_queued_before_the_last_is_read_back():
    clf = Recorder()
    got = list(score_batches(clf, batches(1, 1, 1)))
    assert got == [["0"], ["1"], ["2"]]
    assert clf.log == ["launch 0", "launch 1", "result 0", "launch 2", "result 1", "result 2"]


def test_a_batch_out_of_memory_is_queued_in_halves_in_order():
    clf = Recorder(limit=1)
    got = list(score_batches(clf, batches(1, 3)))
    assert got == [["0"], ["1", "2", "3"]]  # batch 1's halves: [1], then [2, 3] halved again
    assert clf.log == [
        "launch 0", "oom 1,2,3", "launch 1", "oom 2,3", "launch 2", "launch 3",
        "result 0", "result 1", "result 2", "result 3",
    ]  # fmt: skip


def test_a_single_review_out_of_memory_is_an_error():
    with pytest.raises(ModelError, match="single review"):
        list(score_batches(Recorder(limit=0), batches(1)))


def test_a_batch_as_big_as_one_out_of_memory_is_halved_before_it_is_tried():
    clf = Recorder(limit=2)
    got = list(score_batches(clf, batches(4, 4, 2)))
    assert got == [["0,1", "2,3"], ["4,5", "6,7"], ["8,9"]]  # each batch's halves, in order
    assert [e for e in clf.log if e.startswith("oom")] == ["oom 0,1,2,3"]  # once, not once a batch
    assert clf.oom_tokens == 4


def test_an_allocation_failure_outside_torchs_allocator_is_halved_too():
    clf = Recorder(limit=1, error=RuntimeError)  # pinned host memory, a cuBLAS handle
    assert list(score_batches(clf, batches(2))) == [["0", "1"]]
    assert clf.log[0] == "oom 0,1"


def test_other_runtime_errors_are_not_taken_for_out_of_memory():
    class Broken(Recorder):
        def launch(self, ids):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        list(score_batches(Broken(), batches(2)))
