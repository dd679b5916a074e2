"""The engines' thread helpers: several threads, results still in the order the items were put."""

from __future__ import annotations

import random
import threading
import time

import pytest

from bertattn_batch.engines.threads import Worker


def test_several_threads_hand_back_results_in_put_order():
    rng = random.Random(0)
    delays = [rng.uniform(0, 0.01) for _ in range(60)]
    seen_threads: set[str] = set()

    def slow(i: int) -> int:
        seen_threads.add(threading.current_thread().name)
        time.sleep(delays[i])  # later items often finish before earlier ones
        return i * i

    worker = Worker(slow, depth=4, threads=3)
    out = []
    for i in range(len(delays)):
        worker.put(i)
        out += worker.results()
    out += worker.close()
    assert out == [i * i for i in range(len(delays))]
    assert len(seen_threads) == 3


def test_an_error_on_one_thread_is_raised_and_the_others_stop_taking_work():
    started = []

    def fails_on_five(i: int) -> int:
        started.append(i)
        if i == 5:
            raise ValueError("item 5")
        time.sleep(0.005)
        return i

    worker = Worker(fails_on_five, depth=2, threads=2)
    out = []
    for i in range(40):
        if worker.failed:
            break
        worker.put(i)
        out += worker.results()
    out += worker.close()
    with pytest.raises(ValueError, match="item 5"):
        worker.check()
    assert len(started) < 40
    assert out == [0, 1, 2, 3, 4]  # every item before the failed one, none after it


def test_items_finished_before_a_failure_are_handed_out_even_when_it_fails_first():
    """The item after a slow one fails first: the slow one's result is still handed out (its part is
    finished work, to be committed), the ones after the failure are not."""
    release = threading.Event()

    def stage(i: int) -> int:
        if i == 0:
            release.wait(5)
        if i == 1:
            raise OSError(28, "No space left on device")
        return i

    worker = Worker(stage, depth=4, threads=3)
    for i in range(3):
        worker.put(i)
    deadline = time.monotonic() + 5
    while not worker.failed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.failed and worker.results() == []
    worker.put(3)  # dropped: an item has failed
    release.set()
    assert worker.close() == [0]
    with pytest.raises(OSError, match="No space left"):
        worker.check()
