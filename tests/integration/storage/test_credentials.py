"""Credentials in a URI: recorded and shown nowhere (a web URL's password and token), or refused with
one line that does not repeat them (keys in an object store's URI); a store's URI without a bucket is
no local folder."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bertattn_batch import storage
from bertattn_batch.cli import app

runner = CliRunner()


def _extract(inputs: str, model: Path, out: str) -> str:
    r = runner.invoke(app, ["extract", inputs, "--model", str(model), "--out", out, "--no-progress"])
    return f"{r.exit_code}\n{r.output}"


@pytest.fixture
def web(tmp_path) -> str:
    """A web server on loopback serving a folder of reviews."""
    folder = tmp_path / "web"
    folder.mkdir()
    (folder / "reviews.csv").write_text("text\ngood food\nbad service\nfine\n")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()


def test_a_password_and_a_token_in_an_input_url_are_recorded_and_shown_nowhere(web, tiny_en_dir, tmp_path):
    url = f"http://reader:hunter2@{web}/reviews.csv?token=s3cr3t&page=1"  # ?token= is no glob
    out = tmp_path / "run"
    said = _extract(url, tiny_en_dir, str(out))
    assert said.startswith("0\n"), said
    said += _extract(url, tiny_en_dir, str(out))  # resumed: the redacted URL is still the same input
    assert said.count("0\n") == 2 and "up to date" in said, said
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 0, r.output
    said += r.output + _extract(url.replace("reviews.csv", "gone.csv"), tiny_en_dir, str(tmp_path / "gone"))
    manifest = (out / "manifest.json").read_text()
    for text in (manifest, (out / "report.html").read_text(), said):
        assert "hunter2" not in text and "s3cr3t" not in text
    assert manifest.count(f"http://***@{web}/reviews.csv?token=***&page=1") == 3, manifest


@pytest.mark.parametrize("where", ["--out", "input"])
def test_keys_in_an_s3_uri_are_refused_without_repeating_them(bucket, tiny_en_dir, tmp_path, where):
    uri = f"s3://AKIAEXAMPLE:wJalrXUtn/FEMI@{bucket}/run"
    local = tmp_path / "in.txt"
    local.write_text("good\n")
    said = (
        _extract(uri, tiny_en_dir, str(tmp_path / "r"))
        if where == "input"
        else _extract(str(local), tiny_en_dir, uri)
    )
    assert said.startswith("1\n") and len(said.splitlines()) == 2, said
    assert "never in a URI" in said and "wJalrXUtn" not in said and "AKIAEXAMPLE" not in said, said
    assert storage.list_names(f"s3://{bucket}", recursive=True) == []


def test_an_s3_uri_without_a_bucket_is_refused_not_taken_for_a_local_folder(
    s3_env, tiny_en_dir, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.txt").write_text("good\n")
    said = _extract("in.txt", tiny_en_dir, "s3://")
    assert said.startswith("1\n") and "s3:// names no bucket" in said, said
    assert not any(p.name.startswith("s3") for p in tmp_path.iterdir())
