"""Listing and streaming inputs from a real S3 API: globs, folders, Parquet by row group, gzip text."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertattn_batch.errors import StorageError
from bertattn_batch.storage import list_files, open_stream, resolve


@pytest.fixture
def corpus(bucket):
    fs, root = resolve(f"s3://{bucket}/corpus")
    for i in range(3):
        pq.write_table(
            pa.table({"text": [f"r{i}-{j}" for j in range(100)]}), f"{root}/a/p{i}.parquet", filesystem=fs
        )
    rows = [{"text": f"j{k}"} for k in range(50)]
    with fs.open_output_stream(f"{root}/b/reviews.jsonl.gz", compression=None) as f:
        f.write(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return f"s3://{bucket}/corpus"


def test_glob_folder_and_file(corpus):
    assert list_files(f"{corpus}/a/*.parquet") == [f"{corpus}/a/p{i}.parquet" for i in range(3)]
    assert list_files(f"{corpus}/a/p1.parquet") == [f"{corpus}/a/p1.parquet"]
    assert list_files(corpus) == [
        *(f"{corpus}/a/p{i}.parquet" for i in range(3)),
        f"{corpus}/b/reviews.jsonl.gz",
    ]


def test_nothing_matched_is_an_error(corpus):
    with pytest.raises(StorageError, match=r"no such file, folder or match"):
        list_files(f"{corpus}/a/*.csv")
    with pytest.raises(StorageError):
        list_files(f"{corpus}/missing")


def test_parquet_streams_by_row_group(corpus):
    fs, path = resolve(f"{corpus}/a/p2.parquet")
    with fs.open_input_file(path) as f:
        batches = list(pq.ParquetFile(f).iter_batches(batch_size=30))
    assert [len(b) for b in batches] == [30, 30, 30, 10]
    assert batches[0].column("text")[0].as_py() == "r2-0"


def test_gzip_jsonl_streams_decompressed(corpus):
    with open_stream(f"{corpus}/b/reviews.jsonl.gz") as f:
        lines = f.read().decode().splitlines()
    assert len(lines) == 50 and json.loads(lines[-1]) == {"text": "j49"}
