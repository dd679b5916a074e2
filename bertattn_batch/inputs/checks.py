"""The checks a job makes of its inputs before it loads a model: found, readable, the wanted columns.

Usage::

    sources = check_inputs(InputSpec(["reviews.csv"], id_col="id"))   # or InputError, one line

Reads only names and headers, so a mistyped path or column fails at once.
"""

from __future__ import annotations

import codecs
import csv
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..config import InputSpec
from ..errors import InputError, first_line
from ..storage import is_remote
from .compressed import READ_ERRORS, check_not_archive, compression_of, open_binary
from .csv import csv_header
from .discover import Source, expand_inputs
from .hf_datasets import load_dataset
from .jsonl import json_keys
from .rows import wanted_columns
from .streams import LINE_FORMATS
from .text import TEXT_FILE_COLUMN


def check_inputs(spec: InputSpec, out: str | Path | None = None) -> list[Source]:
    """The sources, once every one is found, readable as its format and has the wanted columns, and
    none inside the run directory ``out`` (which --overwrite would clear).

    Reads only names and headers, so a job can fail on a mistyped path or column at once, before it
    loads a model or creates its run directory.
    """
    sources = expand_inputs(spec.paths, spec.format, spec.encoding, spec.delimiter, spec.limit)
    wanted = wanted_columns(spec.text_col, spec.id_col, spec.label_col)
    for src in sources:
        if out and _inside(src.path, out):
            raise InputError(f"input {src.label} lies inside the run directory {out}; choose another --out")
        _check_bytes(src)
        if src.format in LINE_FORMATS and codecs.lookup(src.encoding).name == "utf-8":
            _check_mostly_utf8(src)
        _check_columns(src, wanted)
    return sources


def _inside(path: Path | str, folder: str | Path) -> bool:
    if is_remote(path) or is_remote(folder):
        return os.fspath(path).startswith(os.fspath(folder).rstrip("/") + "/")
    return Path(folder).resolve() in Path(path).resolve().parents


#: Bytes at a file's start in which undecodable ones are counted.
ENCODING_SAMPLE_BYTES = 1 << 16
#: Share of a sample's non-ASCII bytes that may be undecodable before the file is taken to be in
#: another encoding (a few bad rows are those rows' status, ``invalid_utf8``).
MAX_UNDECODABLE_SHARE = 0.2


def _check_mostly_utf8(src: Source) -> None:
    """Refuse a file whose text is mostly not UTF-8 (what Chinese Excel saves: GBK/GB18030), with the
    command that converts it: read as UTF-8 nearly every review would be ``invalid_utf8``."""
    try:
        with src.open() as f:
            head = f.read(ENCODING_SAMPLE_BYTES)
    except READ_ERRORS:
        return  # the reader names the problem
    head = head[: max(0, len(head) - 4)] if len(head) == ENCODING_SAMPLE_BYTES else head  # cut characters
    high = sum(b >= 0x80 for b in head)
    bad = head.decode("utf-8", errors="replace").count("\ufffd")
    if high < 16 or bad <= MAX_UNDECODABLE_SHARE * high:
        return
    fits = [e for e in ("gb18030", "big5", "shift_jis", "cp1252") if _decodes(head, e)]
    if len(fits) == 1:
        fix = f"convert it ({_iconv(src, fits[0].upper())}) or pass --encoding {fits[0]}"
    elif fits:  # one double-byte encoding's bytes are often valid in another (Big5 in GB18030): the user
        # knows which it was saved in, and the wrong one reads as garbled reviews
        names = ", ".join(fits[:-1]) + f" or {fits[-1]}"
        fix = (f"they read as {', '.join(e.upper() for e in fits[:-1])} or {fits[-1].upper()}: pass the one "
               f"it was saved in (--encoding {names}; a wrong one reads as garbled reviews), or convert it "
               f"({_iconv(src, 'ENCODING')})")  # fmt: skip
    else:
        fix = "convert it to UTF-8 or pass --encoding NAME"
    named = f", and reads as {fits[0].upper()}" if len(fits) == 1 else ""
    raise InputError(f"{src.label} is not UTF-8 text (most of its first bytes are no UTF-8{named}): {fix}")


def _iconv(src: Source, encoding: str) -> str:
    return f"iconv -f {encoding} -t UTF-8 {src.label} > utf8-{Path(src.label).name}"


def _decodes(data: bytes, encoding: str) -> bool:
    try:
        data.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


