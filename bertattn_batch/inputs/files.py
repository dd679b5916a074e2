"""An input file's bytes: decompressed as read (by their leading bytes), turned into UTF-8 and checked
before any row is read; a stream (``-``, a FIFO, ``<(...)``) copied once into a file the job reads."""

from __future__ import annotations

import atexit
import bz2
import codecs
import contextlib
import csv
import errno
import gzip
import io
import lzma
import os
import re
import stat
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from .. import storage
from .._files import process_alive
from ..errors import InputError, first_line

STDIN = "-"
#: Formats read line by line, whose text is decoded (``--encoding``), with their names in messages.
LINE_FORMATS = {"csv": "CSV", "tsv": "TSV", "jsonl": "JSON lines", "text": "plain text"}
#: What reading a file through :func:`open_binary` raises on damaged bytes (EOFError: cut short).
READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)


@dataclass(frozen=True)
class Source:
    """One input file and its format; ``name``: what the user named it, where not ``path`` (a stream)."""

    path: Path | str  # a URI (str) for a file on an object store
    format: str
    name: str | None = None
    encoding: str = "utf-8"  # of a line-based file's text
    delimiter: str | None = None  # of a CSV or TSV file's fields (None: "," or a tab)

    @property
    def label(self) -> str:  # as the user named it: in messages and the run's record of its inputs
        return self.name or str(self.path)

    @property
    def sep(self) -> str:
        return self.delimiter or ("\t" if self.format == "tsv" else ",")

    def open(self) -> BinaryIO:
        return open_binary(self.path, self.encoding)


# -- compression ---------------------------------------------------------------------------------------
#: Leading bytes of each stream compression (zstd: also a skippable frame, as pzstd writes) and archive.
_MAGIC = {
    "gzip": re.compile(rb"\x1f\x8b\x08"),
    "bz2": re.compile(rb"BZh[1-9](1AY&SY|\x17rE8P\x90)"),
    "zstd": re.compile(rb"\x28\xb5\x2f\xfd|[\x50-\x5f]\x2a\x4d\x18"),
    "lz4": re.compile(rb"\x04\x22\x4d\x18"),
    "xz": re.compile(rb"\xfd7zXZ\x00"),
}
_ARCHIVES = {"zip": re.compile(rb"PK\x03\x04"), "7z": re.compile(rb"7z\xbc\xaf\x27\x1c")}
#: Python's readers of the compressions it knows (its gzip reads past a tape's zero padding); Arrow the rest.
_PYTHON_READERS: dict[str, Callable[[BinaryIO], BinaryIO]] = {
    "gzip": gzip.open,
    "bz2": bz2.open,
    "xz": lzma.open,
}
#: Name endings of stream compressions: ``reviews.jsonl.gz`` is JSON lines.
SUFFIXES = frozenset({".gz", ".gzip", ".bz2", ".zst", ".zstd", ".lz4", ".xz"})
#: Name endings of archives: ``reviews.csv.zip`` holds reviews that the readers cannot reach.
ARCHIVE_SUFFIXES = frozenset({".zip", ".7z", ".tar", ".tgz", ".rar"})


def format_suffix(path: Path | str) -> str:
    """The lowercased suffix that names a file's format, under one compression suffix if it has one."""
    suffixes = [s.lower() for s in storage.name_path(path).suffixes]
    if len(suffixes) > 1 and suffixes[-1] in SUFFIXES:
        return suffixes[-2]
    return suffixes[-1] if suffixes else ""


def compression_of(path: Path | str) -> str | None:
    """The stream compression of a file from its leading bytes, or None for a plain file."""
    with storage.open_input(path, buffered=False) as f:  # ten bytes, not a block, of a store's file
        head = f.read(10)
    kind = next((kind for kind, magic in _MAGIC.items() if magic.match(head)), None)
    suffix = storage.name_path(path).suffix
    if kind is None and suffix.lower() in SUFFIXES:  # a variant not known here would read as garbage rows
        raise InputError(
            f"{path} is named as compressed ({suffix}), but its first bytes are no gzip, bzip2, "
            "zstd, lz4 (frame) or xz stream; decompress it first, or rename it if it is not compressed"
        )
    return kind


