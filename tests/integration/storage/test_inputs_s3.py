"""Inputs on a real S3 API: found by file, prefix or glob by a local folder's rules, and streamed."""

from __future__ import annotations

import gzip
import io
import json
from itertools import islice

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import parquet_with_a_flipped_byte

from bertattn_batch import storage
from bertattn_batch.config import InputSpec
from bertattn_batch.errors import InputError
from bertattn_batch.inputs import expand_inputs, read_rows, read_values
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
    found = [s.path for s in expand_inputs(InputSpec([corpus]))]
    assert found == [*(f"{corpus}/a/p{i}.parquet" for i in range(3)), f"{corpus}/b/reviews.jsonl.gz"]
    assert [s.path for s in expand_inputs(InputSpec([f"{corpus}/a/*.parquet"]))] == found[:3]
    assert [s.format for s in expand_inputs(InputSpec([f"{corpus}/b/reviews.jsonl.gz"]))] == ["jsonl"]


def test_nothing_matched_is_an_input_error(corpus):
    with pytest.raises(InputError, match=r"no such file, folder or match"):
        expand_inputs(InputSpec([f"{corpus}/a/*.csv"]))
    with pytest.raises(InputError, match="is a bertattn run directory"):
        expand_inputs(InputSpec([f"{corpus}/run"]))
    with pytest.raises(InputError, match=r"is a model folder, not reviews \(a model is given with --model\)"):
        expand_inputs(InputSpec([f"{corpus}/model"]))
    storage.write_bytes(f"{corpus}/zipped/reviews.csv.zip", b"PK\x03\x04")
    with pytest.raises(InputError, match=r"holds archives of review files \(reviews.csv.zip\)"):
        expand_inputs(InputSpec([f"{corpus}/zipped"]))
    storage.write_bytes(f"{corpus}/ds/dataset_info.json", b"{}")
    with pytest.raises(InputError, match="is a saved datasets folder; copy it to local disk first"):
        expand_inputs(InputSpec([f"{corpus}/ds"]))


def test_rows_stream_from_parquet_and_gzip_and_are_fingerprinted(corpus):
    sources = expand_inputs(InputSpec([corpus]))
    texts = [t for block in read_rows(InputSpec([corpus]), block_rows=40) for t in block.text]
    assert len(texts) == 350 and texts[0] == "r0-0" and texts[-1] == "j49"
    prints = source_files(sources)
    assert [p["path"] for p in prints] == [s.path for s in sources]
    assert all(p["bytes"] > 0 and len(p["ends_sha256"]) == 64 for p in prints)


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".zst", ".lz4", ".xz"])
def test_compressed_objects_uploaded_as_they_are_are_read(bucket, suffix):
    """An object uploaded byte for byte (``aws s3 cp``) is decompressed once, by the reader, not also by
    the file system from its name. ``write_bytes`` stores the bytes it is given, as a user uploads."""
    import lzma

    rows = "".join(json.dumps({"text": f"j{k}"}) + "\n" for k in range(50)).encode()
    codec = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}.get(suffix)
    packed = lzma.compress(rows)
    if codec is not None:  # as its command-line tool writes it, frame and all
        sink = pa.BufferOutputStream()
        with pa.CompressedOutputStream(sink, codec) as f:
            f.write(rows)
        packed = sink.getvalue().to_pybytes()
    target = f"s3://{bucket}/packed/reviews.jsonl{suffix}"
    storage.write_bytes(target, packed)
    with storage.open_input(target) as f:
        assert f.read() == packed  # stored as given
    texts = [t for block in read_rows(InputSpec([target])) for t in block.text]
    assert texts == [f"j{k}" for k in range(50)]


class _Counting(io.RawIOBase):
    """A store's file that counts the bytes fetched through it."""

    fetched = 0

    def __init__(self, f):
        self.f = f

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.f.seek(pos, whence)

    def tell(self) -> int:
        return self.f.tell()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        _Counting.fetched += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def test_a_parquet_object_with_a_damaged_page_is_refused(bucket):
    """One flipped byte changed a review's text, read without a word: page checksums are verified."""
    path = f"s3://{bucket}/damaged.parquet"
    storage.write_bytes(path, parquet_with_a_flipped_byte(["good", "fine"]))
    with pytest.raises(InputError, match=r"damaged.parquet: cannot read as parquet: .*CRC checksum"):
        list(read_rows(InputSpec([path])))


def test_a_large_parquet_file_streams_by_ranged_reads(bucket, monkeypatch):
    """The first block of rows of a 4-row-group file costs its footer and one row group's column, not
    the whole object: Parquet inputs are read from a store in bounded memory, as from local disk."""
    rng = np.random.default_rng(0)
    texts = ["".join(map(chr, rng.integers(0x4E00, 0x9FA5, 60))) for _ in range(40_000)]
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"text": texts, "n": np.arange(40_000)}), sink, row_group_size=10_000)
    uri = f"s3://{bucket}/big/reviews.parquet"
    storage.write_bytes(uri, sink.getvalue())
    size = storage.info(uri).size
    real = storage.open_input
    monkeypatch.setattr(storage, "open_input", lambda t, buffered=True: _Counting(real(t, buffered=False)))
    (src,) = expand_inputs(InputSpec([uri]))
    first = list(islice(read_values(src, ["text"], 1000), 1000))
    assert [row[0] for row in first[:2]] == [
        t.encode() for t in texts[:2]
    ]  # read as bytes: the row rule decodes
    assert size > 4_000_000 and _Counting.fetched < size / 3, (_Counting.fetched, size)


def test_a_run_of_inputs_on_a_store_resumes_and_reruns(bucket, tiny_en_dir, tmp_path):
    """A manifest read back keeps its inputs' URIs (s3://b/x.csv, not ./s3:/b/x.csv), so a resume or
    rerun reads the same inputs."""
    from bertattn_batch import run_job, validate_run
    from bertattn_batch.config import JobSpec, from_dict

    src = f"s3://{bucket}/reviews.csv"
    storage.write_bytes(src, ("text\n" + "".join(f"review {i} was good\n" for i in range(40))).encode())
    out = tmp_path / "run"
    spec = dict(inputs=[src], model=str(tiny_en_dir), out=str(out), progress=False, window=10)
    assert run_job(from_dict(JobSpec, {**spec, "limit": 20})).input_rows == 20
    again = run_job(JobSpec(**spec))
    assert (again.input_rows, again.skipped_committed) == (20, 20)
    assert run_job(JobSpec(**spec)).input_rows == 0  # nothing new to process
    report = validate_run(out)
    assert report.ok and report.check("inputs").status == "ok", report.render()
