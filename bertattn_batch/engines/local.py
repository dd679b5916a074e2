"""The local engine: one process runs the model, and a window's other steps overlap with it.

read + encode (a thread*) ──▶ score (this thread) ──▶ extract + stage the part (threads**)
  ──▶ staged parts back to ``run_job``, in row order, which commits them

* ahead of the model, or in turn with it where torch's threads take every core: see feed_plan
** one beside torch's threads on the CPU; where the model leaves cores free, several windows at once

Beside an accelerator on a machine of three cores or more, encoding, extraction and writing run in
host processes instead (engines/host_processes.py): threads share Python's lock, which caps them at
about 1.5 times one core however many there are.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..config import JobSpec
from ..errors import SpecError
from ..extract import PassInfo, StagedPart, WindowJob, WindowRows
from ..model import resolve_device
from ..run import PartWriter
from . import fork_server
from .host_processes import HostProcesses
from .start import load_classifier, run_header
from .threads import Worker, prefetch

#: Each encode thread holds a copy of the tokenizer (made at the start of a run).
MAX_ENCODE_THREADS = 8
#: Each stage thread holds a window's tables while it builds and writes them.
MAX_STAGE_THREADS = 8
#: More host processes than this a core are refused: they only take turns, and thousands ran out of
#: open files (an OSError that named no option).
MAX_HOST_PROCESSES_PER_CORE = 4
#: Each host process holds a tokenizer and up to three windows (engines/host_processes.py).
MAX_HOST_PROCESSES = 16

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeedPlan:
    """How the model is fed: windows the reader makes ahead, threads that encode a window, and
    threads that extract and write windows (each its own)."""

    ahead: int
    encode_threads: int
    stage_threads: int


def feed_plan(device: torch.device) -> FeedPlan:
    """The plan for this process's cores and ``device``.

    On the CPU, when torch's threads take every core, a reader beside them would preempt them in the
    middle of their operations: there it makes a window only when the model asks for one, encodes it
    on every core, and one thread writes beside the model. Elsewhere the reader runs two windows ahead,
    and encoding and writing each get a thread per free core (every core on an accelerator, whose
    thread mostly waits for the device; the cores torch leaves on the CPU): they take turns on the
    cores, whichever has work, so that neither waits for the other on a machine of many cores.
    """
    cores = _cores()
    if device.type == "cpu" and torch.get_num_threads() >= cores:
        return FeedPlan(0, min(cores, MAX_ENCODE_THREADS), 1)
    free = max(1, cores - torch.get_num_threads()) if device.type == "cpu" else cores
    return FeedPlan(2, min(free, MAX_ENCODE_THREADS), min(free, MAX_STAGE_THREADS))


def host_processes(asked: int | None, device: torch.device) -> int:
    """Host processes for a run on ``device``: ``asked``, or by default one per core but the model's
    own (at most :data:`MAX_HOST_PROCESSES`) beside an accelerator, and none (threads) on the CPU,
    where the model takes the cores, or where there are fewer than three cores: two cores shared by
    the model's process and host processes ran slower than threads (docs/performance.md)."""
    if asked is not None:
        return asked
    cores = _cores()
    if device.type == "cpu" or cores < 3:
        return 0
    return min(cores - 1, MAX_HOST_PROCESSES)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_host_processes(spec: JobSpec) -> None:
    """Refuse more host processes than this machine's cores can take, and say where they only take
    turns: before a job trains its model or loads it."""
    if (asked := spec.host_processes or 0) > MAX_HOST_PROCESSES_PER_CORE * (cores := _cores()):
        raise SpecError(
            f"--host-processes {asked} is more than this machine's {cores} cores can take "
            f"({MAX_HOST_PROCESSES_PER_CORE} a core at most: each holds a tokenizer, windows and open "
            "files); leave it out for the default of the device"
        )
    if asked > cores:
        log.warning(
            "%d host processes on %d cores: they take turns on the cores, each with its own tokenizer "
            "and windows in memory; leave --host-processes (a job's host_processes) out for the "
            "default of the device",
            asked,
            cores,
        )


class LocalEngine:
    """Loads the model in this process and runs every window here."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.timings: dict[str, float] = {}
        self._host_usage: dict[str, float] = {}

    def __enter__(self) -> LocalEngine:
        t0 = time.perf_counter()
        if host_processes(self.spec.host_processes, resolve_device(self.spec.device)):
            fork_server.context()  # the server makes its imports while the model loads
        self.clf = load_classifier(self.spec)
        self.timings["load"] = time.perf_counter() - t0
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def header(self) -> dict[str, Any]:
        return run_header(self.spec, self.clf)

    def describe(self) -> dict[str, Any]:
        """The batch sizes and host processes the run had (the spec may leave them to the device), and
        what the host processes used (engines/host_processes.py)."""
        batch_tokens, max_batch_size = self.spec.batch_budget(self.clf.device_type)
        return {
            "batch_tokens": batch_tokens,
            "max_batch_size": max_batch_size,
            "host_processes": host_processes(self.spec.host_processes, self.clf.device),
        } | self._host_usage

    def parts(
        self,
        windows: Iterator[WindowRows],
        part_writer: PartWriter,
        pass_info: PassInfo,
        on_batch: Callable[[int], None] | None = None,
    ) -> Iterator[StagedPart]:
        spec = self.spec
        processes = host_processes(spec.host_processes, self.clf.device)
        batch_tokens, max_batch_size = spec.batch_budget(self.clf.device_type)
        if processes:
            hosts = HostProcesses(
                processes, self.clf, batch_tokens, max_batch_size, part_writer, pass_info, spec.store_text
            )
            try:
                yield from hosts.parts(windows, on_batch)
            finally:
                self.timings.update(hosts.seconds)
                self._host_usage = hosts.usage
            return
        plan = feed_plan(self.clf.device)
        with WindowJob(
            self.clf, batch_tokens, max_batch_size, part_writer, pass_info,
            plan.encode_threads, spec.store_text,
        ) as job:  # fmt: skip
            writer = Worker(job.stage, depth=2, name="writer", threads=plan.stage_threads)
            try:
                for window in prefetch(map(job.encode, windows), depth=plan.ahead):
                    if writer.failed:
                        break
                    job.score(window, on_batch)
                    writer.put(window)
                    yield from writer.results()
            except Exception:  # the model or the reader failed: the parts written so far are kept
                yield from writer.close()
                raise
            finally:
                done = writer.close()
            yield from done  # the parts before a failed one are committed: finished work is kept
            writer.check()