def open_binary(path: Path | str, encoding: str = "utf-8") -> BinaryIO:
    """A file's bytes, decompressed, and turned into UTF-8 from ``encoding``; a byte that is no character
    of it stays as it was, so that its row gets ``invalid_utf8``."""
    kind, utf8 = compression_of(path), _is_utf8(encoding)
    raw = storage.open_input(path)
    if kind is None and utf8:
        return raw
    stream = (
        raw if kind is None else _PYTHON_READERS.get(kind, lambda f: pa.CompressedInputStream(f, kind))(raw)
    )
    decoder = None if utf8 else codecs.getincrementaldecoder(encoding)(errors="surrogateescape")
    return io.BufferedReader(_Decoded(raw, stream, decoder), buffer_size=1 << 20)


def _is_utf8(encoding: str) -> bool:
    return codecs.lookup(encoding).name == "utf-8"


class _Decoded(io.RawIOBase):
    """``file``'s bytes through a decompressing ``stream`` and a ``decoder`` (None: UTF-8); closes
    ``file``."""

    def __init__(self, file: BinaryIO, stream: Any, decoder: codecs.IncrementalDecoder | None) -> None:
        self._file, self._stream, self._decoder, self._held = file, stream, decoder, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:
        while not self._held:
            block = self._stream.read(1 << 16)
            decoded = self._decoder and self._decoder.decode(block, final=not block)
            self._held = block if decoded is None else decoded.encode("utf-8", "surrogateescape")
            if not block:
                break
        n = min(len(buffer), len(self._held))
        buffer[:n], self._held = self._held[:n], self._held[n:]
        return n

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._file.close()
            super().close()


# -- checks of the bytes ---------------------------------------------------------------------------------
#: Bytes at a file's start in which undecodable ones are counted.
ENCODING_SAMPLE_BYTES = 1 << 16
#: Share of a sample's non-ASCII bytes that may be undecodable before the file is taken to be in another
#: encoding.
MAX_UNDECODABLE_SHARE = 0.2
#: Byte-order marks of "Unicode text"; UTF-32's begin with UTF-16's, so they come first.
_OTHER_BOMS = {
    codecs.BOM_UTF32_LE: "UTF-32", codecs.BOM_UTF32_BE: "UTF-32", codecs.BOM_UTF16_LE: "UTF-16",
    codecs.BOM_UTF16_BE: "UTF-16",
}  # fmt: skip


def check_bytes(src: Source) -> None:
    """Refuse bytes the readers would turn into garbage rows: archives, compressed Parquet, Parquet named as
    another format, text in another encoding than the one given."""
    if src.format == "datasets":
        return
    try:
        with open_binary(src.path) as f:  # as stored: a byte-order mark says what it holds
            head = f.read(ENCODING_SAMPLE_BYTES)
        if kind := next((k for k, magic in _ARCHIVES.items() if magic.match(head)), None) or _tar(head):
            raise InputError(
                f"{src.path} is a {kind} archive; extract its files first (a file compressed on its own, "
                "such as reviews.jsonl.gz, is read as it is)"
            )
        if src.format == "parquet":
            if kind := compression_of(src.path):
                raise InputError(
                    f"{src.label} is {kind}-compressed; decompress it first "
                    "(Parquet compresses its own pages)"
                )
            return
        if not _is_utf8(src.encoding):
            with open_binary(src.path, src.encoding) as f:  # the decoder's own complaints
                f.read(1 << 12)
    except UnicodeError as e:  # not a byte it cannot decode (kept, as invalid_utf8): a stream it refuses
        raise InputError(
            f"{src.label} cannot be read as {src.encoding} ({first_line(e)}); check --encoding"
        ) from None
    except READ_ERRORS as e:
        raise InputError(f"cannot read {src.label}: {getattr(e, 'strerror', None) or e}") from None
    if head.startswith(b"PAR1") and b"\0" in head[:64]:  # a review may begin with "PAR1"; no NUL
        raise InputError(
            f"{src.label} is a Parquet file, not {LINE_FORMATS.get(src.format, src.format)}; pass "
            "--input-format parquet (or leave --input-format auto with a .parquet name)"
        )
    if _is_utf8(src.encoding):
        _check_utf8(src, head)


