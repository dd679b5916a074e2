"""Inputs on a real S3 API: found by file, prefix or glob by a local folder's rules, and streamed."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bertattn_batch import storage
from bertattn_batch.errors import InputError
from bertattn_batch.inputs import expand_inputs, read_rows
from bertattn_batch.inputs.fingerprint import source_files


@pytest.fixture
def corpus(bucket):
    root = f"s3://{bucket}/corpus"
    for i in range(3):
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table({"text": [f"r{i}-{j}" for j in range(100)]}), sink, row_group_size=30)
        storage.write_bytes(f"{root}/a/p{i}.parquet", sink.getvalue())
    rows = "".join(json.dumps({"text": f"j{k}"}) + "\n" for k in range(50))
    storage.write_bytes(f"{root}/b/reviews.jsonl.gz", gzip.compress(rows.encode()))
    storage.write_bytes(f"{root}/b/_tmp.jsonl", b'{"text": "hidden"}\n')  # a temporary: passed over
    storage.write_bytes(f"{root}/b/notes.md", b"not reviews")  # another file: passed over, named
    storage.write_bytes(f"{root}/run/manifest.json", b"{}")  # a run inside the input: passed over
    storage.write_bytes(f"{root}/run/predictions/part-0.parquet", b"PAR1")
    storage.write_bytes(f"{root}/model/config.json", b"{}")  # a model folder inside: passed over
    storage.write_bytes(f"{root}/model/tokenizer.json", b"{}")
    return root


def test_a_prefix_a_glob_and_a_file(corpus):
    found = [s.path for s in expand_inputs([corpus])]
    assert found == [*(f"{corpus}/a/p{i}.parquet" for i in range(3)), f"{corpus}/b/reviews.jsonl.gz"]
    assert [s.path for s in expand_inputs([f"{corpus}/a/*.parquet"])] == found[:3]
    assert [s.format for s in expand_inputs([f"{corpus}/b/reviews.jsonl.gz"])] == ["jsonl"]


def test_nothing_matched_is_an_input_error(corpus):
    with pytest.raises(InputError, match=r"no such file, folder or match"):
        expand_inputs([f"{corpus}/a/*.csv"])
    with pytest.raises(InputError, match="is a bertattn run directory"):
        expand_inputs([f"{corpus}/run"])
    storage.write_bytes(f"{corpus}/ds/dataset_info.json", b"{}")
    with pytest.raises(InputError, match="is a saved datasets folder; copy it to local disk first"):
        expand_inputs([f"{corpus}/ds"])


def test_rows_stream_from_parquet_and_gzip_and_are_fingerprinted(corpus):
    sources = expand_inputs([corpus])
    texts = [t for block in read_rows([corpus], block_rows=40) for t in block.text]
    assert len(texts) == 350 and texts[0] == "r0-0" and texts[-1] == "j49"
    prints = source_files(sources)
    assert [p["path"] for p in prints] == [s.path for s in sources]
    assert all(p["bytes"] > 0 and len(p["ends_sha256"]) == 64 for p in prints)
