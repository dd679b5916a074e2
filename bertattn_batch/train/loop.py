"""Fitting and measuring a classifier: a seeded stratified split, length-bucketed shuffled batches, AdamW
on a linear schedule with clipped gradients, and held-out accuracy and macro-F1."""

from __future__ import annotations

import math
import time
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .._terminal import bar_size
from ..config import FinetuneSpec
from ..errors import ModelError
from ..model.classifier import pad_batch

#: Batches are sorted by length within chunks of this many batches, then shuffled.
BUCKET_CHUNK_BATCHES = 64


def learning_rate(spec: FinetuneSpec) -> float:
    """The spec's peak learning rate, else the default: a random model needs a far higher one."""
    if spec.learning_rate is not None:
        return spec.learning_rate
    return 1e-3 if spec.base is None else 5e-5


def split_indices(label_ids: Sequence[int] | np.ndarray, eval_fraction: float, seed: int,
                  same: Sequence[Sequence[Hashable]] = ()) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """A seeded, stratified (train, eval) split of row indices, each sorted. Rows that share a key of ``same``
    (text, id) form a group, held out whole or not at all, in the class of its first row: each class holds
    out groups in a seeded order while they fit its share, else its smallest; a class of one group trains."""
    y = np.asarray(label_ids)
    group = _groups(len(y), same)
    firsts = np.flatnonzero(group == np.arange(len(y)))  # one row a group, in row order
    sizes = np.bincount(group, minlength=len(y))  # a group's rows, at its first row
    rng = np.random.default_rng(seed)
    held_groups: list[int] = []
    for c in np.unique(y[firsts]):
        order = rng.permutation(firsts[y[firsts] == c])
        n = int(sizes[order].sum())
        k = round(n * eval_fraction)
        if eval_fraction > 0 and n >= 2:
            k = min(max(k, 1), n - 1)
        taken: list[int] = []
        rows = 0
        for g in order:
            if rows + sizes[g] <= k:
                taken.append(int(g))
                rows += int(sizes[g])
        if not taken and k and len(order) > 1:  # every group is bigger than the share
            taken.append(int(order[np.argmin(sizes[order])]))
        held_groups += taken
    held = np.isin(group, held_groups)
    return np.flatnonzero(~held), np.flatnonzero(held)


def _groups(n: int, same: Sequence[Sequence[Hashable]]) -> np.ndarray:
    """Each row's group: the first row it is joined to through a shared key (union-find)."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for keys in same:
        first: dict[Hashable, int] = {}
        for i, key in enumerate(keys):
            a, b = root(first.setdefault(key, i)), root(i)
            parent[max(a, b)] = min(a, b)
    return np.array([root(i) for i in range(n)], dtype=np.int64)


def length_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffled batches of similar length: shuffle, sort within chunks, cut, shuffle the batches."""
    order = rng.permutation(len(lengths))
    chunk = batch_size * BUCKET_CHUNK_BATCHES
    batches: list[np.ndarray] = []
    for start in range(0, len(order), chunk):
        idx = order[start : start + chunk]
        idx = idx[np.argsort(lengths[idx], kind="stable")]
        batches.extend(idx[i : i + batch_size] for i in range(0, len(idx), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def predict(model: Any, ids: list[list[int]], pad_id: int, batch_size: int) -> np.ndarray:
    """Argmax predictions in the order of ``ids``, batched by length."""
    model.eval()
    order = np.argsort([len(s) for s in ids], kind="stable")
    preds = np.zeros(len(ids), dtype=np.int64)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            input_ids, mask = pad_batch([ids[i] for i in rows], pad_id)
            preds[rows] = model(input_ids=input_ids, attention_mask=mask).logits.argmax(-1).numpy()
    return preds


def _diverged(what: str, step: int, spec: FinetuneSpec) -> ModelError:
    return ModelError(
        f"training diverged: {what} at step {step} with learning rate {learning_rate(spec):g}; "
        "lower the learning rate"
    )


def train_loop(
    model: Any, ids: list[list[int]], y: np.ndarray, pad_id: int, spec: FinetuneSpec, progress: bool
) -> dict[str, Any]:
    """Train ``model`` on token ids and label ids (AdamW, no decay on biases and LayerNorm); what it did.
    With ``max_train_seconds`` the schedule is fitted, from the recent pace, into the time left."""
    rng = np.random.default_rng(spec.seed)
    lengths = np.array([len(s) for s in ids])
    per_epoch = math.ceil(len(ids) / spec.batch_size)
    planned = total = max(1, math.ceil(spec.epochs * per_epoch))  # a time cap shortens total as it goes

    def rate(step: int) -> float:  # linear warmup, then linear decay to zero at ``total`` steps
        warmup = max(1, round(total * spec.warmup_ratio)) if spec.warmup_ratio > 0 else 0
        return (step + 1) / warmup if step < warmup else max(0.0, (total - step) / max(1, total - warmup))

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
    groups = [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=learning_rate(spec))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    model.train()  # dropout on
    step, loss_ema, pace = 0, None, None  # pace: recent seconds a step
    cap = spec.max_train_seconds
    started = last = time.monotonic()
    with tqdm(
        total=planned, desc="finetune", unit="step", disable=not progress, leave=False, **bar_size()
    ) as bar:
        while step < total:
            for rows in length_batches(lengths, spec.batch_size, rng):
                input_ids, mask = pad_batch([ids[i] for i in rows], pad_id)
                logits = model(input_ids=input_ids, attention_mask=mask).logits  # (B, C)
                loss = F.cross_entropy(
                    logits, torch.from_numpy(y[rows]), label_smoothing=spec.label_smoothing
                )
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
                    fits = min(planned, step + int(max(0.0, cap - (now - started)) / pace))
                    if fits != total:
                        total = bar.total = max(step, fits)
                if step >= total:
                    break
    model.eval()
    # the loss is checked before each update: the last update can still leave outputs that are not finite
    input_ids, mask = pad_batch(ids[: spec.batch_size], pad_id)
    with torch.inference_mode():
        if not bool(torch.isfinite(model(input_ids=input_ids, attention_mask=mask).logits).all()):
            raise _diverged("the model's outputs are not finite", step, spec)
    return {
        "train_seconds": round(time.monotonic() - started, 2),
        "steps": step,
        "planned_steps": planned,
        "epochs_done": round(step / per_epoch, 3),
        "shortened": step < planned,
        "final_loss": round(loss_ema, 5) if loss_ema is not None else None,
    }


def accuracy(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray) -> float:
    """Share of predictions equal to the truth (0.0 for no examples)."""
    t, p = _pair(y_true, y_pred)
    return float((t == p).mean()) if t.size else 0.0


def macro_f1(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes in the truth or the predictions."""
    t, p = _pair(y_true, y_pred)
    classes, ids = np.unique(np.concatenate([t, p]), return_inverse=True)
    if not classes.size:
        return 0.0
    m = np.asarray(confusion(ids[: t.size], ids[t.size :], classes.size))
    tp = np.diag(m)
    return float(np.mean(np.where(tp > 0, 2 * tp / np.maximum(m.sum(0) + m.sum(1), 1), 0.0)))


def confusion(y_true: np.ndarray, y_pred: np.ndarray, n: int) -> list[list[int]]:
    """Rows: true label id; columns: predicted label id."""
    m = np.zeros((n, n), dtype=np.int64)
    np.add.at(m, (y_true, y_pred), 1)
    return m.tolist()


def _pair(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray) -> tuple[np.ndarray, ...]:
    t, p = np.asarray(y_true), np.asarray(y_pred)
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred differ in shape: {t.shape} vs {p.shape}")
    return t, p
