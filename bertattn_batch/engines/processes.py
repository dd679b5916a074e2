"""The host side of a window in processes of its own, so that it scales with cores (threads share
Python's lock, which building a window's rows and tables holds most of the time).

    window i ──▶ host process i % n: encode, cut into batches ──▶ this process: the model (a thread)
      ──▶ host process i % n: fill the rows, extract, write ──▶ the staged part, back to ``run_job``

A host process keeps a window's rows between its two steps: only token ids (there) and the model's
outputs (back, in shared memory: engines/shared_outputs.py) cross. Host processes are forked from a fork
server, never from this process, which may hold threads and a CUDA context. No torch here: the fork
server imports this module.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from multiprocessing import forkserver, resource_tracker
from multiprocessing.shared_memory import SharedMemory
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import EngineError
from ..extract.job import StagedPart, Window, WindowJob
from ..runtime import signals_deferred, tune_runtime
from .scheduling import converted, then
from .shared_outputs import OutputBlocks, SharedOutputs, take

if TYPE_CHECKING:
    from ..extract.windows import WindowRows
    from ..model import Classifier, Outputs

#: What the fork server imports before any fork, where each host process would import it on its own.
PRELOAD = [__name__, "transformers", "transformers.models"]
#: glibc's settings for the host processes (a documented tunable, set where the user chose none):
#: freed memory is kept for the next window, which allocates about what the last one freed, rather
#: than mapped afresh and faulted in again (docs/performance.md).
HOST_MALLOC = "glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=268435456"
#: What the host side of a window asks of a classifier, sent to a host process in its place.
SHAPE = (
    "tokenizer", "max_length", "layers", "num_heads", "labels", "value_zeroing", "device_type",
    "contributions",
)  # fmt: skip

#: A batch's token ids as one array and each review's length: pickled in one piece.
PackedIds = tuple[np.ndarray, np.ndarray]


def start_server() -> multiprocessing.context.BaseContext:
    """The fork server's context, the server started if it is not yet (its imports run while the
    caller goes on). The resource tracker and the server start with SIGINT and SIGHUP blocked (what
    reaches the whole process group: Ctrl-C, a closed terminal), each in a block of its own (the
    tracker unblocks SIGINT as it starts), and so do the host processes forked from the server; the
    job's process decides. They also start with :data:`HOST_MALLOC` where the user set no malloc tunable."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    tuned = not any(k.startswith("MALLOC_") or k == "GLIBC_TUNABLES" for k in os.environ)
    for start in (resource_tracker.ensure_running, forkserver.ensure_running):
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGHUP})
        if tuned:
            os.environ["GLIBC_TUNABLES"] = HOST_MALLOC
        try:
            start()
        finally:
            if tuned:
                del os.environ["GLIBC_TUNABLES"]
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
    return ctx


