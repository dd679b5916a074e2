"""The one ordered loop (engines/scheduling.py): results in the order submitted whatever the order of
completion, at most ``bound`` in flight, and on a failure the results before it, then the error."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

import pytest

from bertattn_batch.engines.scheduling import in_order, then


class Manual:
    """``submit`` hands out futures that a thread of its own completes in a chosen order (item k's result
    is k squared, or ``fail[k]`` raised)."""

    def __init__(self, order: list[int], fail: dict[int, Exception] | None = None) -> None:
        self.futures: dict[int, Future] = {}
        self.fail = fail or {}
        self._made = threading.Condition()
        threading.Thread(target=self._complete, args=(order,), daemon=True).start()

    def submit(self, k: int) -> Future:
        with self._made:
            self.futures[k] = Future()
            self._made.notify_all()
        return self.futures[k]

    def _complete(self, order: list[int]) -> None:
        for k in order:
            with self._made:
                self._made.wait_for(lambda k=k: k in self.futures, timeout=5)
            time.sleep(0.001)
            future = self.futures.get(k)
            if future is None or not future.set_running_or_notify_cancel():
                continue
            if k in self.fail:
                future.set_exception(self.fail[k])
            else:
                future.set_result(k * k)

    def results(self, n: int, bound: int) -> list[int]:
        return list(in_order(range(n), self.submit, bound))


@pytest.mark.parametrize(
    "order",
    [
        list(range(8)),
        list(reversed(range(8))),
        [3, 1, 7, 0, 2, 6, 5, 4],
        random.Random(0).sample(range(8), 8),
    ],
    ids=["in order", "reversed", "mixed", "shuffled"],
)
def test_results_come_back_in_the_order_submitted_whatever_the_order_of_completion(order):
    assert Manual(order).results(8, bound=8) == [k * k for k in range(8)]


def test_at_most_bound_items_are_in_flight():
    rng = random.Random(1)
    delays = [rng.uniform(0, 0.005) for _ in range(40)]
    running = {"now": 0, "most": 0}
    lock = threading.Lock()
    open_at_submit = []
    taken = []

    def work(k: int) -> int:
        with lock:
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
        time.sleep(delays[k])  # later items often finish before earlier ones
        with lock:
            running["now"] -= 1
        return k

    with ThreadPoolExecutor(8) as pool:

        def submit(k: int) -> Future:
            open_at_submit.append(k - len(taken))  # submitted before it and not yet handed back
            return pool.submit(work, k)

        for k in in_order(range(40), submit, bound=3):
            taken.append(k)
    assert taken == list(range(40))
    assert max(open_at_submit) == 2 and running["most"] <= 3


def test_a_failure_in_the_middle_yields_the_results_before_it_then_raises():
    """Item 3 fails while 0 to 2 are still running: their results are handed back (finished work, to
    be committed), then its error; nothing after it is, and nothing more is submitted."""
    manual = Manual(order=[5, 3, 4, 2, 1, 0], fail={3: OSError(28, "No space left on device")})
    got = []
    with pytest.raises(OSError, match="No space left"):
        for result in in_order(range(100), manual.submit, bound=6):
            got.append(result)
    assert got == [0, 1, 4]
    assert max(manual.futures) == 5


def test_after_a_failure_what_is_left_is_cancelled():
    started = []

    def work(k: int) -> int:
        started.append(k)
        if k == 1:
            raise ValueError("item 1")
        time.sleep(0.05)
        return k

    with ThreadPoolExecutor(1) as pool:  # one at a time: the items after 1 wait in its queue
        futures = []

        def submit(k: int) -> Future:
            futures.append(pool.submit(work, k))
            return futures[-1]

        with pytest.raises(ValueError, match="item 1"):
            list(in_order(range(10), submit, bound=4))
    assert started[:2] == [0, 1] and len(futures) == 4  # the bound's worth, no more
    assert all(f.cancelled() for k, f in enumerate(futures) if k not in started)


def test_an_error_of_the_items_comes_after_the_work_before_it():
    """The reader fails: the windows it read before are finished and handed back, then its error."""

    def items():
        yield from range(3)
        raise OSError(5, "Input/output error")

    def slower_first(k: int) -> int:
        time.sleep(0.02 * (3 - k))
        return k

    with ThreadPoolExecutor(2) as pool:
        got = []
        with pytest.raises(OSError, match="Input/output error"):
            for result in in_order(items(), lambda k: pool.submit(slower_first, k), bound=8):
                got.append(result)
    assert got == [0, 1, 2]


def test_then_chains_steps_across_executors_and_passes_failures_and_cancels_on():
    with ThreadPoolExecutor(1) as first, ThreadPoolExecutor(1) as second:
        names = []

        def where(x: int) -> int:
            names.append(threading.current_thread().name)
            return x + 1

        assert then(first.submit(where, 1), second, where).result() == 3
        assert len(set(names)) == 2
        failed = then(first.submit(int, "x"), second, where)
        with pytest.raises(ValueError):
            failed.result()
        gate = threading.Event()
        blocker = first.submit(gate.wait)  # the next one waits in first's queue
        queued = first.submit(where, 1)
        chained = then(queued, second, where)
        assert chained.cancel() and queued.cancelled()  # cancelled upstream, so never run
        gate.set()
        blocker.result()
        with pytest.raises(CancelledError):
            chained.result()
