"""The model stage of a window: length buckets packed by a token budget, OOM answered by halving.

Usage::

    stage = ModelStage(clf, batch_tokens=16384, max_batch_size=256)
    real, slots = stage(window.rows)     # fills each scorable row's probs, cls_rows and cls_norms

    outputs = score_batch(clf, ids)      # one batch (its halves, out of memory): see plan.py
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from ..errors import ModelError
from ..model import Classifier, Outputs
from .plan import BatchPlan
from .tables import ScoredRow

log = logging.getLogger(__name__)


def score_batch(clf: Classifier, ids: list[np.ndarray]) -> list[Outputs]:
    """One padded batch's outputs; out of device memory, those of its halves, in order."""
    try:
        return [clf.forward(ids)]
    except torch.OutOfMemoryError:
        if len(ids) == 1:
            raise ModelError(
                f"out of memory on a single review of {len(ids[0])} tokens; "
                "lower --max-length or use a device with more memory"
            ) from None
        if clf.device.type == "cuda":
            torch.cuda.empty_cache()
        half = len(ids) // 2
        log.warning("out of memory on a batch of %d reviews; retrying in halves", len(ids))
        return score_batch(clf, ids[:half]) + score_batch(clf, ids[half:])


class ModelStage:
    """Scores windows in this process: a :class:`BatchPlan` per window, each batch through
    :func:`score_batch`."""

    def __init__(self, clf: Classifier, batch_tokens: int, max_batch_size: int) -> None:
        self.clf = clf
        self.batch_tokens = batch_tokens
        self.max_batch_size = max_batch_size

    def __call__(
        self, rows: list[ScoredRow], on_batch: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        """Fill probs, cls_rows and cls_norms of a window's scorable rows; returns (real tokens, padded
        slots). ``on_batch(n)`` is called after each batch of ``n`` reviews (a progress bar)."""
        plan = BatchPlan(rows, self.clf, self.batch_tokens, self.max_batch_size)
        for k, ids in enumerate(plan.batch_ids()):
            plan.fill(k, score_batch(self.clf, ids))
            if on_batch is not None:
                on_batch(len(ids))
        return plan.real, plan.slots
