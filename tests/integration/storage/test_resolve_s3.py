"""resolve() against a real S3 API (moto on loopback): write, list, read back, and one-line errors."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from bertattn_batch.storage import resolve


def test_parquet_round_trip_through_s3(bucket):
    fs, root = resolve(f"s3://{bucket}/run/")
    table = pa.table({"doc_id": ["a", "b", "c"], "n": [1, 2, 3]})
    pq.write_table(table, f"{root}/part-000000.parquet", filesystem=fs)
    listed = fs.get_file_info(pafs.FileSelector(root))
    assert [i.base_name for i in listed] == ["part-000000.parquet"]
    assert pq.read_table(f"{root}/part-000000.parquet", filesystem=fs).equals(table)


def test_ranged_read_fetches_only_what_is_asked(bucket):
    fs, root = resolve(f"s3://{bucket}/blob")
    data = bytes(range(256)) * 4096  # 1 MiB
    with fs.open_output_stream(root) as f:
        f.write(data)
    with fs.open_input_file(root) as f:
        assert f.size() == len(data)
        assert f.read_at(16, 500_000) == data[500_000:500_016]


def test_missing_bucket_raises_oserror_naming_it(s3_env):
    fs, path = resolve("s3://no-such-bucket-here/run/manifest.json")
    with pytest.raises(OSError, match="no-such-bucket-here"):
        fs.open_input_stream(path).read()
