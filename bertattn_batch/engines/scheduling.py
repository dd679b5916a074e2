"""The one ordered loop over futures that every engine's windows go through (``in_order``), and the
chaining of a window's steps across executors (``then``)."""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, InvalidStateError
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def in_order(items: Iterable[T], submit: Callable[[T], Future[R]], bound: int) -> Iterator[R]:
    """Submit each item, with at most ``bound`` submitted and not yet handed back, and yield their
    results in the order submitted.

    When a task fails, or ``items`` raises, the results of every item before it are still yielded
    (finished work, to be committed), nothing after it; then its error is raised. What is left is
    cancelled on the way out; whoever runs the tasks waits for those already running."""
    pending: deque[Future[R]] = deque()
    items = iter(items)
    try:
        while not any(f.done() and (f.cancelled() or f.exception()) for f in pending):
            while pending and (len(pending) >= bound or pending[0].done()):
                yield pending.popleft().result()
            try:
                item = next(items)
            except StopIteration:
                break
            except Exception:  # the reader's error, after the work before it
                while pending:
                    yield pending.popleft().result()
                raise
            pending.append(submit(item))
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()


def then(future: Future, executor: Executor, fn: Callable[[Any], R]) -> Future[R]:
    """The future of ``fn(future.result())`` on ``executor``; a failure passes on, a cancel goes back."""
    out: Future[R] = Future()

    def step(done: Future) -> None:
        if out.cancelled():
            return
        try:
            inner = executor.submit(fn, done.result())
        except BaseException as e:  # the step before failed or was cancelled, or the executor is closed
            settle(out, e)
        else:
            inner.add_done_callback(lambda f: settle(out, f))

    future.add_done_callback(step)
    out.add_done_callback(lambda f: f.cancelled() and future.cancel())
    return out


def converted(future: Future[R], convert: Callable[[BaseException], BaseException]) -> Future[R]:
    """A future of the same outcome as ``future``, its error passed through ``convert``."""
    out: Future[R] = Future()
    future.add_done_callback(lambda f: settle(out, f, convert))
    return out


def settle(
    out: Future, done: Future | BaseException, convert: Callable[[BaseException], BaseException] = lambda e: e
) -> None:
    """Give ``out`` the outcome of ``done`` (a future, or an error), an error through ``convert``."""
    with contextlib.suppress(InvalidStateError):
        if isinstance(done, BaseException):
            out.set_exception(convert(done))
        elif done.cancelled():
            out.cancel()
        elif (error := done.exception()) is not None:
            out.set_exception(convert(error))
        else:
            out.set_result(done.result())
