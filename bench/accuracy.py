"""The default job's model over several seeded splits: held-out accuracy per seed and their mean, and
whether the same seed trains the same weights twice.

Usage::

    .venv/bin/python bench/accuracy.py                     # seeds 13, 1, 2, 3, 4 of jobs/default.toml
    .venv/bin/python bench/accuracy.py --seeds 13 --twice  # one seed, trained twice: the same weights?

Each seed trains the job's ``[finetune]`` table in full (its seed replaced) into a temporary folder;
figures go to ``bench/results/accuracy.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--job", default=str(REPO / "jobs" / "default.toml"))
    p.add_argument("--seeds", default="13,1,2,3,4")
    p.add_argument("--twice", action="store_true", help="train the first seed a second time")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "accuracy.json")
    args = p.parse_args(argv)

    from bertattn_batch import tune_runtime
    from bertattn_batch.config import load_job
    from bertattn_batch.train import plan_training

    tune_runtime()
    job = load_job(args.job)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = []
    with tempfile.TemporaryDirectory(prefix="bertattn-accuracy-") as tmp:
        for i, seed in enumerate(seeds + ([seeds[0]] if args.twice else [])):
            out = Path(tmp) / f"seed-{seed}-{i}"
            plan = plan_training(job=args.job, out=str(out), seed=seed)
            t0 = time.perf_counter()
            metrics = plan.run(progress=False)
            weights = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
            runs.append(
                {
                    "seed": seed,
                    "accuracy": round(metrics["accuracy"], 4),
                    "macro_f1": round(metrics["macro_f1"], 4),
                    "n_eval": metrics["n_eval"],
                    "steps": metrics["steps"],
                    "shortened": metrics["shortened"],
                    "seconds": round(time.perf_counter() - t0, 1),
                    "weights_sha256": weights,
                }
            )
            print(json.dumps(runs[-1]), flush=True)
    distinct = {r["seed"]: r for r in runs}.values()
    mean = sum(r["accuracy"] for r in distinct) / len(distinct)
    result = {
        "job": os.path.relpath(args.job, REPO),
        "finetune": dataclasses.asdict(job.finetune) if job.finetune else None,
        "runs": runs,
        "mean_accuracy": round(mean, 4),
        "same_weights_twice": (runs[0]["weights_sha256"] == runs[-1]["weights_sha256"])
        if args.twice
        else None,
        "cpus": os.cpu_count(),
    }
    print(f"mean held-out accuracy over seeds {', '.join(map(str, seeds))}: {mean:.4f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
