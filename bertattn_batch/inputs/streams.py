"""A stream among the inputs (``-`` for standard input, ``/dev/stdin``, a FIFO, a shell's ``<(...)``),
copied as it is read into a temporary file that the job reads from then on: its checks, its
fingerprint and its rows all see the same bytes.

Usage::

    path = spooled("-", rows=2000, fmt="jsonl")   # enough of standard input for 2000 rows

With a row count (a job's ``--limit``), a line-based stream (not compressed) is copied only until the
copy holds more rows than that, cut after a whole row: ``zcat huge.gz | bertattn extract - --limit
2000`` copied the whole stream first (an endless producer, forever). A later call that wants more goes
on copying.
"""

from __future__ import annotations

import atexit
import codecs
import contextlib
import csv
import errno
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from .._files import process_alive
from ..errors import InputError
from .compressed import compression_of

#: What names standard input among the inputs.
STDIN = "-"
#: Formats read line by line, whose text is decoded (``--encoding``).
LINE_FORMATS = ("csv", "tsv", "jsonl", "text")
#: How a spool's name begins; its :func:`owner` follows, so one left by a killed process is known.
SPOOL_PREFIX = "bertattn-stream-"
#: Rows a copy holds beyond those asked for before it stops, as a share and at least: a row counted
#: here may be one the reader splits otherwise (a stray quote).
ROW_MARGIN = (0.1, 100)

#: Streams copied so far, by the name they were given: the copy, the stream while it has more, and the
#: bytes read past the copy's last whole row.
#: A second expansion in one process (a job's training reads its inputs again) gets the same bytes.
_SPOOLS: dict[str, tuple[Path, BinaryIO | None, bytes]] = {}


def read_once(spec: str) -> bool:
    """Whether an input a run recorded was a stream, which cannot be read again: standard input, a
    device path (``/dev/stdin``, ``/dev/fd/63`` of a shell's ``<(...)``, which name whatever the reading
    process has there now) or a FIFO."""
    return spec == STDIN or spec.startswith(("/dev/", "/proc/")) or is_stream(Path(spec))


