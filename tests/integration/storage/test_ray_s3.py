"""The Ray engine with two workers writing one run on a real S3 API: the parts of the local engine."""

from __future__ import annotations

import importlib.util

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import SORT_KEYS, same_job_table

from bertattn_batch import schema, storage
from bertattn_batch.config import InputSpec, JobSpec
from bertattn_batch.engines import run_job
from bertattn_batch.engines.ray import ray_runtime
from bertattn_batch.run import committed_files, read_manifest

pytestmark = pytest.mark.xdist_group("ray")  # one worker runs every test that starts a Ray runtime


@pytest.fixture
def ray_with_s3_env(bucket):
    """A local Ray runtime started once the AWS environment points at the loopback store: its workers
    inherit it, as a cluster's pods get theirs from their spec."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install '.[ray]')")
    with ray_runtime(num_cpus=2) as ray:
        yield ray


def _tables(run: str) -> dict[str, pa.Table]:
    parts = committed_files(run)
    out = {}
    for t in schema.TABLES:
        read = [pq.read_table(storage.open_input(p.files[t], buffered=False)) for p in parts]
        out[t] = same_job_table(pa.concat_tables(read)).sort_by([(k, "ascending") for k in SORT_KEYS[t]])
    return out


def test_two_ray_workers_write_one_run_to_s3(ray_with_s3_env, bucket, drug_rows, tiny_en_dir, tmp_path):
    rows = [{"doc_id": f"r{i}", "text": r["text"][:300]} for i, r in enumerate(drug_rows[:30])]
    src = f"s3://{bucket}/in/reviews.parquet"
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    storage.write_bytes(src, sink.getvalue())

    def spec(out: str, **kw) -> JobSpec:
        return JobSpec(
            inputs=InputSpec([src], id_col="doc_id"),
            model=str(tiny_en_dir),
            out=out,
            window=4,
            progress=False,
            **kw,
        )

    run_job(spec(f"s3://{bucket}/runs/ray", engine="ray", workers=2))
    run_job(spec(f"s3://{bucket}/runs/local"))
    ray_run, local_run = _tables(f"s3://{bucket}/runs/ray"), _tables(f"s3://{bucket}/runs/local")
    for t in schema.TABLES:
        assert ray_run[t].equals(local_run[t]), t
    manifest = read_manifest(f"s3://{bucket}/runs/ray")
    assert manifest.status == "complete" and manifest.counts["predictions"] == 30
    windows = [(p.start_row, p.end_row) for p in read_manifest(f"s3://{bucket}/runs/local").parts]
    assert [(p.start_row, p.end_row) for p in manifest.parts] == windows  # the same windows, part for part
    assert len(manifest.parts) == 8
