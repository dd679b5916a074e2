"""The host side of a window in processes of its own, so that it scales with cores: this process
reads windows and runs the model; each host process encodes, extracts and writes the windows it is
given.

    reader (a thread) ──▶ host process k: encode, cut into batches ──▶ this process: the model
      ──▶ host process k: fill the rows, extract, write ──▶ staged parts, in row order, to ``run_job``

Threads alone cannot do this on many cores: building a window's rows and tables holds Python's lock
for most of the host's time (docs/performance.md). Window ``i`` goes to process ``i % n``, which keeps
its rows between the two calls; only token ids (there) and the model's outputs (back) cross, as whole
arrays. At most ``2 n`` windows are read ahead and ``n`` wait to be taken, so memory stays bounded.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from ..errors import EngineError
from ..extract.job import PassInfo, StagedPart, Window, WindowJob
from ..extract.plan import ModelShape, PackedIds, unpack_ids
from ..runtime import tune_runtime
from .threads import prefetch

if TYPE_CHECKING:  # a host process imports this module without torch: see _util.lazy_exports
    from ..extract.windows import WindowRows
    from ..model import Classifier, Outputs
    from ..run import PartWriter


# One per host process: its WindowJob, and the windows it has prepared and not yet finished.
_job: WindowJob | None = None
_windows: dict[int, Window] = {}


def _start(model: ModelShape, batch_tokens: int, max_batch_size: int, part_writer: PartWriter,
           pass_info: PassInfo, store_text: bool) -> None:  # fmt: skip
    """Set up a host process. Ctrl-C is left to the job's process, which waits for the window in hand
    before it cleans up: a host process stopped by it mid-write would leave that to chance."""
    global _job
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tune_runtime()
    _job = WindowJob(model, batch_tokens, max_batch_size, part_writer, pass_info, 1, store_text)


def _prepare(seq: int, rows: WindowRows) -> list[PackedIds]:
    assert _job is not None
    _windows[seq], ids = _job.prepare(rows)
    return ids


def _finish(seq: int, outputs: list[list[Outputs]], model_seconds: float) -> StagedPart:
    assert _job is not None
    return _job.finish(_windows.pop(seq), outputs, model_seconds)


class HostProcesses:
    """``n`` host processes (spawned: the model's process may hold threads and a CUDA context, which a
    fork would copy half-made)."""

    def __init__(self, n: int, clf: Classifier, batch_tokens: int, max_batch_size: int,
                 part_writer: PartWriter, pass_info: PassInfo, store_text: bool) -> None:  # fmt: skip
        self.clf = clf
        ctx = multiprocessing.get_context("spawn")
        args = (ModelShape.of(clf), batch_tokens, max_batch_size, part_writer, pass_info, store_text)
        self._pools = [ProcessPoolExecutor(1, mp_context=ctx) for _ in range(n)]
        # set up by a first task, not an initializer: the initializer's arguments (the tokenizer) go
        # into the process's start-up pipe, and a process that failed to start before reading them
        # (a script without ``if __name__ == "__main__":`` runs its job again there) would leave this
        # one waiting forever to finish writing them
        self._ready = [_submit(pool, _start, *args) for pool in self._pools]

    def parts(
        self, windows: Iterator[WindowRows], on_batch: Callable[[int], None] | None = None
    ) -> Iterator[StagedPart]:
        """Each window's staged part, in row order. When a window fails, the parts of the windows
        before it are still handed back (finished work, to be committed), then its error is raised."""
        from ..extract.score import score_batch  # torch, which the host processes do without

        n = len(self._pools)
        prepared: deque[tuple[int, Future]] = deque()
        finishing: deque[Future] = deque()
        reader = enumerate(prefetch(windows, depth=2))
        try:
            for ready in self._ready:
                _result(ready)
            while True:
                try:
                    while len(prepared) < 2 * n and (item := next(reader, None)) is not None:
                        seq, rows = item
                        prepared.append((seq, _submit(self._pools[seq % n], _prepare, seq, rows)))
                    if not prepared:
                        break
                    seq, future = prepared.popleft()
                    ids = _result(future)
                    t0 = time.perf_counter()
                    outputs = []
                    for packed in ids:
                        outputs.append(score_batch(self.clf, unpack_ids(packed)))
                        if on_batch is not None:
                            on_batch(len(packed[1]))
                    seconds = time.perf_counter() - t0
                    finishing.append(_submit(self._pools[seq % n], _finish, seq, outputs, seconds))
                except Exception:
                    while finishing:  # the windows before the failed one first
                        yield _result(finishing.popleft())
                    raise
                while finishing and (finishing[0].done() or len(finishing) > n):
                    yield _result(finishing.popleft())
            while finishing:
                yield _result(finishing.popleft())
        finally:
            self.close()

    def close(self) -> None:
        """Wait for the window each process has in hand (it may be writing a part's files, and the job's
        clean-up must not run beside it), drop the rest, and end the processes."""
        interrupted: KeyboardInterrupt | None = None
        for pool in self._pools:
            while True:
                try:
                    pool.shutdown(wait=True, cancel_futures=True)
                    break
                except KeyboardInterrupt as e:  # a second Ctrl-C: still wait, then re-raise
                    interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted


def _result(future: Future) -> Any:
    try:
        return future.result()
    except BrokenProcessPool:
        raise _ended() from None


def _submit(pool: ProcessPoolExecutor, fn: Callable[..., Any], *args: Any) -> Future:
    try:
        return pool.submit(fn, *args)
    except BrokenProcessPool:
        raise _ended() from None


def _ended() -> EngineError:
    return EngineError(
        "a host process ended abruptly (killed, out of memory, or it failed to start: a script that "
        'runs a job must do so under `if __name__ == "__main__":`); rerun to resume'
    )
