"""What ``--compile`` (``torch.compile`` of the model, dynamic shapes) gains the model stage: the same
batches through one classifier with and without its compiled model, in turn each round, in one process.

Usage::

    .venv/bin/python bench/compile.py                                  # zh 4096 and bert-base 256
    .venv/bin/python bench/compile.py --models bert-base --n 256 --rounds 3 \
        --out bench/results/compile-cpu-2core.txt

Batches are cut as a job cuts them (windows of 4096 rows, the device's token budget). Compiling is
timed apart (the load's probe and the first pass over new variants, together); each round then scores the
batches eager and compiled. Prints each round's seconds, the median of the paired ratios (eager / compiled),
and the largest difference of any output.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np
import torch

from bertattn_batch.config import BATCH_DEFAULTS
from bertattn_batch.extract.batching import batch_overhead, bucket_batches, chunks
from bertattn_batch.model import Classifier, encode_texts
from bertattn_batch.model.classifier import compiled_model

DEFAULT_N = {"zh": 4096, "minilm": 512, "bert-base": 256}
WINDOW = 4096
BATCH_TOKENS, MAX_BATCH_SIZE = BATCH_DEFAULTS["cpu"]


def batches_of(clf: Classifier, texts: list[str]) -> list[list[np.ndarray]]:
    ids = [e.ids for e in encode_texts(clf.tokenizer, texts, clf.max_length)]
    out = []
    for window in chunks(range(len(ids)), WINDOW):
        lengths = [len(ids[i]) for i in window]
        overhead = batch_overhead(BATCH_TOKENS, clf.device_type)
        for idx in bucket_batches(lengths, BATCH_TOKENS, MAX_BATCH_SIZE, overhead):
            out.append([ids[window[i]] for i in idx])
    return out


def one_pass(clf: Classifier, batches: list[list[np.ndarray]]) -> tuple[float, list]:
    t0 = time.perf_counter()
    outs = [clf.forward(b) for b in batches]
    return time.perf_counter() - t0, outs


def largest_difference(a: list, b: list) -> float:
    return max(
        float(np.abs(x - y).max()) for oa, ob in zip(a, b, strict=True) for x, y in zip(oa, ob, strict=True)
        if x is not None
    )  # fmt: skip


def measure(name: str, n: int, rounds: int, tmp: Path, say) -> None:
    case = harness.prepare_case(name, n, tmp)
    clf = Classifier.load(str(case.model_dir), device="cpu", max_length=case.max_length)
    batches = batches_of(clf, case.texts)
    say(f"{name} ({case.note}): {len(case.texts)} reviews in {len(batches)} batches, "
        f"{torch.get_num_threads()} threads")  # fmt: skip
    one_pass(clf, batches)  # warm: the CPU kernels' first calls on new shapes
    t0 = time.perf_counter()
    clf.compiled = compiled_model(clf)  # what Classifier.load(compile=True) does
    first, _ = one_pass(clf, batches)
    say(f"  compiling: {time.perf_counter() - t0:.1f}s for the probe and a first pass, of which the pass "
        f"{first:.1f}s")  # fmt: skip
    ratios, worst = [], 0.0
    for k in range(rounds):
        model = clf.compiled
        clf.compiled = None
        eager, expected = one_pass(clf, batches)
        clf.compiled = model
        fast, got = one_pass(clf, batches)
        worst = max(worst, largest_difference(expected, got))
        ratios.append(eager / fast)
        say(f"  round {k + 1}: eager {eager:.2f}s, compiled {fast:.2f}s ({eager / fast:.3f}x)")
    say(f"  {name}: compiled {statistics.median(ratios):.3f}x eager's speed (median of {rounds} paired "
        f"rounds); outputs within {worst:.1g}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["zh", "bert-base"], choices=harness.CASES)
    ap.add_argument("--n", type=int, help="reviews per model (default: by model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    say(f"torch {torch.__version__}; {' '.join(sys.argv[1:]) or '(defaults)'}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            measure(name, args.n or DEFAULT_N[name], args.rounds, Path(tmp), say)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
