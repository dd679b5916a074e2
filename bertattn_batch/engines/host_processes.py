"""The host side of a window in processes of its own, so that it scales with cores: this process
reads windows and runs the model; each host process encodes, extracts and writes the windows it is
given.

    reader (a thread) ──▶ host process k: encode, cut into batches ──▶ this process: the model
      ──▶ host process k: fill the rows, extract, write ──▶ staged parts, in row order, to ``run_job``

Threads alone cannot do this on many cores: building a window's rows and tables holds Python's lock
for most of the host's time (docs/performance.md). Window ``i`` goes to process ``i % n``, which keeps
its rows between the two calls; only token ids (there) and the model's outputs (back) cross, as whole
arrays, the outputs through shared memory (engines/shared_outputs.py). At most ``2 n`` windows are read
ahead and ``n`` wait to be taken, so memory stays bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ..errors import EngineError
from ..extract.job import PassInfo, StagedPart, Window, WindowJob
from ..extract.plan import ModelShape, PackedIds, unpack_ids
from ..runtime import keep_heap, tune_runtime
from . import fork_server
from .shared_outputs import OutputBlocks, SharedOutputs, take
from .threads import prefetch

if TYPE_CHECKING:  # a host process imports this module without torch: see _lazy.lazy_exports
    from ..extract.windows import WindowRows
    from ..model import Classifier, Outputs
    from ..run import PartWriter


# One per host process: its WindowJob, and the windows it has prepared and not yet finished.
_job: WindowJob | None = None
_windows: dict[int, Window] = {}


def _start(environ: dict[str, str], model: ModelShape, batch_tokens: int, max_batch_size: int,
           part_writer: PartWriter, pass_info: PassInfo, store_text: bool) -> None:  # fmt: skip
    """Set up a host process's job (its first task), in the job's environment as it is now: a process
    forked from the fork server got the server's, as it was when the first job started it."""
    global _job
    os.environ.clear()
    os.environ.update(environ)
    tune_runtime()
    keep_heap()  # a host process does nothing but windows, each taking about what the last one freed
    _job = WindowJob(model, batch_tokens, max_batch_size, part_writer, pass_info, 1, store_text)


