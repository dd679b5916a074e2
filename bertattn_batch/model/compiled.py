"""``torch.compile`` of a classifier's model, checked on probe batches before a job relies on it.

Usage::

    clf = Classifier.load("models/zh-senti", compile=True)   # calls compiled_model(clf) on load

Compiled with dynamic shapes: a job's batches come in hundreds of (batch, length) shapes, which three
graphs serve (padded batches, unpadded ones, a single review), where static shapes would compile each
anew.
The forward hooks that capture the [CLS] rows and trim the last layer are traced into the graph.
Opt-in (``--compile``): compiling takes tens of seconds and a C++ compiler, and the gain on a CPU is
small, so it pays back on long jobs only (docs/performance.md).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from ..errors import ModelError, first_line

log = logging.getLogger(__name__)


def compiled_model(clf: Any) -> torch.nn.Module:
    """``clf.model`` (of a :class:`~.classifier.Classifier`) compiled, once probe batches (padded,
    unpadded, one review: each a graph of its own) have given the same outputs through it as eager; a
    ModelError names why where compiling fails on this machine or changes them."""
    rng = np.random.default_rng(0)
    probes = [  # each graph a job's batches need: padded, unpadded (no mask), a single review
        [rng.integers(0, len(clf.tokenizer), min(n, clf.max_length)) for n in lengths]
        for lengths in ((12, 7), (9, 9), (5,))
    ]
    expected = [clf.forward(probe) for probe in probes]
    compiled = torch.compile(clf.model, dynamic=True)
    clf.compiled = compiled
    try:
        got = [clf.forward(probe) for probe in probes]
    except Exception as e:  # what torch raises varies: no C++ compiler, an op inductor cannot lower
        raise ModelError(f"--compile: torch.compile fails for {clf.source} here ({first_line(e)}); "
                         "run without --compile") from None  # fmt: skip
    finally:
        clf.compiled = None
    # as trim.verified: kernels sum in other orders; bfloat16 and float16 keep about 3 significant digits
    tol = 1e-4 if clf.dtype == torch.float32 else 5e-2
    worst = max(
        float(np.abs(a - b).max())
        for want, have in zip(expected, got, strict=True)
        for a, b in zip(want, have, strict=True)
        if a is not None
    )
    if worst > tol:
        raise ModelError(f"--compile: {clf.source} compiled gives outputs {worst:.2g} away from its eager "
                         "ones on probe batches; run without --compile")  # fmt: skip
    log.info("%s compiled (probes within %.1g of eager)", clf.source, worst)
    return compiled
