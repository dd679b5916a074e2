"""Review files compressed as one stream (``reviews.jsonl.gz``): told by their leading bytes, decompressed
as they are read, so a corpus need not be unpacked to disk first.

Usage::

    kind = compression_of(path)          # "gzip", "bz2", "zstd", "lz4", "xz" or None
    with open_binary(path) as f:         # the decompressed bytes, read in blocks
        for line in f: ...

The leading bytes decide, not the name: a gzip file named ``reviews.csv`` is read as gzip. A file
named as compressed (``.gz``) whose leading bytes are no stream these readers know is refused rather
than read as garbage rows. Archives (zip, 7z, tar) hold several files under one name; they are refused
by :func:`check_not_archive` with what to do instead.
"""

from __future__ import annotations

import codecs
import gzip
import io
import lzma
import tarfile
import zlib
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa

from ..errors import InputError
from ..storage import is_remote, name_path, open_input, open_stream

#: Leading bytes of each stream compression; the codec name is Arrow's, which decompresses all but xz.
_STREAMS = {
    b"\x1f\x8b\x08": "gzip",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"\x04\x22\x4d\x18": "lz4",
    b"\xfd7zXZ\x00": "xz",
}
#: bzip2: "BZh", a block size digit, then a block's magic number or (an empty stream) the end's.
_BZIP2 = (b"BZh", (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90"))
#: zstd's skippable frames (0x184D2A50 to 0x184D2A5F, little-endian), which pzstd writes first.
_ZSTD_SKIPPABLE = b"\x2a\x4d\x18"
#: Leading bytes of archives, which hold several files (or a tar stream inside gzip, named .tgz).
_ARCHIVES = {b"PK\x03\x04": "zip", b"7z\xbc\xaf\x27\x1c": "7z"}
#: Name endings of stream compressions: ``reviews.jsonl.gz`` is JSON lines.
SUFFIXES = frozenset({".gz", ".gzip", ".bz2", ".zst", ".zstd", ".lz4", ".xz"})
#: Name endings of archives: ``reviews.csv.zip`` holds reviews that the readers cannot reach.
ARCHIVE_SUFFIXES = frozenset({".zip", ".7z", ".tar", ".tgz", ".rar"})
#: What reading a file through :func:`open_binary` raises on damaged bytes: Arrow's and the system's
#: errors are OSErrors; Python's xz and gzip readers raise the others too (EOFError: cut short).
READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)


def format_suffix(path: Path | str) -> str:
    """The lowercased suffix that names a file's format, under one compression suffix if it has one."""
    suffixes = [s.lower() for s in name_path(path).suffixes]
    if len(suffixes) > 1 and suffixes[-1] in SUFFIXES:
        return suffixes[-2]
    return suffixes[-1] if suffixes else ""


def compression_of(path: Path | str) -> str | None:
    """The stream compression of a file from its leading bytes, or None for a plain file."""
    with open_input(path, buffered=False) as f:  # ten bytes, not a block, from a store
        head = f.read(10)
    if head.startswith(_BZIP2[0]) and head[3:4].isdigit() and head[4:10] in _BZIP2[1]:
        return "bz2"
    if head[:1] and head[0] & 0xF0 == 0x50 and head[1:4] == _ZSTD_SKIPPABLE:
        return "zstd"
    kind = next((kind for magic, kind in _STREAMS.items() if head.startswith(magic)), None)
    suffix = name_path(path).suffix
    if kind is None and suffix.lower() in SUFFIXES:
        # a variant these readers do not know (lz4's legacy format, say) would be read as garbage rows
        raise InputError(
            f"{path} is named as compressed ({suffix}), but its first bytes are no gzip, bzip2, "
            "zstd, lz4 (frame) or xz stream; decompress it first, or rename it if it is not compressed"
        )
    return kind


def check_not_archive(path: Path | str) -> None:
    """Refuse an archive (zip, 7z, tar, also a compressed tar): its files have names and formats of
    their own, and read as lines they would be garbage rows."""
    with open_input(path, buffered=False) as f:
        head = f.read(8)
    kind = next((kind for magic, kind in _ARCHIVES.items() if head.startswith(magic)), None)
    if kind is None:
        with open_binary(path) as f:
            block = f.read(512)
        if _is_tar_header(block):
            kind = "tar"
    if kind is not None:
        raise InputError(
            f"{path} is a {kind} archive; extract its files first (a file compressed on its own, such "
            "as reviews.jsonl.gz, is read as it is)"
        )


def _is_tar_header(block: bytes) -> bool:
    """A tar header: its magic at its fixed place and its checksum right. The magic alone is five bytes
    that a review may spell ("mustard" at byte 256)."""
    if len(block) < 512 or block[257:262] != b"ustar":
        return False
    try:
        recorded = int(block[148:156].replace(b"\0", b" ").strip(), 8)
    except ValueError:
        return False
    return recorded in tarfile.calc_chksums(block[:512])


def open_binary(path: Path | str, encoding: str = "utf-8") -> BinaryIO:
    """A file's bytes, decompressed as they are read where it is compressed, and turned into UTF-8 from
    ``encoding``. A byte that is no character of it stays as it was: bytes that spell UTF-8 so (a UTF-8
    file read with ``--encoding ascii``) are read as UTF-8, any other gives its row ``invalid_utf8``."""
    kind = compression_of(path)
    if kind is None:
        raw: BinaryIO = open_input(path)
    elif kind == "xz":
        raw = _StoredXZ(open_input(path)) if is_remote(path) else lzma.open(path, "rb")  # noqa: SIM115
    elif kind == "gzip" and not is_remote(path):  # Arrow's refuses the zeros a tape or dd pads it with
        raw = io.BufferedReader(gzip.GzipFile(path, "rb"), buffer_size=1 << 20)  # type: ignore[arg-type]
    else:
        stream = open_stream(path, kind) if is_remote(path) else pa.input_stream(str(path), compression=kind)
        raw = io.BufferedReader(stream, buffer_size=1 << 20)
    if codecs.lookup(encoding).name == "utf-8":
        return raw
    return io.BufferedReader(_ToUTF8(raw, encoding), buffer_size=1 << 20)


class _StoredXZ(lzma.LZMAFile):
    """An xz stream read from a store's file, which it closes with itself (``lzma.open`` leaves a file
    object it was given open)."""

    def __init__(self, source: BinaryIO) -> None:
        super().__init__(source, "rb")
        self._source = source

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._source.close()


class _ToUTF8(io.RawIOBase):
    """A binary stream of another encoding, read as UTF-8 bytes."""

    def __init__(self, raw: BinaryIO, encoding: str) -> None:
        self._raw = raw
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="surrogateescape")
        self._held = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:
        while not self._held:
            block = self._raw.read(1 << 16)
            self._held = self._decoder.decode(block, final=not block).encode("utf-8", "surrogateescape")
            if not block:
                break
        n = min(len(buffer), len(self._held))
        buffer[:n] = self._held[:n]
        self._held = self._held[n:]
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()
