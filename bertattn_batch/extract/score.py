"""The model stage of a window: length buckets packed by a token budget, OOM answered by halving.

Usage::

    stage = ModelStage(clf, batch_tokens=16384, max_batch_size=256)
    real, slots = stage(window.rows)     # fills each scorable row's probs, cls_rows and cls_norms
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from ..errors import ModelError
from ..model import Classifier
from .batching import bucket_batches
from .tables import ScoredRow

log = logging.getLogger(__name__)


class ModelStage:
    """Scores windows: length buckets packed by a token budget, OOM answered by halving the batch."""

    def __init__(self, clf: Classifier, batch_tokens: int, max_batch_size: int) -> None:
        self.clf = clf
        self.batch_tokens = batch_tokens
        self.max_batch_size = max_batch_size

    def __call__(
        self, rows: list[ScoredRow], on_batch: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        """Fill probs, cls_rows and cls_norms of a window's scorable rows; returns (real tokens, padded
        slots).
        ``on_batch(n)`` is called after each batch of ``n`` reviews (a progress bar).

        Every row's outputs are views into arrays made for the whole window before its first
        batch, and each batch's own outputs are copied there and freed. Kept alive by views instead,
        the batches' arrays would sit in the heap among the freed buffers of later batches, which the
        C library then cannot reuse whole: on the default model the stage's peak was 60 to 130 MB
        higher (three alternating runs each on 40k reviews), handed back only at the window's end.
        """
        todo = [r for r in rows if r.status == "ok"]
        lengths = [r.encoded.n_tokens for r in todo]
        per_token = len(self.clf.layers) * self.clf.num_heads
        cls_rows = np.empty(per_token * sum(lengths), dtype=np.float32)
        cls_norms = np.empty_like(cls_rows)
        zeroing = (
            np.empty(len(self.clf.layers) * sum(lengths), np.float32) if self.clf.value_zeroing else None
        )
        probs = np.empty((len(todo), len(self.clf.labels)), dtype=np.float32)
        at = 0
        for i, (r, n) in enumerate(zip(todo, lengths, strict=True)):
            r.probs = probs[i]  # (C,)
            r.cls_rows = cls_rows[at : at + per_token * n].reshape(-1, self.clf.num_heads, n)  # (L, H, n)
            r.cls_norms = cls_norms[at : at + per_token * n].reshape(r.cls_rows.shape)
            if zeroing is not None:
                start = at // self.clf.num_heads
                r.value_zeroing = zeroing[start : start + len(self.clf.layers) * n].reshape(-1, n)  # (L, n)
            at += per_token * n
        real = slots = 0
        for idx in bucket_batches(lengths, self.batch_tokens, self.max_batch_size):
            batch = [todo[i] for i in idx]
            slots += self._score(batch)
            real += sum(r.encoded.n_tokens for r in batch)
            if on_batch is not None:
                on_batch(len(batch))
        return real, slots

    def _score(self, batch: list[ScoredRow]) -> int:
        """Score one padded batch (in halves after an out-of-memory error); returns its padded slots."""
        try:
            out = self.clf.forward([r.encoded.ids for r in batch])
        except torch.OutOfMemoryError:
            if len(batch) == 1:
                raise ModelError(
                    f"out of memory on a single review of {batch[0].encoded.n_tokens} tokens; "
                    "lower --max-length or use a device with more memory"
                ) from None
            _free_device_cache(self.clf.device)
            half = len(batch) // 2
            log.warning("out of memory on a batch of %d reviews; retrying in halves", len(batch))
            return self._score(batch[:half]) + self._score(batch[half:])
        for i, r in enumerate(batch):
            n = r.encoded.n_tokens
            r.probs[:] = out.probs[i]
            r.cls_rows[:] = out.rows[i, :, :, :n]  # this review's own tokens, no padding
            r.cls_norms[:] = out.norms[i, :, :, :n]
            if out.value_zeroing is not None:
                r.value_zeroing[:] = out.value_zeroing[i, :, :n]

        return len(batch) * max(r.encoded.n_tokens for r in batch)


def _free_device_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
