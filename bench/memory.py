"""Peak memory of ``bertattn extract`` against corpus size: the default corpus repeated to each size.

Usage::

    .venv/bin/python bench/memory.py                       # 20k and 200k reviews, twice each (make bench)
    .venv/bin/python bench/memory.py --sizes 20000,60000 --repeats 1

Each run is a process of its own, whose peak is its own ``VmHWM`` (``/proc/self/status``), written as it
exits (``ru_maxrss`` would carry over this process's peak into its child). A run's peak is the largest
of many transient states, so each size runs ``--repeats`` times, interleaved, and the highest is kept;
the peaks of each run's first and second halves say whether memory still climbs. Figures go to
``bench/results/memory-<cores>core.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness
import torch

#: Runs the bertattn CLI (argv[2:]) and writes the process's peak resident memory (KiB) to argv[1].
_HWM_WRAPPER = """
import atexit, re, runpy, sys
out = sys.argv[1]
def hwm():
    status = open("/proc/self/status").read()
    open(out, "w").write(re.search(r"VmHWM:\\s+(\\d+)", status).group(1))
atexit.register(hwm)
sys.argv = ["bertattn", *sys.argv[2:]]
runpy.run_module("bertattn_batch", run_name="__main__")
"""


def memory_scaling(
    model_dir: Path,
    corpus: Path,
    tmp: Path,
    sizes: Sequence[int] = (20_000, 200_000),
    max_length: int | None = None,
    device: str = "auto",
    keep_runs: bool = False,
    repeats: int = 2,
) -> dict[str, Any]:
    """Peak resident memory of ``bertattn extract`` at each size; ``growth``: the largest size's peak
    over the smallest's, less one."""
    source = harness.repeated_corpus(corpus, max(sizes), tmp / "repeated.parquet")
    runs: dict[str, dict[str, Any]] = {}
    for n in [n for _ in range(repeats) for n in sizes]:
        out, hwm, log = tmp / f"mem-{n}", tmp / f"mem-{n}.hwm", tmp / f"mem-{n}.log"
        cmd = [
            sys.executable,
            "-c",
            _HWM_WRAPPER,
            str(hwm),
            "extract",
            str(source),
            "--model",
            str(model_dir),
        ]
        cmd += ["--out", str(out), "--label-col", "label", "--limit", str(n), "--device", device]
        cmd += ["--no-progress", "--overwrite"] + (["--max-length", str(max_length)] if max_length else [])
        t0 = time.perf_counter()
        with open(log, "w") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=harness.ROOT)
            series = []  # (seconds, MiB) every 50 ms
            while proc.poll() is None:
                with contextlib.suppress(OSError, IndexError, ValueError):  # it may have just exited
                    series.append((time.perf_counter() - t0, harness.rss_mb(proc.pid)))
                time.sleep(0.05)
        text = log.read_text()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{text[-2000:]}")
        last = json.loads((out / "manifest.json").read_text())["last_run"]
        peak = round(int(hwm.read_text()) / 1024, 1)  # VmHWM is in KiB
        kept = runs.setdefault(str(n), {"peak_rss_mb_runs": [], "peak_halves_mb_runs": []})
        kept.update(wall_s=round(time.perf_counter() - t0, 1), reviews_per_s=last["reviews_per_s"],
                    padding_share=last["padding_share"], bytes_written=last["bytes_written"])  # fmt: skip
        kept["peak_rss_mb_runs"].append(peak)
        kept["peak_rss_mb"] = max(kept["peak_rss_mb_runs"])
        mid = series[-1][0] / 2 if len(series) >= 4 else None
        kept["peak_halves_mb_runs"].append(
            None
            if mid is None
            else [
                round(max(r for t, r in series if t <= mid), 1),
                round(max(r for t, r in series if t > mid), 1),
            ]
        )
        if not keep_runs:
            shutil.rmtree(out, ignore_errors=True)
    growth = runs[str(max(sizes))]["peak_rss_mb"] / runs[str(min(sizes))]["peak_rss_mb"] - 1
    return {"runs": runs, "growth": round(growth, 4), "repeats": repeats}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="20000,200000")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    model, max_length = harness.zh_model()
    with tempfile.TemporaryDirectory(prefix="bertattn-memory-") as tmp:
        mem = memory_scaling(
            model, harness.ZH_CORPUS, Path(tmp), sizes, max_length, args.device, repeats=args.repeats
        )
    for n, run in mem["runs"].items():
        peaks = ", ".join(f"{p:.0f}" for p in run["peak_rss_mb_runs"])
        halves = "; ".join(f"{a:.0f} then {b:.0f} MB" for a, b in filter(None, run["peak_halves_mb_runs"]))
        print(f"{n:>7} reviews: peak {run['peak_rss_mb']:.0f} MB (runs {peaks}; halves {halves})")
    print(f"peak at {max(sizes)} reviews against {min(sizes)}: {mem['growth']:+.1%}")
    info = harness.machine(torch.device("cpu"))
    out = args.out or harness.RESULTS / f"memory-{os.cpu_count()}core.json"
    harness.write_results(out, {"machine": info, "memory": mem})
    return mem


if __name__ == "__main__":
    main()
