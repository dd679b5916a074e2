"""The host side of a run at the speed a GPU would ask of it: the real pipeline (read, encode, batch,
extract, write, commit) with the model replaced by a stand-in that answers at no cost.

    make bench-host                                   # 200k rows, 1 core and every core
    .venv/bin/python bench/host.py --rows 50000 --cores 1,2 --rounds 3

The stand-in answers each batch with outputs of a bert-base classifier's shapes (12 heads, layer -2 of
12) cut from one buffer made in advance. The reviews are the default corpus's, repeated to ``--rows``;
the tokenizer is the default model's. Each core count runs in a process of its own, pinned to that
many cores, once with threads and once with a host process per core, ``--rounds`` times in turn; the
fastest run of each counts. Each round also runs one job per core side by side, each pinned to its
core with one host process: their scaling over one such job alone is the machine's own for this work,
the ceiling of any split of one job. The last line reads
``host: N reviews/s on C cores (R rows/s), scaling S× from 1 core``.

``--device-like LAUNCH_MS US_PER_TOKEN`` makes the stand-in act like a GPU: each batch holds Python's
lock for ``LAUNCH_MS`` and its answer is ready ``US_PER_TOKEN`` µs a padded token after the device is
free, one batch at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

#: The default job's model (harness.zh_model). The bench's harness (torch) is imported in ``main``: a
#: host process imports this script again, as multiprocessing does, and needs nothing of it.
MODEL = Path(__file__).resolve().parents[1] / "models" / "zh-senti"
#: bert-base: 12 layers of 12 heads; the stand-in answers for layer -2 (stored as 10).
HEADS, LAYERS = 12, 12
#: The stages whose rates are printed (a run's other seconds are waits, or parts of these).
STAGES = ("read", "encode", "model", "extract", "write")
#: (seconds of Python a batch, seconds of device a padded token), from ``--device-like``; None: free
DEVICE_LIKE: tuple[float, float] | None = None


class StandIn:
    """The real classifier's tokenizer and settings with a forward that costs nothing: views of one
    buffer of [CLS] rows, norms and probabilities. Its device is ``meta``, so the engine feeds it as it
    feeds a GPU."""

    def __init__(self, clf, max_batch: int = 512) -> None:
        import numpy as np
        import torch

        self._clf = clf
        self.device = torch.device("meta")
        self.layers, self.num_heads, self.num_layers = [LAYERS - 2], HEADS, LAYERS
        self.value_zeroing = False
        rng = np.random.default_rng(0)
        rows = rng.random((max_batch, 1, HEADS, clf.max_length), dtype=np.float32)  # (B, layers, H, S)
        self._rows = rows / rows.sum(-1, keepdims=True)
        self._norms = self._rows * np.float32(3.0)
        probs = rng.random((max_batch, len(clf.labels)), dtype=np.float32)  # (B, C)
        self._probs = probs / probs.sum(-1, keepdims=True)
        self._free_at = 0.0

    def __getattr__(self, name: str):  # everything but the model's answers is the real classifier's
        return getattr(self._clf, name)

    def launch(self, ids):
        """Classifier.launch's stand-in: the answer behind the same ``result()``, at once or, with
        :data:`DEVICE_LIKE`, when a device would give it."""
        from bertattn_batch.model import Outputs

        b, s = len(ids), max(len(x) for x in ids)
        out = Outputs(self._probs[:b], self._rows[:b, :, :, :s], self._norms[:b, :, :, :s], None)
        if not DEVICE_LIKE:
            return SimpleNamespace(result=lambda: out)
        launch_s, per_token_s = DEVICE_LIKE
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < launch_s:  # the forward's Python, holding the lock
            pass
        self._free_at = max(self._free_at, time.perf_counter()) + b * s * per_token_s

        def result(done=self._free_at):
            time.sleep(max(0.0, done - time.perf_counter()))  # the device's work, the lock let go
            return out

        return SimpleNamespace(result=result)


def one(inputs: Path, out: Path, host_processes: int | None = None, model: Path = MODEL) -> dict:
    """Run the job once in this process with the model stood in for: its figures, the CPU time of this
    process and of its host processes, and its pace after its first parts (one a core: the start of a
    run, which a long run pays once), from the times its part files were written."""
    import resource

    import bertattn_batch.engines.local as local
    import bertattn_batch.model.classifier  # noqa: F401  imported before the clock starts
    from bertattn_batch import InputSpec, JobSpec, run_job, tune_runtime
    from bertattn_batch.run import read_manifest

    tune_runtime()
    real = local.load_classifier
    local.load_classifier = lambda spec: StandIn(real(spec))
    spec = JobSpec(
        inputs=InputSpec([str(inputs)], text_col="text", id_col="doc_id", label_col="label"),
        model=str(model),
        out=str(out),
        layers=[-2],
        max_length=256,
        device="cpu",
        on_existing="overwrite",
        host_processes=host_processes,
    )
    try:
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0, cpu0 = time.perf_counter(), time.process_time()
        summary = run_job(spec, progress=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        local.load_classifier = real
    parts = sorted(
        (os.stat(out / p.files["predictions"]).st_mtime, p.end_row - p.start_row)
        for p in read_manifest(out).parts
    )
    wave = len(os.sched_getaffinity(0))  # parts that end together make a pace of nothing but their rows
    after = sum(rows for _, rows in parts[wave:])
    steady = after / (parts[-1][0] - parts[wave - 1][0]) if len(parts) > 2 * wave else None
    engine = summary.engine or {}
    return {"reviews": summary.input_rows, "wall_s": wall, "steady_reviews_per_s": steady,
            "seconds": summary.seconds, "attn_rows": (summary.tokens - 2 * summary.scored) * HEADS,
            "cores": wave, "plan": engine, "cpu_s": round(cpu, 3),
            "host_processes_cpu_s": engine.get("host_processes_cpu_s", 0.0),
            "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0,
            "host_processes_page_faults": engine.get("host_processes_page_faults", 0),
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "largest_host_process_max_rss_mb": engine.get("largest_host_process_max_rss_mb", 0)}  # fmt: skip


def _rate(value: float | None) -> str:
    return f"{value:,.0f}" if value else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--rows", type=int, default=200_000,
        help="reviews a run reads (the default corpus repeated); the pace after the first parts needs more "
        "than 2 parts of 4,096 rows a core (over 16,384 rows on 2 cores)",
    )  # fmt: skip
    ap.add_argument("--cores", default=None, help="comma-separated core counts (default: 1 and all)")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each core count, interleaved")
    ap.add_argument(
        "--host-processes",
        type=int,
        default=None,
        help="host processes of the host-process way (default: one a core)",
    )
    ap.add_argument(
        "--device-like", type=float, nargs=2, default=None, metavar=("LAUNCH_MS", "DEVICE_US_PER_TOKEN"),
        help="a stand-in that answers as a GPU would (default: at no cost)",
    )  # fmt: skip
    ap.add_argument("--one", nargs=2, metavar=("INPUTS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device_like:
        global DEVICE_LIKE
        DEVICE_LIKE = (args.device_like[0] / 1e3, args.device_like[1] / 1e6)
    if args.one:
        print(json.dumps(one(Path(args.one[0]), Path(args.one[1]), args.host_processes)))
        return
    import harness

    harness.zh_model()  # the tokenizer's model, trained where missing
    allowed = sorted(os.sched_getaffinity(0))
    counts = [int(c) for c in args.cores.split(",")] if args.cores else sorted({1, len(allowed)})
    runs = [(c, 0) for c in counts] + [(c, args.host_processes or c) for c in counts]
    results: dict[tuple[int, int], dict] = {}
    copies: list[dict] = []  # the fastest round of one job a core, side by side
    with tempfile.TemporaryDirectory(prefix="bertattn-host-") as tmp:
        inputs = harness.repeated_corpus(harness.ZH_CORPUS, args.rows, Path(tmp) / "host.parquet", ids=True)

        def start(cores: list[int], processes: int, out: str) -> subprocess.Popen:
            cmd = [
                sys.executable,
                __file__,
                "--host-processes",
                str(processes),
                "--one",
                str(inputs),
                f"{tmp}/{out}",
            ]
            cmd += ["--device-like", *map(str, args.device_like)] if args.device_like else []
            pin = lambda: os.sched_setaffinity(0, cores)  # noqa: E731
            return subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pin
            )

        def result(job: subprocess.Popen) -> dict:
            out, err = job.communicate()
            if job.returncode:
                sys.exit(err)
            return json.loads(out.strip().splitlines()[-1])

        for _ in range(args.rounds):  # interleaved, so that a busy spell of the machine hits every run
            for c, processes in runs:
                r = result(start(allowed[:c], processes, f"run-{c}-{processes}"))
                if (c, processes) not in results or r["wall_s"] < results[c, processes]["wall_s"]:
                    results[c, processes] = r
            if len(allowed) > 1 and (1, 1) in results:
                side = [result(job) for job in [start([core], 1, f"copy-{core}") for core in allowed]]
                if not copies or max(r["wall_s"] for r in side) < max(r["wall_s"] for r in copies):
                    copies = side
    rate = {key: r["reviews"] / r["wall_s"] for key, r in results.items()}
    for (c, processes), r in results.items():
        stages = ", ".join(
            f"{k} {r['reviews'] / v:,.0f}/s" for k, v in r["seconds"].items() if v > 0 and k in STAGES
        )
        print(
            f"{c} core(s), {processes} host processes: {rate[c, processes]:,.0f} reviews/s, "
            f"{r['attn_rows'] / r['wall_s']:,.0f} attention rows/s "
            f"({_rate(r['steady_reviews_per_s'])} reviews/s after the first parts); per stage: {stages}; "
            f"CPU a review {1e6 * r['cpu_s'] / r['reviews']:.0f} µs here, "
            f"{1e6 * r['host_processes_cpu_s'] / r['reviews']:.0f} µs in host processes; minor page faults "
            f"a review {(r['page_faults'] + r['host_processes_page_faults']) / r['reviews']:.1f}; "
            f"peak memory {r['max_rss_mb']:,} MB here, "
            f"{r['largest_host_process_max_rss_mb']:,} MB in the largest host process"
        )
    top, low = max(counts), min(counts)
    best = {c: max((key for key in results if key[0] == c), key=rate.__getitem__) for c in counts}
    per = results[top, args.host_processes or top]
    main_us, host_us = (1e6 * per[k] / per["reviews"] for k in ("cpu_s", "host_processes_cpu_s"))
    print(
        f"host processes on {top} cores: CPU a review {main_us:.0f} µs in the model's process, "
        f"{host_us:.0f} µs in host processes; "
        f"so on C cores at most about min({1e6 / main_us:,.0f}, (C - 1) × {1e6 / host_us:,.0f}) "
        "reviews/s (a bound, not a measurement)"
    )
    if copies:
        both = sum(r["reviews"] for r in copies) / max(r["wall_s"] for r in copies)
        paces, alone = [r["steady_reviews_per_s"] for r in copies], results[1, 1]["steady_reviews_per_s"]
        paced = f"{sum(paces) / alone:.2f}×" if all(paces) and alone else "n/a"
        print(
            f"independent copies (one job a core, pinned, sharing nothing): {both:,.0f} reviews/s "
            f"on {len(copies)} cores, {both / rate[1, 1]:.2f}× one such job alone "
            f"(after the first parts {paced}): the ceiling of any split"
        )
    steady = {key: r["steady_reviews_per_s"] or 0.0 for key, r in results.items()}
    fastest = {c: max((key for key in results if key[0] == c), key=steady.__getitem__) for c in counts}
    top_pace, low_pace = steady[fastest[top]], steady[fastest[low]]
    scaled = (
        f"{top_pace / low_pace:.2f}×"
        if top_pace and low_pace
        else "n/a (too few parts: more --rows, over 8,192 a core)"
    )
    print(
        f"after the first parts: {_rate(top_pace)} reviews/s on {top} cores, {_rate(low_pace)} on {low}, "
        f"scaling {scaled}"
    )
    r = results[best[top]]
    print(
        f"host: {rate[best[top]]:,.0f} reviews/s on {top} cores "
        f"({r['attn_rows'] / r['wall_s']:,.0f} rows/s), "
        f"scaling {rate[best[top]] / rate[best[low]]:.2f}× from {low} core"
    )


if __name__ == "__main__":
    main()
