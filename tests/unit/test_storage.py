"""Paths and URIs resolve to the right filesystem; plain paths stay exactly as before."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from bertattn_batch.errors import StorageError
from bertattn_batch.storage import glob_base, is_remote, name_path, normalize, redact, resolve, split_uri


@pytest.mark.parametrize(
    ("target", "scheme", "rest"),
    [
        ("runs/r1", None, "runs/r1"),
        ("/abs/r1", None, "/abs/r1"),
        ("C:\\data\\x.parquet", None, "C:\\data\\x.parquet"),
        ("s3://bucket/run", "s3", "bucket/run"),
        ("S3://bucket/run", "s3", "bucket/run"),
        ("gs://b/k", "gs", "b/k"),
        ("file:///tmp/x", "file", "/tmp/x"),
        ("hdfs://nn:8020/p", "hdfs", "nn:8020/p"),
    ],
)
def test_split_uri(target, scheme, rest):
    assert split_uri(target) == (scheme, rest)


def test_remote_schemes_are_the_ones_without_rename():
    assert is_remote("s3://b/k") and is_remote("gs://b/k") and is_remote("hdfs://nn/p")
    assert not is_remote("runs/r1") and not is_remote("file:///tmp/x")


def test_local_path_and_file_uri_name_the_same_file(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    fs1, p1 = resolve(tmp_path / "a.txt")
    fs2, p2 = resolve(f"file://{tmp_path}/a.txt")
    assert isinstance(fs1, pafs.LocalFileSystem) and isinstance(fs2, pafs.LocalFileSystem)
    assert p1 == p2 == str(tmp_path / "a.txt")
    with fs2.open_input_stream(p2) as f:
        assert f.read() == b"hello"


def test_relative_path_becomes_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve("runs/r1")[1] == str(tmp_path / "runs" / "r1")


def test_unknown_scheme_is_one_line_error():
    with pytest.raises(StorageError, match=r"unsupported scheme nosuch://") as e:
        resolve("nosuch://host/x")
    assert "\n" not in str(e.value)


def test_s3_endpoint_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    fs, path = resolve("s3://bucket/run/")
    assert isinstance(fs, pafs.S3FileSystem)
    assert path == "bucket/run"
    assert fs.region == "us-east-1"


def test_a_pyarrow_without_s3_names_the_extra(monkeypatch):
    from bertattn_batch import storage

    monkeypatch.delattr(pafs, "S3FileSystem")
    storage._filesystem.cache_clear()
    with pytest.raises(
        StorageError,
        match=r"s3:// needs a pyarrow built with S3FileSystem: pip install '\.\[s3\]' in a checkout",
    ):
        resolve("s3://bucket/run")


def test_a_scheme_fsspec_serves_through_a_package_not_installed_names_it(monkeypatch):
    import sys

    import fsspec  # noqa: F401 - its registry module, not the attribute of the same name

    monkeypatch.setitem(
        sys.modules["fsspec.registry"].known_implementations,
        "zz",
        {"class": "no_such_pkg.ZZ", "err": "Install no_such_pkg for zz://"},
    )
    with pytest.raises(StorageError, match=r"zz:// needs a package: Install no_such_pkg for zz://"):
        resolve("zz://bucket/x")


def test_uris_join_and_name_without_losing_the_scheme():
    from bertattn_batch.storage import join, name_path, normalize

    assert join("s3://b/run/", "predictions", "part-0.parquet") == "s3://b/run/predictions/part-0.parquet"
    assert name_path("s3://b/in/reviews.jsonl.gz").suffixes == [".jsonl", ".gz"]
    assert normalize("file:///tmp/run") == "/tmp/run" and normalize("s3://b/r") == "s3://b/r"


def test_a_home_folder_path_is_one_place(tmp_path, monkeypatch):
    """out = "~/nightly" made a folder named "~" here while Arrow wrote the parts under the home folder."""
    from bertattn_batch.config import JobSpec
    from bertattn_batch.storage import normalize

    monkeypatch.setenv("HOME", str(tmp_path))
    assert normalize("~/runs/x") == str(tmp_path / "runs" / "x") and normalize("s3://b/~x") == "s3://b/~x"
    spec = JobSpec(inputs=["~/in.csv"], model="~/m", out="~/nightly")
    assert (spec.inputs.paths, spec.model, spec.out) == (
        [str(tmp_path / "in.csv")],
        str(tmp_path / "m"),
        str(tmp_path / "nightly"),
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://u:pw@h:8080/r.csv?token=t1&page=2", "https://***@h:8080/r.csv?token=***&page=2"),
        ("cannot read https://h/r.csv?X-Amz-Date=d&X-Amz-Signature=s: gone",
         "cannot read https://h/r.csv?X-Amz-Date=***&X-Amz-Signature=***: gone"),
        ("az://acct/c/r.csv?sig=s&api_key=k&secret=x", "az://acct/c/r.csv?sig=***&api_key=***&secret=***"),
        ("s3://bucket/day-?.parquet", "s3://bucket/day-?.parquet"),
        ("/data/reviews?token=x.csv", "/data/reviews?token=x.csv"),
    ],
)  # fmt: skip
def test_redact_hides_every_credential_of_a_uri_and_nothing_else(text, shown):
    assert redact(text) == shown


def test_a_web_urls_query_is_no_glob_and_no_part_of_its_name():
    url = "https://h/corpus/reviews.csv?token=abc"
    assert glob_base(url) == url and name_path(url).suffix == ".csv"
    assert glob_base("s3://b/corpus/day-?.csv") == "s3://b/corpus"


@pytest.mark.parametrize("uri", ["s3://", "gs:///path", "s3://AKIAX:se/cret@bucket/run", "s3://K:S@b/run"])
def test_a_store_uri_without_a_bucket_or_with_keys_is_refused_without_repeating_them(uri):
    for call in (normalize, resolve):
        with pytest.raises(StorageError) as e:
            call(uri)
        assert "cret" not in str(e.value) and "AKIAX" not in str(e.value) and "\n" not in str(e.value)
