"""The model stage of a window: its batches queued on the device one ahead, running out of memory
answered by halving."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import chain

import numpy as np
import torch

from ..errors import ModelError
from ..model import Classifier, Outputs
from ..model.classifier import PendingOutputs, out_of_memory
from .batching import BatchPlan
from .tables import ScoredRow

log = logging.getLogger(__name__)


def score_batches(
    clf: Classifier, batches: Iterable[list[np.ndarray]], seconds: Counter | None = None
) -> Iterator[list[Outputs]]:
    """Each batch's outputs (one, or its halves out of memory), in order, with batch ``k + 1`` queued before
    batch ``k``'s are read back. ``seconds`` adds up ``launch`` (the host's share) and ``device_wait``."""
    seconds = seconds if seconds is not None else Counter()
    pending: list[PendingOutputs] | None = None
    for ids in chain(batches, [None]):
        t0 = time.perf_counter()
        launched = launch_batch(clf, ids) if ids is not None else None
        t1 = time.perf_counter()
        seconds["launch"] += t1 - t0
        if pending is not None:
            outputs = [p.result() for p in pending]
            seconds["device_wait"] += time.perf_counter() - t1
            yield outputs
        pending = launched


def launch_batch(clf: Classifier, ids: list[np.ndarray]) -> list[PendingOutputs]:
    """One padded batch queued on the device; out of memory (or as large as a batch that ran out), halves."""
    tokens = len(ids) * max(map(len, ids))
    if len(ids) > 1 and clf.oom_tokens is not None and tokens >= clf.oom_tokens:
        return _halves(clf, ids)
    try:
        return [clf.launch(ids)]
    except RuntimeError as e:  # torch's OutOfMemoryError is one
        if not out_of_memory(e):
            raise
        if len(ids) == 1:
            raise ModelError(
                f"out of memory on a single review of {len(ids[0])} tokens; "
                "lower --max-length or use a device with more memory"
            ) from None
    # retried outside the except block, whose traceback holds the failed forward's activations
    if clf.device.type == "cuda":
        torch.cuda.empty_cache()
    clf.oom_tokens = tokens if clf.oom_tokens is None else min(clf.oom_tokens, tokens)
    log.warning("out of memory on a batch of %d reviews (%d padded tokens); batches as big are halved from "
                "now on", len(ids), tokens)  # fmt: skip
    return _halves(clf, ids)


def _halves(clf: Classifier, ids: list[np.ndarray]) -> list[PendingOutputs]:
    half = len(ids) // 2
    return launch_batch(clf, ids[:half]) + launch_batch(clf, ids[half:])


def score_rows(
    clf: Classifier, rows: list[ScoredRow], batch_tokens: int, max_batch_size: int,
    on_batch: Callable[[int], None] | None = None, seconds: Counter | None = None,
) -> tuple[int, int]:  # fmt: skip
    """Score a window's rows in this process, filling their outputs; (real tokens, padded slots).
    ``on_batch(n)`` follows each batch of ``n`` reviews (a progress bar)."""
    plan = BatchPlan(rows, clf, batch_tokens, max_batch_size)
    for k, outputs in enumerate(score_batches(clf, plan.batch_ids(), seconds)):
        plan.fill(k, outputs)
        if on_batch is not None:
            on_batch(len(plan.batches[k]))
    return plan.real, plan.slots
