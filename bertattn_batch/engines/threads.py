"""Run stages in background threads so that reading, the model and writing overlap.

Usage::

    writer = Worker(stage, depth=2, threads=2)            # stage(item) -> result, on two threads
    for window in prefetch(read_and_encode(), depth=2):   # producer runs ahead in a thread
        if writer.failed:
            break
        writer.put(score(window))
        for result in writer.results():                   # what the threads finished so far, in order
            commit(result)
    for result in writer.close():                         # waits; the rest, up to a failed item
        commit(result)
    writer.check()                                        # re-raises the stage's error, if any
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_DONE = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def prefetch(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Iterate ``items`` in a daemon thread, at most ``depth`` ahead; its exceptions surface here.

    ``depth=0``: the thread makes an item only when the consumer asks for one, so that it never runs
    beside the consumer. The items are still made in a thread of their own: made in the model's thread,
    windows raised its peak memory 18% from 20k to 200k reviews, against 7% from a thread.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=max(depth, 1))
    asked = threading.Semaphore(0) if depth == 0 else None
    stop = threading.Event()

    def put(item: Any) -> bool:
        """Hand ``item`` over; False once the consumer has stopped (a plain put would wait forever)."""
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def wait_until_asked() -> bool:
        while asked is not None and not stop.is_set():
            if asked.acquire(timeout=0.1):
                return True
        return not stop.is_set()

    def produce() -> None:
        try:
            it = iter(items)
            while wait_until_asked():
                item = next(it, _DONE)
                if not put(item) or item is _DONE:
                    return
        except BaseException as e:  # handed to the consumer, raised there
            put(_Failure(e))

    thread = threading.Thread(target=produce, name="prefetch", daemon=True)
    thread.start()
    try:
        while True:
            if asked is not None:
                asked.release()
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()


class Worker:
    """``threads`` threads that apply ``fn`` to the items put, keeping what it returns for
    :meth:`results` in the order the items were put.

    At most ``depth`` items wait for a thread, and a result finished ahead of an earlier item's waits
    for it, so that whoever takes the results (the commits) sees them in order. When an item fails, the
    results of every item put before it are still handed out (they are finished work, to be committed),
    nothing after it is; :meth:`check` then raises its error.
    """

    def __init__(
        self, fn: Callable[[Any], Any], depth: int = 2, name: str = "worker", threads: int = 1
    ) -> None:
        self._fn = fn
        self._q: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._lock = threading.Lock()
        self._done: dict[int, Any] = {}  # sequence number -> result
        self._put = self._taken = 0  # sequence numbers of the next item put, and the next result taken
        self._error: BaseException | None = None
        self._failed_at: int | None = None  # sequence number of the earliest item that failed
        self._cancelled = False
        self._running = threads
        self._finished = threading.Event()  # waited on instead of join(), which Ctrl-C can confuse
        for i in range(threads):
            threading.Thread(target=self._loop, name=f"{name}-{i}" if i else name, daemon=True).start()

    @property
    def failed(self) -> bool:
        """Whether an item has failed: the items put from now on are dropped."""
        return self._error is not None

    def _loop(self) -> None:
        try:
            while (item := self._q.get()) is not _DONE:
                seq, value = item
                if self._cancelled or (self._failed_at is not None and seq > self._failed_at):
                    continue
                try:
                    result = self._fn(value)
                    with self._lock:
                        self._done[seq] = result
                except BaseException as e:
                    with self._lock:
                        if self._failed_at is None or seq < self._failed_at:
                            self._error, self._failed_at = e, seq
        finally:
            with self._lock:
                self._running -= 1
                if not self._running:
                    self._finished.set()

    def put(self, item: Any) -> None:
        """Queue ``item`` (waits while ``depth`` items wait); dropped once an item has failed."""
        if self._error is None:
            self._q.put((self._put, item))
            self._put += 1

    def results(self) -> list[Any]:
        """What the threads have finished since the last call, in the order the items were put, up to
        the first item still in hand or failed."""
        out = []
        with self._lock:
            end = self._put if self._failed_at is None else self._failed_at
            while self._taken < end and self._taken in self._done:
                out.append(self._done.pop(self._taken))
                self._taken += 1
        return out

    def close(self) -> list[Any]:
        """Wait for every item to be handled; returns the results not yet taken, up to a failed item
        (:meth:`check` raises its error).

        A Ctrl-C while waiting drops the items not yet started but still waits for those in hand (they
        may be writing a part's files, and the caller's clean-up must not run beside them), then
        re-raises.
        """
        interrupted: KeyboardInterrupt | None = None
        unsent = self._running  # an end marker for each thread
        while not self._finished.is_set():
            try:
                while unsent:
                    self._q.put(_DONE, timeout=0.1)
                    unsent -= 1
                self._finished.wait(0.1)
            except queue.Full:
                continue
            except KeyboardInterrupt as e:  # Ctrl-C, or the CLI's SIGTERM (a subclass)
                interrupted = interrupted or e
                self._cancelled = True
        if interrupted is not None:
            raise interrupted
        return self.results()

    def check(self) -> None:
        """Raise the error of the item that failed, if one did."""
        if self._error is not None:
            raise self._error