def _tar(block: bytes) -> str | None:
    """ "tar" for a tar header (its magic at its place, its checksum right), else None."""
    if len(block) < 512 or block[257:262] != b"ustar":
        return None
    with contextlib.suppress(ValueError):
        if int(block[148:156].replace(b"\0", b" ").strip(), 8) in tarfile.calc_chksums(block[:512]):
            return "tar"
    return None


def _check_utf8(src: Source, head: bytes) -> None:
    """Refuse text in another encoding (UTF-16 or UTF-32, or mostly no UTF-8), saying what to do about it."""
    for bom, name in _OTHER_BOMS.items():
        if head.startswith(bom):
            raise InputError(
                f"{src.label} is {name} text (it starts with a {name} byte-order mark); bertattn reads "
                f"UTF-8: convert it first, e.g. iconv -f {name} -t UTF-8"
            )
    # ASCII spelt in UTF-16, which is valid UTF-8: most bytes of one parity NUL, few of the other
    if len(sample := head[:64]) >= 16:
        even, odd = sample[0::2].count(0) / len(sample[0::2]), sample[1::2].count(0) / len(sample[1::2])
        name = "UTF-16LE" if odd >= 0.6 and even <= 0.1 else "UTF-16BE" if even >= 0.6 and odd <= 0.1 else ""
        if name:
            raise InputError(
                f"{src.label} looks like {name} text without a byte-order mark (every other byte is NUL); "
                f"bertattn reads UTF-8: convert it first (iconv -f {name} -t UTF-8) "
                f"or pass --encoding {name.lower()}"
            )
    if len(head) == ENCODING_SAMPLE_BYTES:
        head = head[:-4]  # a character the sample cut in two is no error
    high = sum(b >= 0x80 for b in head)
    if high < 16 or head.decode("utf-8", errors="replace").count("\ufffd") <= MAX_UNDECODABLE_SHARE * high:
        return
    fits = [
        e for e in ("gb18030", "big5", "shift_jis", "cp1252") if "\ufffd" not in head.decode(e, "replace")
    ]
    iconv = f"iconv -f {{}} -t UTF-8 {src.label} > utf8-{Path(src.label).name}"
    if len(fits) == 1:
        fix = f"convert it ({iconv.format(fits[0].upper())}) or pass --encoding {fits[0]}"
    elif fits:  # one double-byte encoding's bytes are often valid in another: the user knows which
        fix = (f"they read as {', '.join(e.upper() for e in fits[:-1])} or {fits[-1].upper()}: "
               f"pass the one it was saved in (--encoding {', '.join(fits[:-1])} or {fits[-1]}; "
               f"a wrong one reads as garbled reviews), "
               f"or convert it ({iconv.format('ENCODING')})")  # fmt: skip
    else:
        fix = "convert it to UTF-8 or pass --encoding NAME"
    named = f", and reads as {fits[0].upper()}" if len(fits) == 1 else ""
    raise InputError(f"{src.label} is not UTF-8 text (most of its first bytes are no UTF-8{named}): {fix}")


# -- streams ----------------------------------------------------------------------------------------------
#: How a spool's name begins; its :func:`owner` follows, so one left by a killed process is known.
SPOOL_PREFIX = "bertattn-stream-"
#: Streams copied so far, by name: the copy, the stream while it has more, and the bytes read past the
#: copy's last whole row (a second expansion in one process gets the same bytes).
_SPOOLS: dict[str, tuple[Path, BinaryIO | None, bytes]] = {}


