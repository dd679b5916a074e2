"""Streams are read once: rows from a pipe (``-``, ``/dev/stdin``, a FIFO) are scored, never lost with exit
status 0; a FIFO inside an input folder is passed over with a warning instead of hanging the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pyarrow.csv
import pytest
from helpers import manifest_json, read_table

from bertattn_batch.errors import InputError
from bertattn_batch.inputs.files import owner, spooled

ROWS = [{"id": f"r{i}", "text": t} for i, t in enumerate(["great food", "slow service", "nice staff"])]
JSONL = "".join(json.dumps(r) + "\n" for r in ROWS)


def _bertattn(*args: str, stdin: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bertattn_batch", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def _extract(src: str, model: Path, out: Path, *more: str, stdin: str | None = None, timeout: float = 300):
    args = ["extract", src, "--model", str(model), "--out", str(out), "--id-col", "id", "--no-progress"]
    return _bertattn(*args, *more, stdin=stdin, timeout=timeout)


@pytest.mark.parametrize("name", ["-", "/dev/stdin"])
def test_rows_piped_in_are_scored(name, tiny_en_dir, tmp_path):
    out = tmp_path / "run"
    done = _extract(name, tiny_en_dir, out, "--input-format", "jsonl", stdin=JSONL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("3 reviews (3 scored"), done.stdout
    assert read_table(out, "predictions").column("doc_id").to_pylist() == ["r0", "r1", "r2"]
    m = manifest_json(out)
    assert m["sources"][0]["bytes"] == len(JSONL.encode()) and m["sources"][0]["path"] == (
        "-" if name == "-" else os.path.abspath(name)
    )
    checked = _bertattn("validate", str(out))
    assert checked.returncode == 0 and "3 reviews checked against the texts the run stored" in checked.stdout


def test_the_same_stream_resumes_and_another_is_refused(tiny_en_dir, tmp_path):
    out = tmp_path / "run"
    assert _extract("-", tiny_en_dir, out, "--input-format", "jsonl", stdin=JSONL).returncode == 0
    again = _extract("-", tiny_en_dir, out, "--input-format", "jsonl", stdin=JSONL)
    assert again.returncode == 0 and "nothing new to process" in again.stdout, again.stderr
    other = _extract("-", tiny_en_dir, out, "--input-format", "jsonl", stdin=JSONL.replace("great", "grand"))
    assert other.returncode == 1 and "the inputs changed since this run began" in other.stderr


def test_a_stream_read_with_a_limit_goes_on_when_piped_again_whole(tiny_en_dir, tmp_path):
    """The run records the start of the stream it copied up to its --limit; piped again whole, with a
    larger limit or none, the same stream goes on."""
    out = tmp_path / "run"
    rows = "".join(
        json.dumps({"id": f"r{i}", "text": f"review number {i} was fine"}) + "\n" for i in range(2000)
    )
    first = _extract("-", tiny_en_dir, out, "--input-format", "jsonl", "--limit", "300", stdin=rows)
    assert first.returncode == 0, first.stderr
    assert manifest_json(out)["sources"][0]["bytes"] < len(rows)  # only a start of it was copied
    rest = _extract("-", tiny_en_dir, out, "--input-format", "jsonl", stdin=rows)
    assert rest.returncode == 0, rest.stderr
    assert rest.stdout.startswith("1700 reviews (1700 scored"), rest.stdout
    assert sorted(read_table(out, "predictions").column("row_index").to_pylist()) == list(range(2000))
    assert manifest_json(out)["sources"][0]["bytes"] == len(rows)  # what this pass read is what it records
    # read whole, a stream is compared whole: one that grew since is another stream
    grown = rows + json.dumps({"id": "new", "text": "appended"}) + "\n"
    refused = _extract("-", tiny_en_dir, out, "--input-format", "jsonl", stdin=grown)
    assert refused.returncode == 1 and "the inputs changed since this run began" in refused.stderr
    other = tmp_path / "other"
    assert (
        _extract("-", tiny_en_dir, other, "--input-format", "jsonl", "--limit", "300", stdin=rows).returncode
        == 0
    )
    changed = _extract("-", tiny_en_dir, other, "--input-format", "jsonl", stdin=rows.replace('r5"', 'x5"'))
    assert changed.returncode == 1 and "the inputs changed since this run began" in changed.stderr


def test_standard_input_needs_a_format(tiny_en_dir, tmp_path):
    done = _extract("-", tiny_en_dir, tmp_path / "run", stdin=JSONL)
    assert done.returncode == 1 and "cannot tell the format of standard input" in done.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_named_as_an_input_is_read_once(tiny_en_dir, tmp_path):
    fifo = tmp_path / "reviews.jsonl"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "w") as f:  # one writer, as a shell's <(...) has: each open eats what is written
            f.write(JSONL)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    done = _extract(str(fifo), tiny_en_dir, tmp_path / "run")
    writer.join(timeout=5)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("3 reviews (3 scored"), done.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_inside_an_input_folder_is_passed_over(tiny_en_dir, tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_text(JSONL)
    os.mkfifo(folder / "b.jsonl")  # no writer: opening it would wait forever
    done = _extract(str(folder), tiny_en_dir, tmp_path / "run", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "passed over 1 file(s) that are not regular files" in done.stderr and "b.jsonl" in done.stderr
    assert done.stdout.startswith("3 reviews (3 scored")


def test_a_stream_run_without_stored_text_is_measured_and_drawn_from_its_tokens(tiny_en_dir, tmp_path):
    """faithfulness and plot --pairs read the token ids the run scored: a piped run without its text,
    whose rows cannot be read again, is measured and drawn."""
    out = tmp_path / "run"
    done = _extract("-", tiny_en_dir, out, "--input-format", "jsonl", "--no-store-text", stdin=JSONL)
    assert done.returncode == 0, done.stderr
    faith = _bertattn("faithfulness", str(out), "--sample", "3", "--device", "cpu", "--no-progress")
    assert faith.returncode == 0 and "wrote " in faith.stdout, faith.stderr
    png = tmp_path / "r1.png"
    drawn = _bertattn("plot", str(out), "--doc-id", "r1", "--pairs", "--out", str(png))
    assert drawn.returncode == 0 and png.stat().st_size > 0, drawn.stderr


def test_a_full_temporary_folder_is_named_not_the_stream(tmp_path, monkeypatch):
    """A stream's copy that fills the temporary folder names the folder and how to move it, not the
    stream."""
    from bertattn_batch.inputs import files

    src = tmp_path / "stream.jsonl"
    src.write_text(JSONL)
    with open(src, "rb") as stream:
        monkeypatch.setattr(files, "_start", lambda name: (Path("/dev/full"), stream))  # writes: ENOSPC
        with pytest.raises(InputError, match=r"cannot copy .*stream.jsonl into /dev: no space left .*TMPDIR"):
            spooled(str(src))


def test_spools_of_killed_processes_are_removed(tmp_path, monkeypatch):
    """A kill -9 skips the exit hook that removes a stream's copy; the next stream read removes the
    copies of processes that no longer run, and no other."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen(["true"])
    ended.wait()
    orphan = tmp_path / f"bertattn-stream-{owner(ended.pid)}-x1"
    live = tmp_path / f"bertattn-stream-{owner()}-x2"
    # a process of another container that shares the folder: its pid means nothing here
    elsewhere = tmp_path / f"bertattn-stream-1.{ended.pid}-x3"
    for f in (orphan, live, elsewhere):
        f.write_text("rows")
    src = tmp_path / "stream.jsonl"
    src.write_text(JSONL)
    spool = spooled(str(src))
    assert spool.read_text() == JSONL and spool.name.startswith(f"bertattn-stream-{owner()}-")
    assert not orphan.exists() and live.exists() and elsewhere.exists()