def _init(job_alive: Connection) -> None:
    """A host process's first step, before it takes any task. Ctrl-C (and a closed terminal's SIGHUP,
    which reaches the whole process group too) is left to the job's process, which waits for the window
    in hand before it cleans up: a host process stopped by it mid-write would leave that to chance."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    threading.Thread(target=_end_with, args=(job_alive,), name="job-watch", daemon=True).start()


def _end_with(job_alive: Connection) -> None:
    """End this process once the job's process is gone (killed: it holds the model, so it is the one
    the kernel picks when memory runs out). A host process waits for its next task on a queue whose
    write end it holds itself, so it would never see the job go, and would live on, orphaned. Nothing is
    ever sent on ``job_alive``, whose other end only the job's process holds: it reads end of file once
    that process is gone."""
    with contextlib.suppress(EOFError, OSError):
        job_alive.recv()
    os._exit(1)


def _prepare(seq: int, rows: WindowRows) -> list[PackedIds]:
    assert _job is not None
    _windows[seq], ids = _job.prepare(rows)
    return ids


def _usage() -> dict[str, float]:
    """This host process's CPU seconds, page faults and peak memory (MiB) so far; none without the
    ``resource`` module (Windows)."""
    try:
        import resource
    except ImportError:
        return {}
    r = resource.getrusage(resource.RUSAGE_SELF)
    rss_mb = r.ru_maxrss / (1 << 20 if sys.platform == "darwin" else 1 << 10)  # bytes there, KiB here
    return {"cpu_s": r.ru_utime + r.ru_stime, "page_faults": r.ru_minflt, "max_rss_mb": rss_mb}


def _finish(seq: int, outputs: SharedOutputs | list[list[Outputs]], model_seconds: float) -> StagedPart:
    assert _job is not None
    return _job.finish(_windows.pop(seq), take(outputs), model_seconds)


class HostProcesses:
    """``n`` host processes, forked from a fresh server (engines/fork_server.py), never from this process:
    it may hold threads and a CUDA context, which a fork would copy half-made."""

    def __init__(self, n: int, clf: Classifier, batch_tokens: int, max_batch_size: int,
                 part_writer: PartWriter, pass_info: PassInfo, store_text: bool) -> None:  # fmt: skip
        t0 = time.perf_counter()
        #: Where this process's time went besides scoring (``launch``, ``device_wait``): starting the
        #: host processes (``host_start``), waiting for them to hand a window over (``wait_prepared``)
        #: or to finish one (``wait_finished``), and the caller's time with each part (``commit``). The
        #: device idles through all but the last.
        self.seconds: Counter = Counter()
        #: What the host processes used, all together (their peak memory: the largest), once a run ends:
        #: their CPU time counts nowhere else, as they are not this process's children.
        self.usage: dict[str, float] = {}
        self.clf = clf
        ctx = fork_server.context()
        args = (dict(os.environ), ModelShape.of(clf), batch_tokens, max_batch_size, part_writer, pass_info,
                store_text)  # fmt: skip
        self._watch = ctx.Pipe(duplex=False)  # the host processes read, this one holds the write end
        #: where the model's outputs for each host process are put (engines/shared_outputs.py)
        self._blocks = [OutputBlocks() for _ in range(n)]
        self._pools: list[ProcessPoolExecutor] = []
        self._submitted: list[Future] = []
        try:
            self._pools += [
                ProcessPoolExecutor(1, mp_context=ctx, initializer=_init, initargs=(self._watch[0],))
                for _ in range(n)
            ]
            # the job is set up by a first task, not by the initializer: its arguments (the tokenizer)
            # would go into the process's start-up pipe, and a process that failed to start before
            # reading them (a script without ``if __name__ == "__main__":`` runs its job again there)
            # would leave this one waiting forever to finish writing them
            with fork_server.signals_held():  # each process starts on its first task
                self._ready = [self._submit(k, _start, *args) for k in range(n)]
        except BaseException:  # the processes started so far end (Ctrl-C, or one that failed to start)
            self.close()
            raise
        self.seconds["host_start"] += time.perf_counter() - t0

    def parts(
        self, windows: Iterator[WindowRows], on_batch: Callable[[int], None] | None = None
    ) -> Iterator[StagedPart]:
        """Each window's staged part, in row order. When a window fails, the parts of the windows
        before it are still handed back (finished work, to be committed), then its error is raised."""
        from ..extract.score import score_batches  # torch, which the host processes do without

        n = len(self._pools)
        prepared: deque[tuple[int, Future]] = deque()
        finishing: deque[Future] = deque()
        reader = enumerate(prefetch(windows, depth=2))
        seconds = self.seconds
        try:
            while True:
                try:
                    while len(prepared) < 2 * n and (item := next(reader, None)) is not None:
                        seq, rows = item
                        prepared.append((seq, self._submit(seq % n, _prepare, seq, rows)))
                    if not prepared:
                        break
                    seq, future = prepared.popleft()
                    _timed(seconds, "host_start", self._ready[seq % n])  # its error, if it failed to start
                    ids = _timed(seconds, "wait_prepared", future)
                    t0 = time.perf_counter()
                    outputs = []
                    batches = score_batches(self.clf, map(unpack_ids, ids), seconds)
                    for packed, out in zip(ids, batches, strict=True):
                        outputs.append(out)
                        if on_batch is not None:
                            on_batch(len(packed[1]))
                    model_seconds = time.perf_counter() - t0
                    # a slot is written again only after the window that used it is finished: the
                    # loop below leaves at most n windows finishing, and slots alternate every n
                    sent = self._blocks[seq % n].put((seq // n) % 2, outputs)
                    finishing.append(self._submit(seq % n, _finish, seq, sent, model_seconds))
                except Exception:
                    while finishing:  # the windows before the failed one first
                        yield _result(finishing.popleft())
                    raise
                while finishing and (finishing[0].done() or len(finishing) > n):
                    part = _timed(seconds, "wait_finished", finishing.popleft())
                    t0 = time.perf_counter()
                    yield part
                    seconds["commit"] += time.perf_counter() - t0
            while finishing:
                yield _timed(seconds, "wait_finished", finishing.popleft())
            self.usage = self._usage()
        finally:
            self.close()

    def _usage(self) -> dict[str, float]:
        """Best effort: a host process that ended after its last window leaves the run's figures out,
        not the run unfinished."""
        try:
            each = [_result(self._submit(k, _usage)) for k in range(len(self._pools))]
        except EngineError:
            return {}
        if not all(each):
            return {}
        total = {key: sum(u[key] for u in each) for key in ("cpu_s", "page_faults")}
        return {f"host_processes_{k}": round(v, 3) for k, v in total.items()} | {
            "largest_host_process_max_rss_mb": round(max(u["max_rss_mb"] for u in each), 1)
        }

    def close(self) -> None:
        """Wait for the window each process has in hand (it may be writing a part's files, and the job's
        clean-up must not run beside it), drop the rest, end the processes and remove the shared blocks.

        A stop signal meanwhile (a second Ctrl-C, a closed terminal's SIGHUP right after the last part)
        acts at the end: cut short, the close left shared-memory blocks behind, or a part half written.
        The wait is on the tasks' futures: the pool's own ``shutdown(wait=True)`` joins a thread, and an
        interrupted join returns as if it had ended."""
        with fork_server.signals_held():
            for pool in self._pools:
                pool.shutdown(wait=False, cancel_futures=True)
            while pending := [f for f in self._submitted if not f.done()]:
                futures.wait(pending, timeout=0.1)
            for end in self._watch:
                end.close()
            for blocks in self._blocks:
                blocks.close()

    def _submit(self, k: int, fn: Callable[..., Any], *args: Any) -> Future:
        """``fn(*args)`` in host process ``k``; its future is kept until done, for :meth:`close`."""
        try:
            future = self._pools[k].submit(fn, *args)
        except (BrokenProcessPool, EOFError, ConnectionError):  # the last two: the fork server is gone
            raise _ended() from None
        self._submitted = [f for f in self._submitted if not f.done()] + [future]
        return future


def _timed(seconds: Counter, what: str, future: Future) -> Any:
    """``future``'s result, the wait for it added to ``seconds[what]``."""
    t0 = time.perf_counter()
    try:
        return _result(future)
    finally:
        seconds[what] += time.perf_counter() - t0


def _result(future: Future) -> Any:
    try:
        return future.result()
    except BrokenProcessPool:
        raise _ended() from None


def _ended() -> EngineError:
    return EngineError(
        "a host process ended abruptly (killed, out of memory, or it failed to start: a script that "
        'runs a job must do so under `if __name__ == "__main__":`); rerun to resume'
    )