class HostProcesses:
    """``n`` host processes (a pool of one each, so that a window's two steps meet in one process) and
    the model's thread. ``seconds`` gets the model's ``launch`` and ``device_wait``; ``usage``, once it
    is closed after a run, what the host processes used."""

    def __init__(self, n: int, clf: Classifier, job: tuple, on_batch: Callable[[int], None],
                 seconds: Counter, usage: dict[str, float]) -> None:  # fmt: skip
        self.clf, self.on_batch, self.seconds, self.usage = clf, on_batch, seconds, usage
        self.in_flight = 3 * n
        shape = SimpleNamespace(**{k: getattr(clf, k) for k in SHAPE})  # not its weights
        args = (dict(os.environ), shape, *job)
        ctx = start_server()
        self._model = ThreadPoolExecutor(1, "model")
        self._blocks = OutputBlocks()
        self._lent: dict[int, SharedMemory | None] = {}  # window -> its outputs' block, until finished
        self._pools: list[ProcessPoolExecutor] = []
        self._seq = itertools.count()
        try:
            # a process starts once the server has its imports: cut short while it waits, the job would
            # end and the server fork it all the same, into a job that is gone (a traceback)
            with signals_deferred():
                for _ in range(n):
                    self._pools.append(ProcessPoolExecutor(1, ctx, initializer=_start, initargs=args))
                    self._pools[-1].submit(int)  # starts its process now
        except BaseException as e:
            self.__exit__(type(e), e, None)
            if (error := _ended(e)) is e:
                raise
            raise error from None

    def submit(self, rows: WindowRows) -> Future[StagedPart]:
        seq = next(self._seq)
        pool = self._pools[seq % len(self._pools)]
        try:
            prepared = pool.submit(_prepare, seq, rows)
        except (BrokenProcessPool, ConnectionError) as e:  # the second: it failed to start
            raise _ended(e) from None
        scored = then(prepared, self._model, partial(self._score, seq))
        finished = then(scored, pool, partial(_finish, seq))
        finished.add_done_callback(lambda _: self._blocks.release(self._lent.pop(seq, None)))
        return converted(finished, _ended)

    def _score(self, seq: int, ids: list[PackedIds]) -> tuple[SharedOutputs | list[list[Outputs]], float]:
        from ..extract.score import score_batches  # torch, which the host processes do without

        t0 = time.perf_counter()
        outputs = []
        batches = [np.split(flat, np.cumsum(lengths)[:-1]) for flat, lengths in ids]
        for (_, lengths), out in zip(ids, score_batches(self.clf, batches, self.seconds), strict=True):
            outputs.append(out)
            self.on_batch(len(lengths))
        sent, self._lent[seq] = self._blocks.put(outputs)
        return sent, time.perf_counter() - t0

    def __enter__(self) -> HostProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        """Wait for the windows the processes have in hand (a part being written), drop the rest, and
        end the processes; after a run, note their CPU time, page faults and largest peak memory (they
        are not this process's children) first."""
        with signals_deferred():
            try:
                each = [pool.submit(_usage).result() for pool in self._pools] if exc[0] is None else []
            except (BrokenProcessPool, OSError):
                each = []
            if each:
                self.usage.update({f"host_processes_{k}": round(sum(u[k] for u in each), 3)
                                   for k in ("cpu_s", "page_faults")})  # fmt: skip
                self.usage["largest_host_process_max_rss_mb"] = round(max(u["max_rss_mb"] for u in each), 1)
            # in turn, each waited for: a second shutdown of a ProcessPoolExecutor does not wait
            for pool in [self._model, *self._pools]:
                pool.shutdown(wait=True, cancel_futures=True)
            self._blocks.close()


def _ended(e: BaseException) -> BaseException:
    if not isinstance(e, BrokenProcessPool | ConnectionError):
        return e
    return EngineError(
        "a host process ended abruptly (killed, out of memory, or it failed to start: a script that "
        'runs a job must do so under `if __name__ == "__main__":`); rerun to resume'
    )


# -- in a host process --------------------------------------------------------------------------------
#: Its WindowJob, and the windows it has prepared and not yet finished.
_job: WindowJob | None = None
_windows: dict[int, Window] = {}


def _start(environ: dict[str, str], shape: Any, *job: Any) -> None:
    """A host process's set-up. Ctrl-C and a closed terminal's SIGHUP are left to the job's process,
    which waits for the window in hand before it cleans up; the job's environment as it is now (the
    fork server has the first job's); and it ends with the job's process (killed: the one the kernel
    picks when memory runs out), which it would otherwise outlive, waiting for a task."""
    global _job
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_end_with_job, name="job-watch", daemon=True).start()
    os.environ.clear()
    os.environ.update(environ)
    tune_runtime()
    batch_tokens, max_batch_size, part_writer, pass_info, options = job
    _job = WindowJob(shape, batch_tokens, max_batch_size, part_writer, pass_info, 1, options)


def _end_with_job() -> None:
    multiprocessing.parent_process().join()
    os.kill(os.getpid(), signal.SIGTERM)


def _prepare(seq: int, rows: WindowRows) -> list[PackedIds]:
    assert _job is not None
    _windows[seq], ids = _job.prepare(rows)
    return [(np.concatenate(batch), np.array([len(x) for x in batch], np.int64)) for batch in ids]


def _finish(seq: int, scored: tuple[SharedOutputs | list[list[Outputs]], float]) -> StagedPart:
    assert _job is not None
    sent, model_seconds = scored
    return _job.finish(_windows.pop(seq), take(sent), model_seconds)


def _usage() -> dict[str, float]:
    """This process's CPU seconds, page faults and peak memory (MiB)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    rss_mb = r.ru_maxrss / (1 << 20 if sys.platform == "darwin" else 1 << 10)  # bytes there, KiB here
    return {"cpu_s": r.ru_utime + r.ru_stime, "page_faults": r.ru_minflt, "max_rss_mb": rss_mb}