def test_a_limit_copies_no_more_of_an_endless_stream_than_it_reads(tiny_en_dir, tmp_path):
    """`producer | bertattn extract - --limit N` copies no more than it reads: a producer may not end."""
    out = tmp_path / "run"
    endless = (
        "import itertools\nfor i in itertools.count():\n"
        '    print(\'{"id": "r%d", "text": "good food %d"}\' % (i, i))'
    )
    producer = subprocess.Popen([sys.executable, "-c", endless], stdout=subprocess.PIPE)
    try:
        args = ["extract", "-", "--model", str(tiny_en_dir), "--out", str(out), "--id-col", "id",
                "--no-progress"]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "bertattn_batch", *args, "--input-format", "jsonl", "--limit", "300"],
            stdin=producer.stdout, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    finally:
        producer.kill()
    assert done.returncode == 0, done.stderr
    ids = read_table(out, "predictions").column("doc_id").to_pylist()
    assert ids == [f"r{i}" for i in range(300)]
    assert manifest_json(out)["sources"][0]["bytes"] < 1 << 20  # a copy of what it read, and a little more


def test_a_limited_copy_of_a_csv_holds_whole_rows(tmp_path):
    """A CSV's quoted field may hold line breaks: the copy stops on rows, not lines, and goes on copying
    for a later call that wants more."""
    body = "".join(f'r{i},"好 line one\nline two of {i}"\n' for i in range(5000))
    src = tmp_path / "in.csv"
    os.mkfifo(src)
    writer = threading.Thread(target=lambda: src.write_text("id,text\n" + body))
    writer.start()
    part = spooled(str(src), rows=1000, fmt="csv")
    import csv

    with open(part, newline="", encoding="utf-8") as f:  # no character cut in two...
        rows = list(csv.reader(f))
    assert len(rows) - 1 == 1100  # the rows asked for and a margin, whole
    assert pyarrow.csv.read_csv(part).num_rows == 1100 and rows[-1] == [
        "r1099",
        "好 line one\nline two of 1099",
    ]
    assert (
        spooled(str(src)).read_text(encoding="utf-8") == "id,text\n" + body
    )  # the rest, for a reader of all of it
    writer.join()


