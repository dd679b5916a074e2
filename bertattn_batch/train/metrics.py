"""Held-out metrics of a trained classifier, and the seeded, stratified split they are measured on."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def accuracy(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray) -> float:
    """Share of predictions equal to the truth (0.0 for no examples)."""
    t, p = np.asarray(y_true), np.asarray(y_pred)
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred differ in shape: {t.shape} vs {p.shape}")
    return float((t == p).mean()) if t.size else 0.0


def macro_f1(y_true: Sequence[int] | np.ndarray, y_pred: Sequence[int] | np.ndarray) -> float:
    """Unweighted mean of per-class F1 over the classes seen in the truth or the predictions.

    A class's F1 is 2TP / (2TP + FP + FN), 0 where it has no true positives; this matches the common
    definition with classes taken from both sides, so a class the model never predicts still counts.
    """
    t, p = np.asarray(y_true), np.asarray(y_pred)
    if t.shape != p.shape:
        raise ValueError(f"y_true and y_pred differ in shape: {t.shape} vs {p.shape}")
    classes = np.union1d(t, p)
    if classes.size == 0:
        return 0.0
    scores = []
    for c in classes:
        tp = int(np.sum((t == c) & (p == c)))
        fp = int(np.sum((t != c) & (p == c)))
        fn = int(np.sum((t == c) & (p != c)))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return float(np.mean(scores))


def split_indices(
    label_ids: Sequence[int] | np.ndarray, eval_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded, stratified (train, eval) split of row indices, each sorted.

    Every class with at least two rows keeps at least one row on each side when ``eval_fraction > 0``,
    so the held-out metrics see every label and training does too.
    """
    y = np.asarray(label_ids)
    rng = np.random.default_rng(seed)
    train: list[np.ndarray] = []
    held: list[np.ndarray] = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = round(len(idx) * eval_fraction)
        if eval_fraction > 0 and len(idx) >= 2:
            k = min(max(k, 1), len(idx) - 1)
        held.append(idx[:k])
        train.append(idx[k:])
    empty = np.zeros(0, dtype=np.int64)
    return (
        np.sort(np.concatenate(train)) if train else empty,
        np.sort(np.concatenate(held)) if held else empty,
    )


def confusion(y_true: np.ndarray, y_pred: np.ndarray, n: int) -> list[list[int]]:
    """Rows: true label id; columns: predicted label id."""
    m = np.zeros((n, n), dtype=np.int64)
    np.add.at(m, (y_true, y_pred), 1)
    return m.tolist()
