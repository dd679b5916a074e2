"""The process a job runs in: its stop-signal handlers (installed once by the CLI; ``signals_deferred``
for a block that must finish), and the native libraries' settings (``tune_runtime``, called by
``run_job`` and every command; docs/performance.md tells why).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

from .errors import Terminated

#: Read by torch's and Arrow's native libraries when they first need them; a value the user set is
#: kept. Small kernel caches (oneDNN's, and ideep's for bfloat16) keep a long run's memory flat, as
#: length-bucketed batches come in hundreds of shapes; jemalloc hands Arrow's freed memory back.
RUNTIME_ENV = {
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "2",
    "LRU_CACHE_CAPACITY": "16",
    "TOKENIZERS_PARALLELISM": "false",  # a job runs its own encode threads
}
if sys.platform == "linux":  # where pyarrow's wheels include jemalloc
    RUNTIME_ENV["ARROW_DEFAULT_MEMORY_POOL"] = "jemalloc"


def tune_runtime() -> dict[str, str]:
    """Set :data:`RUNTIME_ENV` where the user has not; returns the values in force (a Ray worker gets
    the same). It must come before torch's first computation and pyarrow's first allocation."""
    for key, value in RUNTIME_ENV.items():
        os.environ.setdefault(key, value)
    return {key: os.environ[key] for key in RUNTIME_ENV}


#: The signals that stop a job as Ctrl-C does.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
INTERRUPTED = "interrupted; rerun the same command to resume"
#: What the CLI's handler does with a stop signal: "exit" (before a library call: the ``interrupted``
#: line and 128 + the signal), "raise" (inside one, so that its clean-up runs), "ignore" (once the
#: command's work is done: a scheduler never sees a failure of a run that succeeded).
on_stop = {"mode": "exit"}


def on_signal(signum: int, frame: object) -> None:
    """The CLI's handler of SIGINT, SIGTERM and SIGHUP (see :data:`on_stop`)."""
    if on_stop["mode"] == "ignore":
        return
    if on_stop["mode"] == "raise":
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop = Terminated()
        stop.signum = signum
        raise stop
    print(INTERRUPTED, file=sys.stderr)
    raise SystemExit(128 + signum)


def install_signal_handlers() -> None:
    """Install :func:`on_signal` for every stop signal but a SIGHUP that ``nohup`` set to be ignored (a
    job started so must outlive its terminal). Called once, first thing, by ``bertattn``."""
    for sig in STOP_SIGNALS:
        if not (sig == signal.SIGHUP and signal.getsignal(sig) is signal.SIG_IGN):
            signal.signal(sig, on_signal)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP (their Python handlers, in the main thread) until the end of the
    block, where they act as they would have: for a block that must finish once begun."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = {sig: h for sig in STOP_SIGNALS if callable(h := signal.getsignal(sig))}
    for sig in held:
        signal.signal(sig, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        if caught:  # a scheduler's SIGTERM after a Ctrl-C still ends the job as stopped by it
            signal.raise_signal(signal.SIGTERM if signal.SIGTERM in caught else caught[0])
