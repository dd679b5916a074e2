"""What checking every page's checksum costs ``aggregate``: the same aggregation of a run with and
without :func:`bertattn_batch.run.parts.verify_pages`, in turn each round, in one process.

Usage::

    .venv/bin/python bench/verify.py runs/default          # after make extract
    .venv/bin/python bench/verify.py runs/default --rounds 4 --out bench/results/verify-pages-2core.txt

The run is copied to a temporary folder (its aggregates are written anew each time); prints each
round's seconds and the median of the paired ratios (checked / not checked).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bertattn_batch.analysis import aggregate as agg
from bertattn_batch.run import parts


def once(run: Path, verify: bool) -> float:
    shutil.rmtree(run / "aggregates", ignore_errors=True)
    parts._VERIFIED.clear()  # every round checks anew
    real = agg.committed_files
    if not verify:
        agg.committed_files = lambda run_dir, tables, _verify=False: real(run_dir, tables, False)
    try:
        t0 = time.perf_counter()
        agg.aggregate(run)
        return time.perf_counter() - t0
    finally:
        agg.committed_files = real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        shutil.copytree(args.run, run)
        ratios = []
        for k in range(args.rounds):
            off, on = once(run, False), once(run, True)
            ratios.append(on / off)
            lines.append(f"round {k + 1}: not checked {off:.2f}s, checked {on:.2f}s ({on / off:.3f}x)")
            print(lines[-1], flush=True)
    lines.append(
        f"aggregate with every page checked: {statistics.median(ratios):.3f}x the time without (median)"
    )
    print(lines[-1])
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
