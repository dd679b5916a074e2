"""The local engine: one process, a window's steps on threads of their own so that they overlap.

read + encode (a thread*) ──▶ score (this thread) ──▶ extract + stage the part (a thread)
  ──▶ staged parts back to ``run_job``, in row order, which commits them

* ahead of the model, or in turn with it where torch's threads take every core: see feed_plan
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..config import JobSpec
from ..extract import PassInfo, StagedPart, WindowJob, WindowRows
from ..run import PartWriter
from .start import load_classifier, run_header
from .threads import Worker, prefetch

#: Each encode thread holds a copy of the tokenizer (made at the start of a run).
MAX_ENCODE_THREADS = 8


def feed_plan(device: torch.device) -> tuple[int, int]:
    """How the model is fed: (windows the reader thread makes ahead, threads that encode a window).

    On an accelerator, whose thread mostly waits for the device, the reader runs two windows ahead and
    encodes on every core but the model's and the writer's (at most 4). On the CPU, when torch's
    threads take every core, a reader beside them would preempt them in the middle of their
    operations: there it makes a window only when the model asks for one, and encodes it on every core
    (at most ``MAX_ENCODE_THREADS``). With cores to spare, it runs ahead on those.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if device.type != "cpu":
        return 2, max(1, min(4, cores - 2))
    if torch.get_num_threads() >= cores:
        return 0, min(cores, MAX_ENCODE_THREADS)
    return 2, min(cores - torch.get_num_threads(), MAX_ENCODE_THREADS)


class LocalEngine:
    """Loads the model in this process and runs every window here."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.timings: dict[str, float] = {}

    def __enter__(self) -> LocalEngine:
        t0 = time.perf_counter()
        self.clf = load_classifier(self.spec)
        self.timings["load"] = time.perf_counter() - t0
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def header(self) -> dict[str, Any]:
        return run_header(self.spec, self.clf)

    def describe(self) -> dict[str, Any]:
        return {}

    def parts(
        self,
        windows: Iterator[WindowRows],
        part_writer: PartWriter,
        pass_info: PassInfo,
        on_batch: Callable[[int], None] | None = None,
    ) -> Iterator[StagedPart]:
        ahead, threads = feed_plan(self.clf.device)
        spec = self.spec
        with WindowJob(
            self.clf, spec.batch_tokens, spec.max_batch_size, part_writer, pass_info, threads, spec.store_text
        ) as job:
            writer = Worker(job.stage, depth=2, name="writer")
            try:
                for window in prefetch(map(job.encode, windows), depth=ahead):
                    job.score(window, on_batch)
                    writer.put(window)
                    yield from writer.results()
            finally:
                done = writer.close()
            yield from done
