"""The local engine's threads (engines/local.py): on the CPU a window is read only once the model is
done with the one before, and leaving waits for the part in hand, even through a Ctrl-C."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from bertattn_batch.engines.local import FeedPlan, Threads
from bertattn_batch.engines.scheduling import in_order


class Steps:
    """A window job's steps that note when they run; ``stage`` sleeps ``stage_s``."""

    def __init__(self, stage_s: float = 0.0) -> None:
        self.events: list[str] = []
        self.staged: list[int] = []
        self.stage_s = stage_s

    def encode(self, k: int) -> int:
        self.events.append(f"encode {k}")
        return k

    def score(self, k: int, on_batch) -> int:
        self.events.append(f"score {k}")
        time.sleep(0.02)
        self.events.append(f"scored {k}")
        return k

    def stage(self, k: int) -> int:
        time.sleep(self.stage_s)
        self.staged.append(k)
        return k

    def close(self) -> None:
        pass

    def read(self, n: int):
        for k in range(n):
            self.events.append(f"read {k}")
            yield k


def test_in_turn_a_window_is_read_only_once_the_model_is_done_with_the_one_before():
    """``ahead = 0`` (the CPU, where torch's threads take every core): reading and encoding never run
    beside the model, while staging does."""
    steps = Steps()
    with Threads(steps, FeedPlan(0, 1, 1), on_batch=lambda n: None) as ex:
        assert list(in_order(steps.read(4), ex.submit, ex.in_flight)) == [0, 1, 2, 3]
    for k in range(3):
        assert steps.events.index(f"scored {k}") < steps.events.index(f"read {k + 1}")
    assert steps.events.count("read 0") == 1 and steps.staged == [0, 1, 2, 3]


def test_ahead_the_reader_runs_before_the_model():
    steps = Steps()
    with Threads(steps, FeedPlan(2, 1, 2), on_batch=lambda n: None) as ex:
        assert list(in_order(steps.read(6), ex.submit, ex.in_flight)) == list(range(6))
    assert steps.events.index("read 1") < steps.events.index("scored 0")


def test_ctrl_c_while_a_part_is_staged_waits_for_it_and_drops_the_rest():
    """A Ctrl-C (or a second one) while the job waits for its stage thread must not let the clean-up
    run beside a part being written: the part in hand is finished, the ones queued are dropped."""
    steps = Steps(stage_s=0.5)
    # Python's own Ctrl-C handler, as a CLI process has it, for the test's duration
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt), Threads(steps, FeedPlan(2, 1, 1), lambda n: None) as ex:
            list(in_order(steps.read(4), ex.submit, ex.in_flight))
    finally:
        signal.signal(signal.SIGINT, before)
    assert steps.staged == [0]  # left only once the part in hand was done
