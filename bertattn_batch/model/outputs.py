"""What the model hands back for one padded batch: plain arrays, importable without torch (a host
process receives these and never runs the model)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Outputs(NamedTuple):
    """One padded batch's outputs, float32 numpy arrays."""

    probs: np.ndarray  # (B, C)
    rows: np.ndarray  # (B, L, H, S): the [CLS] query's attention weights
    norms: np.ndarray  # (B, L, H, S): their norm-based weights
    value_zeroing: np.ndarray | None = None  # (B, L, S), where the classifier was loaded to compute it
    contributions: np.ndarray | None = None  # (B, S): ALTI's R[0, :], where the classifier was loaded so