def read_once(spec: str) -> bool:
    """Whether an input a run recorded was a stream, which cannot be read again: ``-``, a device or a FIFO."""
    return spec == STDIN or spec.startswith(("/dev/", "/proc/")) or is_stream(Path(spec))


def is_stream(path: Path) -> bool:
    """A pipe, FIFO, socket or device: read once, not reopened (opening a FIFO without a writer hangs)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def spooled(name: str, rows: int | None = None, fmt: str = "auto", delimiter: str | None = None) -> Path:
    """The bytes of stream ``name`` in a temporary file removed at exit: all, or with ``rows`` (``--limit``)
    of a plain line-based ``fmt``, whole rows enough for those and a margin; a later call goes on copying."""
    path, stream, tail = _SPOOLS[name] if name in _SPOOLS else (*_start(name), b"")
    if stream is None:
        return path
    want = None if rows is None or fmt not in LINE_FORMATS else rows + max(int(rows * 0.1), 100)
    try:
        with open(path, "ab") as out:
            out.write(tail)  # what a copy that stopped cut off, a part of a row
            tail = b""
            check_at = max(out.tell() * 2, 1 << 16)  # counted at doubling sizes: linear in all
            while chunk := stream.read1(1 << 20):
                out.write(chunk)
                if want is not None and out.tell() >= check_at:
                    out.flush()
                    # a compressed copy cut short cannot be read, and an array's rows are no lines
                    with open(path, "rb") as f:
                        array = fmt == "jsonl" and json_lead(f)[0].lstrip().startswith(b"[")
                    if array or compression_of(path) is not None:
                        want = None
                    elif (end := _rows_end(path, fmt, delimiter, want)) is not None:
                        with open(path, "r+b") as f:  # cut there; what follows is kept for a later call
                            f.seek(end)
                            tail = f.read()
                            f.truncate(end)
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
    """Where the copy's first ``want`` rows (and a CSV's header) end, in bytes; None where it holds fewer."""
    ends = [0]

    def lines() -> Iterator[str]:
        with open(path, "rb") as f:
            for line in f:
                ends[0] += len(line)
                yield line.decode("latin-1")

    if fmt in ("csv", "tsv"):  # a quoted field may hold line breaks: count records, and the header
        records: Iterator[object] = csv.reader(lines(), delimiter=Source(path, fmt, delimiter=delimiter).sep)
        want += 1
    else:
        records = (line for line in lines() if fmt == "text" or line.strip())
    with contextlib.suppress(csv.Error):  # a quote left open where the copy stops: not yet
        for n, _ in enumerate(records, 1):
            if n == want:
                return ends[0]
    return None


def json_lead(f: BinaryIO) -> tuple[bytes, int]:
    """A JSON file's first bytes that hold more than spaces (no byte-order mark), and the breaks before."""
    lead, breaks = f.read(3).removeprefix(codecs.BOM_UTF8), 0
    while not lead.strip() and (block := f.read(1 << 16)):
        breaks, lead = breaks + lead.count(b"\n"), block
    return lead, breaks


def owner(pid: int | None = None) -> str:
    """Whose spool it is: the process (``pid``, else this one) in its pid namespace."""
    try:
        space = "".join(filter(str.isdigit, os.readlink("/proc/self/ns/pid")))
    except OSError:  # not Linux
        space = "0"
    return f"{space}.{os.getpid() if pid is None else pid}"


def _remove_orphan_spools() -> None:
    """Remove the spools of this namespace's processes that no longer run (a ``kill -9`` skips atexit)."""
    here = owner().split(".")[0]
    for old in Path(tempfile.gettempdir()).glob(f"{SPOOL_PREFIX}*.*-*"):
        space, _, pid = old.name[len(SPOOL_PREFIX) :].split("-", 1)[0].partition(".")
        if space == here and pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):  # another user's, or removed meanwhile
                old.unlink()