#: Byte-order marks of the encodings that editors and spreadsheets write instead of UTF-8 ("Unicode
#: text"); UTF-32's begin with UTF-16's, so they come first.
_OTHER_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def _check_bytes(src: Source) -> None:
    """Refuse files whose bytes the readers would turn into garbage rows: archives, compressed files of
    formats that compress inside (Parquet, datasets), and line-based files that announce another
    encoding than UTF-8 (every review would be NUL-interleaved bytes)."""
    if src.format == "datasets":
        return
    kind, head = None, b""
    utf8 = codecs.lookup(src.encoding).name == "utf-8"
    try:
        check_not_archive(src.path)
        if src.format == "parquet":
            kind = compression_of(src.path)
        else:
            with open_binary(src.path) as f:  # as stored: a byte-order mark says what it holds
                head = f.read(UTF16_SAMPLE_BYTES)
            if not utf8:
                with open_binary(src.path, src.encoding) as f:  # as read: the decoder's own complaints
                    f.read(1 << 12)
    except UnicodeError as e:  # not a byte it cannot decode (kept, as invalid_utf8), a stream it refuses
        raise InputError(
            f"{src.label} cannot be read as {src.encoding} ({first_line(e)}); check --encoding"
        ) from None
    except READ_ERRORS as e:
        raise InputError(f"cannot read {src.label}: {getattr(e, 'strerror', None) or e}") from None
    if kind is not None:
        raise InputError(
            f"{src.label} is {kind}-compressed; decompress it first (Parquet compresses its own pages)"
        )
    if head.startswith(PARQUET_MAGIC) and b"\0" in head:  # a review may begin with "PAR1"; no NUL
        raise InputError(
            f"{src.label} is a Parquet file, not {_FORMAT_NAMES.get(src.format, src.format)}; pass "
            "--input-format parquet (or leave --input-format auto with a .parquet name)"
        )
    if not utf8:
        return
    for bom, name in _OTHER_BOMS:
        if head.startswith(bom):
            raise InputError(
                f"{src.label} is {name} text (it starts with a {name} byte-order mark); bertattn reads UTF-8: "
                f"convert it first, e.g. iconv -f {name} -t UTF-8"
            )
    if (name := _utf16_without_bom(head)) is not None:
        raise InputError(
            f"{src.label} looks like {name} text without a byte-order mark (every other byte is NUL); "
            f"bertattn reads UTF-8: convert it first (iconv -f {name} -t UTF-8) or pass --encoding {name.lower()}"
        )


#: The bytes a Parquet file starts with (then binary page headers): read as lines, one would be rows
#: of binary garbage.
PARQUET_MAGIC = b"PAR1"
_FORMAT_NAMES = {"csv": "CSV", "tsv": "TSV", "jsonl": "JSON lines", "text": "plain text"}
#: Bytes at a file's start in which UTF-16 without a byte-order mark is looked for.
UTF16_SAMPLE_BYTES = 64


def _utf16_without_bom(head: bytes) -> str | None:
    """``UTF-16LE`` or ``UTF-16BE`` where most of one parity of ``head``'s bytes are NUL and few of the
    other (ASCII spelt in UTF-16), else None: such a file is valid UTF-8, of NUL-interleaved text."""
    if len(head) < 16:
        return None
    even, odd = head[0::2].count(0) / len(head[0::2]), head[1::2].count(0) / len(head[1::2])
    if odd >= 0.6 and even <= 0.1:
        return "UTF-16LE"
    if even >= 0.6 and odd <= 0.1:
        return "UTF-16BE"
    return None


def _check_columns(src: Source, wanted: list[str]) -> None:
    names = _column_names(src)
    if names is None:
        return
    repeated = [c for c in wanted if names.count(c) > 1]
    if repeated:
        raise InputError(
            f"{src.label}: column {', '.join(map(repr, repeated))} appears more than once; rename the copies"
        )
    missing = [c for c in wanted if c not in names]
    if missing:
        # a name with spaces around it (a header written "id, text"), or none, is shown quoted
        shown = ", ".join(repr(n) if n != n.strip() or not n else n for n in names) or "(none)"
        spaced = [n for n in names if n != n.strip() and n.strip() in {c.strip() for c in missing}]
        hint = (
            f" (give {spaced[0]!r} with its spaces, quoted)"
            if spaced
            else _delimiter_hint(src, names, wanted)
        )
        raise InputError(
            f"{src.label}: no column {', '.join(repr(c) for c in missing)}; columns there: {shown}{hint}"
        )


def _delimiter_hint(src: Source, names: list[str], wanted: list[str]) -> str:
    """Where the header's one field splits into the wanted columns at another character: say so."""
    if src.format not in ("csv", "tsv") or len(names) != 1:
        return ""
    for sep in (";", "\t", "|", ",", ":"):
        if sep != src.sep and set(wanted) <= set(names[0].split(sep)):
            shown = "'\\t'" if sep == "\t" else repr(sep)
            return f" (the header looks {shown}-separated: pass --delimiter {shown})"
    return ""


def _column_names(src: Source) -> list[str] | None:
    """Column names without reading the data (None where a format has no header)."""
    try:
        if src.format == "parquet":
            with src.arrow_file() as f:
                return pq.read_schema(f).names
        if src.format in ("csv", "tsv"):
            return csv_header(src)
        if src.format == "text":
            return [TEXT_FILE_COLUMN]
        if src.format == "datasets":
            return list(load_dataset(src.path).column_names)
        if src.format == "jsonl":
            return json_keys(src)
    except (pa.ArrowInvalid, csv.Error, *READ_ERRORS) as e:
        raise InputError(f"{src.label}: cannot read as {src.format}: {first_line(e)}") from None
    raise InputError(f"unknown input format {src.format!r}")
