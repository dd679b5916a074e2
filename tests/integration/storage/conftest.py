"""A real S3 API on loopback: moto's standalone server on a free port, with test-only keys."""

from __future__ import annotations

import re
import socket

import pytest

moto_server = pytest.importorskip("moto.server", reason="moto[server] (the test extra) is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3_server():
    """The endpoint URL of a moto S3 server that lives for the session."""
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """The standard AWS environment pointed at the loopback server, for this test only."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    return s3_server


@pytest.fixture
def bucket(s3_env, request):
    """A fresh bucket named after the test."""
    import pyarrow.fs as pafs

    name = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:50].strip("-")
    fs = pafs.S3FileSystem(
        endpoint_override=s3_env.removeprefix("http://"),
        scheme="http",
        region="us-east-1",
        allow_bucket_creation=True,
    )
    fs.create_dir(name)
    return name


@pytest.fixture(autouse=True)
def _run_cache(tmp_path, monkeypatch):
    """Mirrors of stored runs go to the test's own folder, not the user's cache."""
    monkeypatch.setenv("BERTATTN_CACHE", str(tmp_path / "cache"))