def is_stream(path: Path) -> bool:
    """A pipe, FIFO, socket or device (what ``/dev/stdin`` and ``<(...)`` are): read once, not reopened."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def spooled(name: str, rows: int | None = None, fmt: str = "auto", delimiter: str | None = None) -> Path:
    """The bytes of stream ``name`` (``-``: standard input) in a temporary file, removed when the process
    ends: all of them, or with ``rows``, of a line-based ``fmt``, whole rows enough for more than that."""
    path, stream, tail = _SPOOLS[name] if name in _SPOOLS else (*_start(name), b"")
    if stream is None:
        return path
    want = None if rows is None or fmt not in LINE_FORMATS else rows
    if want is not None:
        want += max(int(want * ROW_MARGIN[0]), ROW_MARGIN[1])
    try:
        with open(path, "ab") as out:
            out.write(tail)  # what a copy that stopped cut off, a part of a row
            tail = b""
            check_at = max(out.tell() * 2, 1 << 16)  # counted at doubling sizes: linear in all
            while chunk := stream.read1(1 << 20):
                out.write(chunk)
                if want is not None and out.tell() >= check_at:
                    out.flush()
                    if compression_of(path) is not None or (fmt == "jsonl" and _json_array(path)):
                        want = None  # cut short, its end could not be read; an array's rows are no lines
                    elif (end := _rows_end(path, fmt, delimiter, want)) is not None:
                        tail = _cut(path, end)  # the copy ends with a whole row
                        break
                    check_at = out.tell() * 2
            else:
                stream = None  # read to its end
    except OSError as e:
        if e.errno == errno.ENOSPC:  # the copy's folder is full, not the stream at fault
            raise InputError(
                f"cannot copy {name} into {path.parent}: no space left on the device; set TMPDIR to a "
                "folder with room"
            ) from None
        raise InputError(f"cannot read {name}: {e.strerror or e}") from None
    _SPOOLS[name] = (path, stream, tail)
    return path


def _start(name: str) -> tuple[Path, BinaryIO]:
    _remove_orphan_spools()
    fd, tmp = tempfile.mkstemp(prefix=f"{SPOOL_PREFIX}{owner()}-")
    os.close(fd)
    path = Path(tmp)
    atexit.register(path.unlink, missing_ok=True)
    if name == STDIN:
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("- reads reviews from standard input, but nothing is piped in")
        return path, sys.stdin.buffer
    try:
        return path, open(name, "rb")  # kept open: a later call may copy more
    except OSError as e:
        raise InputError(f"cannot read {name}: {e.strerror or e}") from None


def _rows_end(path: Path, fmt: str, delimiter: str | None, want: int) -> int | None:
    """Where the copy's first ``want`` rows end (a CSV's header too), in bytes; None where it holds
    fewer. Rows: lines (JSON lines: those not blank), or records of a CSV, whose quoted field may hold
    line breaks. Read as Latin-1, a character a byte: the quotes, delimiters and line breaks of any
    encoding a job reads are ASCII."""
    end = 0

    def lines() -> Iterator[str]:
        nonlocal end
        with open(path, "rb") as f:
            for line in f:
                end += len(line)
                yield line.decode("latin-1")

    if fmt in ("csv", "tsv"):
        sep = delimiter or ("\t" if fmt == "tsv" else ",")
        records: Iterator[object] = csv.reader(lines(), delimiter=sep)  # reads no line past a record
        want += 1  # the header
    else:
        records = (line for line in lines() if fmt == "text" or line.strip())
    n = 0
    with contextlib.suppress(csv.Error):  # a quote left open where the copy stops: not yet
        for _ in records:
            n += 1
            if n == want:
                return end
    return None


def json_lead(f: BinaryIO) -> tuple[bytes, int]:
    """A JSON file's first bytes that hold more than spaces (an editor's byte-order mark dropped), and
    the line breaks before them: whether its first value starts with ``[`` tells one array from JSON
    lines. Blank lines before it are read in blocks and dropped, whatever their length."""
    lead, breaks = f.read(3).removeprefix(codecs.BOM_UTF8), 0
    while not lead.strip() and (block := f.read(1 << 16)):
        breaks, lead = breaks + lead.count(b"\n"), block
    return lead, breaks


def _json_array(path: Path) -> bool:
    """Whether a JSON file holds one array (:func:`json_lead`)."""
    with open(path, "rb") as f:
        return json_lead(f)[0].lstrip().startswith(b"[")


def _cut(path: Path, end: int) -> bytes:
    """Cut the copy at ``end``; what followed, to be written again when it goes on."""
    with open(path, "r+b") as f:
        f.seek(end)
        tail = f.read()
        f.truncate(end)
    return tail


def owner(pid: int | None = None) -> str:
    """Who a spool is of, as its name says: the process (``pid``, else this one) in its pid namespace.
    Why the namespace: containers that share a temporary folder number their processes apart, and a
    process of one looked ended to another, which removed its live spool."""
    try:
        space = "".join(filter(str.isdigit, os.readlink("/proc/self/ns/pid")))
    except OSError:  # not Linux
        space = "0"
    return f"{space}.{os.getpid() if pid is None else pid}"


def _remove_orphan_spools() -> None:
    """Remove the spools of this namespace's processes that no longer run: a ``kill -9`` skips the exit
    hook that removes a spool, and a stream can be gigabytes."""
    here = owner().split(".")[0]
    for old in Path(tempfile.gettempdir()).glob(f"{SPOOL_PREFIX}*.*-*"):
        space, _, pid = old.name[len(SPOOL_PREFIX) :].split("-", 1)[0].partition(".")
        if space == here and pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):  # another user's, or removed meanwhile
                old.unlink()