def test_a_compressed_stream_with_a_limit_is_copied_whole(tiny_en_dir, tmp_path):
    """A gzip stream cut where the rows suffice cannot be read to its end: it is copied whole."""
    import gzip
    import random

    rng = random.Random(0)
    lines = "".join(
        json.dumps({"id": f"r{i}", "text": f"{rng.getrandbits(256):x}"}) + "\n" for i in range(4000)
    )
    packed = gzip.compress(lines.encode())
    assert len(packed) > 1 << 17  # past the first place a copy may stop
    out = tmp_path / "run"
    args = ["extract", "-", "--model", str(tiny_en_dir), "--out", str(out), "--id-col", "id", "--no-progress"]
    done = subprocess.run(
        [sys.executable, "-m", "bertattn_batch", *args, "--input-format", "jsonl", "--limit", "50"],
        input=packed, capture_output=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert read_table(out, "predictions").num_rows == 50


def test_a_json_array_piped_in_with_a_limit_is_scored(tiny_en_dir, tmp_path):
    """A --limit copies a line-based stream only as far as its rows; an indented JSON array's rows are
    no lines, so it is copied whole and read as an array."""
    out = tmp_path / "run"
    array = json.dumps([{"id": f"r{i}", "text": f"review {i}"} for i in range(5000)], indent=2)  # 300 KB
    done = _extract("-", tiny_en_dir, out, "--input-format", "jsonl", "--limit", "200", stdin=array)
    assert done.returncode == 0, done.stderr
    assert read_table(out, "predictions").column("doc_id").to_pylist() == [f"r{i}" for i in range(200)]
