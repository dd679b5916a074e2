"""Held-out metrics of a trained classifier, and the seeded, stratified split they are measured on."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

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
    label_ids: Sequence[int] | np.ndarray,
    eval_fraction: float,
    seed: int,
    same: Sequence[Sequence[Hashable]] = (),
) -> tuple[np.ndarray, np.ndarray]:
    """A seeded, stratified (train, eval) split of row indices, each sorted.

    ``same``: keys per row (its text, its id); rows that share one are a group, which goes to one side
    whole, so that no held-out review was trained on, word for word or under its id. A group counts in
    the class of its first row. Each class holds out whole groups, in a seeded order, as long as they
    fit in its share of rows; where none fits, its smallest group. So a class with rows in two groups or
    more keeps rows on each side when ``eval_fraction > 0``; a class that is one group (its rows all
    one text) stays in training. Without repeats this is a plain stratified split.
    """
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
    """Each row's group: the first row it is joined to through a key it shares (union-find)."""
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
            parent[max(a, b)] = min(a, b)  # the group's root is its first row
    return np.array([root(i) for i in range(n)], dtype=np.int64)


def confusion(y_true: np.ndarray, y_pred: np.ndarray, n: int) -> list[list[int]]:
    """Rows: true label id; columns: predicted label id."""
    m = np.zeros((n, n), dtype=np.int64)
    np.add.at(m, (y_true, y_pred), 1)
    return m.tolist()
