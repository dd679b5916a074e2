"""The local engine: the model in this process, a window's other steps on threads or host processes.

    read (run_job's thread) ──▶ encode (a thread) ──▶ score (the model's thread)
      ──▶ extract + stage the part (threads) ──▶ staged parts back to ``run_job``, in row order

Beside an accelerator on a machine of three cores or more, encoding, extraction and writing run in
host processes instead (engines/processes.py): threads share Python's lock, which caps them at about
1.5 times one core however many there are.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import torch

from ..config import JobSpec
from ..errors import SpecError
from ..extract import PassInfo, StagedPart, TableOptions, Window, WindowJob, WindowRows
from ..model import resolve_device
from ..run import PartWriter
from ..runtime import signals_deferred
from . import processes
from .scheduling import then
from .start import load_classifier, run_header

#: Each encode thread holds a copy of the tokenizer; each stage thread a window's tables.
MAX_ENCODE_THREADS = MAX_STAGE_THREADS = 8
#: More host processes than this a core are refused: they only take turns, and run out of open files.
MAX_HOST_PROCESSES_PER_CORE = 4
#: Each host process holds a tokenizer and up to three windows.
MAX_HOST_PROCESSES = 16

log = logging.getLogger(__name__)


class FeedPlan(NamedTuple):
    """Windows read ahead of the model, threads that encode a window, threads that stage windows."""

    ahead: int
    encode_threads: int
    stage_threads: int


def feed_plan(device: torch.device) -> FeedPlan:
    """The plan for this process's cores and ``device``. On the CPU, where torch's threads take every
    core, reading and encoding beside them would preempt them mid-operation: a window is read and
    encoded (on every core) only once the model is done with the one before, and one thread writes.
    Elsewhere two windows are read ahead, and encoding and staging get a thread per free core."""
    cores = _cores()
    if device.type == "cpu" and torch.get_num_threads() >= cores:
        return FeedPlan(0, min(cores, MAX_ENCODE_THREADS), 1)
    free = max(1, cores - torch.get_num_threads()) if device.type == "cpu" else cores
    return FeedPlan(2, min(free, MAX_ENCODE_THREADS), min(free, MAX_STAGE_THREADS))


def host_processes(asked: int | None, device: torch.device) -> int:
    """Host processes for a run on ``device``: ``asked``, or by default one per core but the model's
    own (at most :data:`MAX_HOST_PROCESSES`) beside an accelerator; none (threads) on the CPU, where
    the model takes the cores, or on fewer than three cores (docs/performance.md)."""
    if asked is not None:
        return asked
    cores = _cores()
    if device.type == "cpu" or cores < 3 or "forkserver" not in multiprocessing.get_all_start_methods():
        return 0
    return min(cores - 1, MAX_HOST_PROCESSES)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_host_processes(spec: JobSpec) -> None:
    """Refuse more host processes than this machine's cores can take, and warn where they only take
    turns: before a job trains its model or loads it."""
    if (asked := spec.host_processes or 0) > MAX_HOST_PROCESSES_PER_CORE * (cores := _cores()):
        raise SpecError(
            f"--host-processes {asked} is more than this machine's {cores} cores can take "
            f"({MAX_HOST_PROCESSES_PER_CORE} a core at most: each holds a tokenizer, windows and open "
            "files); leave it out for the default of the device"
        )
    if asked > cores:
        log.warning(
            "%d host processes on %d cores: they take turns on the cores, each with its own tokenizer and "
            "windows in memory; leave --host-processes (a job's host_processes) out for the default of "
            "the device", asked, cores,
        )  # fmt: skip


class LocalEngine:
    """Loads the model in this process and runs every window here."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec, self.timings, self._usage = spec, Counter(), {}

    def __enter__(self) -> LocalEngine:
        t0 = time.perf_counter()
        if host_processes(self.spec.host_processes, resolve_device(self.spec.device)):
            processes.start_server()  # its imports run while the model loads
        self.clf = load_classifier(self.spec)
        self.timings["load"] = time.perf_counter() - t0
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def header(self) -> dict[str, Any]:
        return run_header(self.spec, self.clf)

    def describe(self) -> dict[str, Any]:
        """The batch sizes and host processes the run had (the spec may leave them to the device)."""
        tokens, reviews = self.spec.batch_budget(self.clf.device_type)
        n = host_processes(self.spec.host_processes, self.clf.device)
        return {"batch_tokens": tokens, "max_batch_size": reviews, "host_processes": n} | self._usage

    def executor(
        self, part_writer: PartWriter, pass_info: PassInfo, on_batch: Callable[[int], None]
    ) -> Threads | processes.HostProcesses:
        spec, clf = self.spec, self.clf
        budget = spec.batch_budget(clf.device_type)
        if n := host_processes(spec.host_processes, clf.device):
            job = (*budget, part_writer, pass_info, TableOptions.of(spec, clf))
            return processes.HostProcesses(n, clf, job, on_batch, self.timings, self._usage)
        plan = feed_plan(clf.device)
        job = WindowJob(clf, *budget, part_writer, pass_info, plan.encode_threads, TableOptions.of(spec, clf))
        return Threads(job, plan, on_batch)


class Threads:
    """A window's steps on threads, overlapping across windows: encoding (one thread, the encoder's own
    threads under it), the model (one thread) and staging (``plan.stage_threads``). ``submit`` waits
    while the model has ``plan.ahead + 1`` windows to score."""

    def __init__(self, job: WindowJob, plan: FeedPlan, on_batch: Callable[[int], None]) -> None:
        self.job, self.on_batch = job, on_batch
        self.in_flight = plan.ahead + plan.stage_threads + 2  # read ahead, scored, staged, committing
        self._pools = [ThreadPoolExecutor(1, "encode"), ThreadPoolExecutor(1, "model"),
                       ThreadPoolExecutor(plan.stage_threads, "stage")]  # fmt: skip
        self._room = threading.Semaphore(plan.ahead)

    def submit(self, rows: WindowRows) -> Future[StagedPart]:
        encode, model, stage = self._pools
        scored = then(encode.submit(self.job.encode, rows), model, self._score)
        scored.add_done_callback(lambda _: self._room.release())
        self._room.acquire()
        return then(scored, stage, self.job.stage)

    def _score(self, window: Window) -> Window:
        return self.job.score(window, self.on_batch)

    def __enter__(self) -> Threads:
        return self

    def __exit__(self, *exc: object) -> None:
        with signals_deferred():  # the part in hand is finished, the windows queued dropped
            for pool in self._pools:
                pool.shutdown(wait=False, cancel_futures=True)
            for pool in self._pools:
                pool.shutdown()
        self.job.close()
