"""Readers of a whole run keep memory flat in the length of its doc ids. A doc_id is repeated on every
attention row; read as text it took memory in proportion to rows times its length (aggregate held
8.2 GB for 500 reviews with 10,000-character ids)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job

#: Each command's peak, in a process of its own, as it reads a whole run.
READERS = """
import json, resource, sys
from bertattn_batch.analysis import validate_run
from bertattn_batch.analysis.aggregate import aggregate
from bertattn_batch.analysis.faithfulness import faithfulness
run = sys.argv[1]
peaks = {}
for name, read in (
    ("validate", lambda: validate_run(run, check_source=False)),
    ("aggregate", lambda: aggregate(run, min_reviews=1)),
    ("faithfulness", lambda: faithfulness(run, sample=8, device="cpu")),
):
    read()
    peaks[name] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print(json.dumps(peaks))
"""


def _peaks(tiny_en_dir: Path, rows: list[dict], id_length: int, out: Path) -> dict[str, int]:
    ids = [{**r, "doc_id": f"{i:05d}".ljust(id_length, "x")} for i, r in enumerate(rows)]
    src = out.with_suffix(".parquet")
    pq.write_table(pa.Table.from_pylist(ids), src)
    spec = JobSpec(
        inputs=InputSpec([str(src)], id_col="doc_id"), model=str(tiny_en_dir), out=str(out), progress=False
    )
    run_job(spec)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", READERS, str(out)], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_readers_memory_does_not_grow_with_the_ids_length(tiny_en_dir, drug_rows, tmp_path):
    rows = [{"text": r["text"], "label": r["label"]} for r in drug_rows[:60]]
    short = _peaks(tiny_en_dir, rows, 8, tmp_path / "short")
    long = _peaks(tiny_en_dir, rows, 40_000, tmp_path / "long")  # ~600 MB were every row's id text
    for name in short:
        assert long[name] < short[name] + 150, (name, short, long)
