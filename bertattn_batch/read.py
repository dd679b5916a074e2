"""Stream review rows from Parquet, JSONL, CSV/TSV, plain-text files and saved ``datasets``.
JSONL, CSV/TSV and text files may be compressed on their own (``reviews.jsonl.gz``; gzip, bzip2, zstd,
lz4, xz): they are decompressed as they are read.

Usage::

    for batch in read_rows(["reviews/*.parquet"], text_col="text", id_col="id"):
        batch.doc_id, batch.text, batch.label, batch.status

Memory stays bounded whatever the corpus size: every format is read in blocks. Rows that cannot be
read as text (a number, invalid UTF-8, a lone surrogate) are yielded with a status, never dropped, and
so is a JSON line that is not a JSON object (``not_json``, after a warning that names its line) and a CSV
row with more or fewer fields than the header (``wrong_field_count``, after a warning). A file
whose first line is not a JSON object is no JSON lines file at all (a JSON array, a CSV named .json): it
stops the job with its file and line number.
"""

from __future__ import annotations

import codecs
import csv
import glob
import hashlib
import io
import itertools
import json
import logging
import math
import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from .compressed import (
    ARCHIVE_SUFFIXES,
    READ_ERRORS,
    check_not_archive,
    compression_of,
    format_suffix,
    open_binary,
)
from .errors import InputError, first_line
from .write import MANIFEST

log = logging.getLogger(__name__)

BLOCK_ROWS = 4096
#: Bytes at each end of an input file whose hash tells a rewritten file from a copy (source_files).
ENDS_BYTES = 1 << 16
#: Bytes of a CSV file that Arrow parses at a time; a file with a row longer than that is read again in
#: blocks four times larger, up to CSV_MAX_BLOCK_BYTES (Arrow's blocks must hold any row that crosses one).
CSV_BLOCK_BYTES = 1 << 22
CSV_MAX_BLOCK_BYTES = 1 << 30
#: How far into a CSV file its header line is looked for, past empty lines.
HEADER_SCAN_BYTES = 1 << 20
_EXTENSIONS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "tsv",
    ".txt": "text",
    ".text": "text",
}
#: Text column name for plain-text inputs (one review a line).
TEXT_FILE_COLUMN = "text"


class _Marker:
    """A value that stands for no value read. Pickled by its name, so that it is the same object again
    in another process (a Ray task reads files with this module's readers)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> str:
        return self.name


class _Unreadable(_Marker):
    """The value of every wanted column of a row that could not be read as a row: its status says why,
    and its doc id is its row number (there is no id to read)."""

    def __init__(self, name: str, status: str) -> None:
        super().__init__(name)
        self.status = status


#: A JSON line that is not a JSON object.
_NOT_JSON = _Unreadable("_NOT_JSON", "not_json")
#: A CSV or TSV row with more or fewer fields than the header: which value is which is unknown.
_WRONG_FIELD_COUNT = _Unreadable("_WRONG_FIELD_COUNT", "wrong_field_count")
#: A value nested in a list or struct that holds bytes that are not UTF-8: as text its status is
#: ``invalid_utf8``; as an id or a label it counts as missing.
_UNDECODABLE = _Marker("_UNDECODABLE")


@dataclass
class RowBatch:
    """A block of source rows; ``status`` is 'ok' or why a row cannot be scored."""

    row_index: list[int] = field(default_factory=list)
    doc_id: list[str] = field(default_factory=list)
    text: list[str | None] = field(default_factory=list)
    label: list[str | None] = field(default_factory=list)
    status: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.row_index)

    def append(self, row: int, doc_id: str, text: str | None, label: str | None, status: str) -> None:
        self.row_index.append(row)
        self.doc_id.append(doc_id)
        self.text.append(text)
        self.label.append(label)
        self.status.append(status)


@dataclass(frozen=True)
class Source:
    path: Path
    format: str


def expand_inputs(inputs: Iterable[str], input_format: str = "auto") -> list[Source]:
    """Resolve files, globs and folders to an ordered list of sources; raise when nothing matches."""
    sources: list[Source] = []
    for spec in inputs:
        globbed = glob.has_magic(spec) and not Path(spec).exists()  # a file named 'x[1].csv' is that file
        matches = sorted(glob.glob(spec, recursive=True)) if globbed else [spec]
        if not matches:
            raise InputError(f"no input matches {spec!r}")
        for m in matches:
            p = Path(m)
            if not p.exists():
                raise InputError(f"input not found: {p}")
            if p.is_dir() and input_format in ("auto", "datasets") and _is_saved_dataset(p):
                sources.append(Source(p, "datasets"))
            elif p.is_dir():
                if _is_run_dir(p):
                    raise InputError(f"{p} is a bertattn run directory, not reviews")
                files = _review_files(p)
                if not files:
                    raise InputError(f"folder {p} holds no readable review files ({', '.join(_EXTENSIONS)})")
                sources.extend(Source(f, _format_of(f, input_format)) for f in files)
            else:
                sources.append(Source(p, _format_of(p, input_format)))
    return _once_each(sources)


def _once_each(sources: list[Source]) -> list[Source]:
    """Each file once, where it is first named: ``a.parquet data/*.parquet`` would otherwise read
    ``a.parquet`` twice (its rows doubled, or every repeat a ``duplicate_id``)."""
    seen: set[Path] = set()
    kept = []
    for src in sources:
        key = src.path.resolve()
        if key in seen:
            if key not in _WARNED:  # once a process: the inputs are listed more than once
                _WARNED.add(key)
                log.warning("%s is named more than once in the inputs; it is read once", src.path)
            continue
        seen.add(key)
        kept.append(src)
    return kept


def _review_files(folder: Path) -> list[Path]:
    """Files below a folder with a review file's extension, in path order. Names starting with ``_`` or
    ``.`` (temporary and hidden files) are passed over below the folder, and so are run directories and
    model folders: a run or a model written inside its input folder must not be read as input next."""
    found, others = [], []
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(("_", ".")) and not _is_run_dir(here / d) and not _is_model_dir(here / d)
        ]
        for f in (here / name for name in files if not name.startswith(("_", "."))):
            (found if format_suffix(f) in _EXTENSIONS else others).append(f)
    packed = sorted(f for f in others if _is_packed_reviews(f))
    if packed:  # reviews that would otherwise be left out without a word
        raise InputError(
            f"folder {folder} holds archives of review files ({_some(packed)}); extract them first "
            "(a file compressed on its own, such as reviews.jsonl.gz, is read as it is)"
        )
    if others and folder not in _WARNED:  # once a process: the inputs are listed more than once
        _WARNED.add(folder)
        log.warning(
            "folder %s: passed over %d file(s) that are not review files (%s)",
            folder,
            len(others),
            _some(sorted(others)),
        )
    return sorted(found)


def _is_packed_reviews(path: Path) -> bool:
    """An archive of a review file, such as ``x.csv.zip`` (an archive of anything else is no review file)."""
    suffixes = [x.lower() for x in path.suffixes]
    return len(suffixes) > 1 and suffixes[-1] in ARCHIVE_SUFFIXES and suffixes[-2] in _EXTENSIONS


def _some(paths: list[Path]) -> str:
    return ", ".join(p.name for p in paths[:3]) + (", ..." if len(paths) > 3 else "")


def _is_run_dir(p: Path) -> bool:
    return (p / MANIFEST).is_file() and (p / "predictions").is_dir()


def _is_model_dir(p: Path) -> bool:
    """A model folder (its config.json is no JSON lines file), such as one finetune saved there."""
    return (p / "config.json").is_file() and any(
        (p / f).is_file() for f in ("model.safetensors", "pytorch_model.bin", "tokenizer.json")
    )


def _is_saved_dataset(p: Path) -> bool:
    return (p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file()


def _format_of(path: Path, input_format: str) -> str:
    if input_format != "auto":
        return input_format
    fmt = _EXTENSIONS.get(format_suffix(path))
    if fmt is None:
        raise InputError(
            f"cannot tell the format of {path} from its name; pass --input-format "
            f"(parquet, jsonl, csv, tsv, text, datasets)"
        )
    return fmt


def read_rows(
    inputs: Iterable[str],
    text_col: str = "text",
    id_col: str | None = None,
    label_col: str | None = None,
    input_format: str = "auto",
    limit: int | None = None,
    block_rows: int = BLOCK_ROWS,
) -> Iterator[RowBatch]:
    """Yield RowBatches over all inputs in order; ``row_index`` counts across inputs from 0."""
    sources = check_inputs(inputs, text_col, id_col, label_col, input_format)
    yield from read_sources(sources, text_col, id_col, label_col, limit, block_rows)


def read_sources(
    sources: Iterable[Source],
    text_col: str = "text",
    id_col: str | None = None,
    label_col: str | None = None,
    limit: int | None = None,
    block_rows: int = BLOCK_ROWS,
) -> Iterator[RowBatch]:
    """:func:`read_rows` over sources that :func:`check_inputs` already gave: a job checks its inputs
    before it loads a model, and need not walk its folders and read their headers twice."""
    wanted = wanted_columns(text_col, id_col, label_col)
    row = 0
    for src in sources:
        ragged = RaggedRows(src.path)
        try:
            for cols in read_columns(src, wanted, block_rows):
                n = len(cols[text_col])
                if limit is not None:
                    n = min(n, limit - row)
                if n > 0:
                    batch = to_rows(cols, row, n, text_col, id_col, label_col)
                    if "wrong_field_count" in batch.status:
                        ragged.note(wrong_field_count_runs(cols[text_col][:n], row))
                    yield batch
                    row += n
                if limit is not None and row >= limit:
                    return
        finally:  # also when the reading stops early (a limit, an interrupt)
            ragged.warn()


class RaggedRows:
    """The rows of one CSV file that got ``wrong_field_count``, for one warning that names the first
    few by their row numbers (their doc ids). Each engine notes them as it numbers the rows."""

    def __init__(self, path: Path) -> None:
        self.path, self.count, self.first = path, 0, []

    def note(self, runs: Iterable[tuple[int, int]]) -> None:
        """Rows ``[a, b)`` of each run got ``wrong_field_count``."""
        for a, b in runs:
            self.count += b - a
            self.first.extend(range(a, min(b, a + 5 - len(self.first))))

    def warn(self) -> None:
        if self.count:
            log.warning(
                "%s: %s another number of fields than the header (%s %s); recorded with status "
                "wrong_field_count",
                self.path,
                "1 row has" if self.count == 1 else f"{self.count} rows have",
                "row" if self.count == 1 else "rows",
                ", ".join(map(str, self.first)) + (", ..." if self.count > len(self.first) else ""),
            )


def wrong_field_count_runs(values: list[Any], first_row: int) -> list[tuple[int, int]]:
    """Runs ``[a, b)`` of the row numbers whose value (from :func:`read_columns`, whose row 0 is row
    ``first_row``) marks a CSV row with the wrong number of fields: a few numbers, even for a file of
    such rows only."""
    runs: list[tuple[int, int]] = []
    i = 0
    for ragged, group in itertools.groupby(values, key=lambda v: v is _WRONG_FIELD_COUNT):
        k = sum(1 for _ in group)
        if ragged:
            runs.append((first_row + i, first_row + i + k))
        i += k
    return runs


def check_inputs(
    inputs: Iterable[str],
    text_col: str = "text",
    id_col: str | None = None,
    label_col: str | None = None,
    input_format: str = "auto",
    out: str | Path | None = None,
) -> list[Source]:
    """The sources, once every one is found, readable as its format and has the wanted columns, and
    none inside the run directory ``out`` (which --overwrite would clear).

    Reads only names and headers, so a job can fail on a mistyped path or column at once, before it
    loads a model or creates its run directory.
    """
    sources = expand_inputs(inputs, input_format)
    wanted = wanted_columns(text_col, id_col, label_col)
    run = Path(out).resolve() if out else None
    for src in sources:
        if run is not None and run in src.path.resolve().parents:
            raise InputError(f"input {src.path} lies inside the run directory {out}; choose another --out")
        _check_bytes(src)
        _check_columns(src, wanted)
    return sources


def source_files(sources: Iterable[Source]) -> list[dict[str, Any]]:
    """Each source as it was expanded, in reading order, with its size in bytes, its modification time
    and a hash of its first and last ``ENDS_BYTES`` (a saved dataset: over all its files).

    Why: row numbers count across the sources, so a resume must know whether a folder or glob gained
    a file, or a file changed, since the rows it skips were committed. An export rewritten in another
    row order keeps its size but not its time, nor (almost surely) its first rows or Parquet footer;
    a copy of the same file keeps its bytes but not its time.
    """
    out = []
    for src in sources:
        p = src.path
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        stats = [f.stat() for f in files]
        digest = hashlib.sha256()
        for f, st in zip(files, stats, strict=True):
            with open(f, "rb") as fh:
                digest.update(fh.read(ENDS_BYTES))
                if st.st_size > ENDS_BYTES:
                    fh.seek(max(ENDS_BYTES, st.st_size - ENDS_BYTES))
                    digest.update(fh.read(ENDS_BYTES))
        out.append(
            {
                "path": os.path.abspath(p),
                "bytes": sum(st.st_size for st in stats),
                "mtime_ns": max((st.st_mtime_ns for st in stats), default=0),
                "ends_sha256": digest.hexdigest(),
            }
        )
    return out


def wanted_columns(text_col: str, id_col: str | None, label_col: str | None) -> list[str]:
    """The columns to read, text first, each once: one column may serve as both text and id."""
    for what, name in (("text", text_col), ("id", id_col), ("label", label_col)):
        if name == "":
            raise InputError(f"the {what} column's name is empty; name a column (or leave the option out)")
    return list(dict.fromkeys(c for c in (text_col, id_col, label_col) if c))


def csv_options(fmt: str, wanted: list[str]) -> tuple[pcsv.ParseOptions, pcsv.ConvertOptions]:
    """How CSV and TSV files are parsed, for every engine.

    Every wanted column is read as bytes, so that one row of invalid UTF-8 becomes that row's status.
    An empty cell is a missing value; a quoted "" is an empty string.
    """
    parse = pcsv.ParseOptions(delimiter="\t" if fmt == "tsv" else ",", newlines_in_values=True)
    convert = pcsv.ConvertOptions(
        include_columns=wanted,
        column_types={c: pa.binary() for c in wanted},
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )
    return parse, convert


def to_rows(
    cols: dict[str, list[Any]],
    first_row: int,
    n: int,
    text_col: str,
    id_col: str | None,
    label_col: str | None,
) -> RowBatch:
    """The first ``n`` values of each column as rows numbered from ``first_row``, with their statuses.

    The one place that decides a row's text, id, label and status; every engine's reader calls it.
    """
    batch = RowBatch()
    for i in range(n):
        if isinstance(unreadable := cols[text_col][i], _Unreadable):
            batch.append(first_row + i, str(first_row + i), None, None, unreadable.status)
            continue
        text, status = _as_text(cols[text_col][i])
        doc_id = str(first_row + i)
        if id_col:
            raw_id = cols[id_col][i]
            if _is_null(raw_id):
                # before any text problem: a row's doc id is its row number exactly when its status is
                # null_id, which is how duplicate and incremental checks tell row numbers from ids
                status = "null_id"
            else:
                doc_id = _to_str(raw_id)
        raw_label = cols[label_col][i] if label_col else None
        label = None if _is_null(raw_label) else _to_str(raw_label)
        batch.append(first_row + i, doc_id, text, label, status)
    return batch


def _is_null(value: Any) -> bool:
    """None, or a float NaN (how pandas writes a missing number)."""
    return value is None or value is _UNDECODABLE or (isinstance(value, float) and math.isnan(value))


def _to_str(value: Any) -> str:
    """An id or label as text. Bytes that are not UTF-8 are written as escapes (``\\xff``), so two ids
    that differ only there stay two ids, spelled alike in every format."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    if isinstance(value, bool):  # as JSON and CSV spell it, so a label reads alike from every format
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    nested = isinstance(value, (dict, list, tuple))  # a JSON object or array, a Parquet struct or list
    text = json.dumps(value, ensure_ascii=False, default=str) if nested else str(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # surrogates: bytes a JSONL line could not decode, or a "\udc80" escape
            try:
                raw = text.encode("utf-8", errors="surrogateescape")
            except UnicodeEncodeError:
                raw = text.encode("utf-8", errors="surrogatepass")
            return raw.decode("utf-8", errors="backslashreplace")
    return text


def _as_text(value: Any) -> tuple[str | None, str]:
    """A cell as review text, with 'ok' or the reason it is not text."""
    if value is None:
        return None, "null_text"
    if value is _UNDECODABLE:
        return None, "invalid_utf8"
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None, "invalid_utf8"
    if not isinstance(value, str):
        return None, "not_text"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate, from a JSON escape such as "\udc80"
            return None, "invalid_utf8"
    if not value.strip():
        return value, "empty_text"
    return value, "ok"


def _check_columns(src: Source, wanted: list[str]) -> None:
    names = _column_names(src)
    if names is None:
        return
    repeated = [c for c in wanted if names.count(c) > 1]
    if repeated:
        raise InputError(
            f"{src.path}: column {', '.join(map(repr, repeated))} appears more than once; rename the copies"
        )
    missing = [c for c in wanted if c not in names]
    if missing:
        raise InputError(
            f"{src.path}: no column {', '.join(repr(c) for c in missing)}; "
            f"columns there: {', '.join(names) or '(none)'}"
        )


def _column_names(src: Source) -> list[str] | None:
    """Column names without reading the data (None where a format has no header)."""
    try:
        if src.format == "parquet":
            return pq.read_schema(src.path).names
        if src.format in ("csv", "tsv"):
            return _csv_header(src.path, "\t" if src.format == "tsv" else ",")
        if src.format == "text":
            return [TEXT_FILE_COLUMN]
        if src.format == "datasets":
            return list(_load_dataset(src.path).column_names)
        if src.format == "jsonl":
            return _first_json_keys(src.path)
    except (pa.ArrowInvalid, csv.Error, *READ_ERRORS) as e:
        raise InputError(f"{src.path}: cannot read as {src.format}: {first_line(e)}") from None
    raise InputError(f"unknown input format {src.format!r}")


def _csv_header(path: Path, delimiter: str) -> list[str] | None:
    """The fields of a CSV file's first line that is not empty, which is where Arrow's reader takes the
    header from (it skips empty lines); None for a file of empty lines only (no rows).

    Parsed with the ``csv`` module: reading a header through ``pyarrow.csv.open_csv`` in a process that
    also runs polars' streaming engine can abort the interpreter at exit.
    """
    with open_binary(path) as f:
        head = f.read(HEADER_SCAN_BYTES)
        more = bool(f.read(1))
    lines = head.removeprefix(codecs.BOM_UTF8).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    if more:
        lines.pop()  # may be cut short
    for line in lines:
        if line:
            return next(csv.reader([line.decode("utf-8", errors="replace")], delimiter=delimiter))
    if more:
        raise InputError(f"{path}: no header line in its first {HEADER_SCAN_BYTES >> 20} MB")
    return None


def _first_json_keys(path: Path) -> list[str] | None:
    """The keys of a JSON lines file's first object, which the reader checks too (later objects may
    omit keys); None for an empty file, or a first line the reader will name with its line number."""
    with open_binary(path) as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                obj = _json_line(raw)
            except json.JSONDecodeError:
                return None
            return list(obj) if isinstance(obj, dict) else None
    return None


def _json_line(raw: bytes) -> Any:
    """One JSON line's value. Bytes that are not UTF-8 become lone surrogates: the row keeps its id and
    label, and a text holding them gets the status invalid_utf8."""
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        return json.loads(raw.decode("utf-8", errors="surrogateescape"))


def read_columns(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    """One source's raw values of the ``wanted`` columns, in blocks of at most ``block_rows`` rows;
    :func:`to_rows` makes rows of them (``--engine ray`` calls this in a task per file)."""
    reader = {
        "parquet": _read_parquet,
        "csv": _read_csv,
        "tsv": _read_csv,
        "jsonl": _read_jsonl,
        "text": _read_text,
        "datasets": _read_datasets,
    }[src.format]
    try:
        yield from reader(src, wanted, block_rows)
    except (pa.ArrowInvalid, *READ_ERRORS) as e:
        raise InputError(f"{src.path}: cannot read as {src.format}: {first_line(e)}") from None


_WARNED: set[Path] = set()  # folders whose other files, and files named twice, a warning named


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
    try:
        check_not_archive(src.path)
        if src.format == "parquet":
            kind = compression_of(src.path)
        else:
            with open_binary(src.path) as f:
                head = f.read(4)
    except READ_ERRORS as e:
        raise InputError(f"cannot read {src.path}: {getattr(e, 'strerror', None) or e}") from None
    if kind is not None:
        raise InputError(
            f"{src.path} is {kind}-compressed; decompress it first (Parquet compresses its own pages)"
        )
    for bom, name in _OTHER_BOMS:
        if head.startswith(bom):
            raise InputError(
                f"{src.path} is {name} text (it starts with a {name} byte-order mark); bertattn reads UTF-8: "
                f"convert it first, e.g. iconv -f {name} -t UTF-8"
            )


#: Bytes read at a time from a Parquet column chunk. By default Arrow reads (pre-buffers) a row group's
#: whole column chunks at once: about 150 MB of text for a row group of a million reviews, pyarrow's
#: default row group size. Buffered reads without pre-buffering keep one block's worth in memory.
PARQUET_BUFFER_BYTES = 1 << 20


def _read_parquet(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    pf = pq.ParquetFile(src.path, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
    for rb in pf.iter_batches(batch_size=block_rows, columns=wanted):
        yield {c: column_values(rb.column(c)) for c in wanted}


#: Arrow's string types, each with the binary type of the same layout.
_AS_BINARY = {
    pa.string(): pa.binary(),
    pa.large_string(): pa.large_binary(),
    pa.string_view(): pa.binary_view(),
}


def column_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A column's values as Python objects, its strings as bytes.

    Arrow does not check that a Parquet string column holds UTF-8 (a file from another writer may not):
    decoding all of it at once would stop the job at one bad value. As bytes, each value is decoded on
    its own by :func:`to_rows`, and a bad one becomes that row's status.
    """
    kind = column.type
    if pa.types.is_dictionary(kind):  # a pandas categorical, say: its values, not their codes
        column = column.cast(kind.value_type)
        kind = column.type
    if kind in (pa.float32(), pa.float16()):  # as the narrow float prints (0.1), not as its double would
        narrow = np.float32 if kind == pa.float32() else np.float16
        return [None if v is None else float(str(narrow(v))) for v in column.to_pylist()]
    if kind in _AS_BINARY:
        column = column.cast(_AS_BINARY[kind])  # the same bytes: no copy, no check
    try:
        return column.to_pylist()
    except UnicodeDecodeError:  # a string nested in a list or struct: only the bad values are lost
        return [_decoded(v) for v in column]


def _decoded(value: pa.Scalar) -> Any:
    try:
        return value.as_py()
    except UnicodeDecodeError:
        return _UNDECODABLE


def _read_csv(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    """A CSV or TSV file's rows. A row with more or fewer fields than the header keeps its place, with
    the status ``wrong_field_count``: which value is which is unknown."""
    if not _column_names(src):  # an empty file, or empty lines only
        return
    with open_binary(src.path) as f:
        head = f.read(1 << 16)
    if len(head) < 1 << 16:  # a header and no rows: Arrow refuses one without its newline
        body = head.removeprefix(codecs.BOM_UTF8).strip(b"\r\n")
        if b"\n" not in body and b"\r" not in body:
            return
    parse, convert = csv_options(src.format, wanted)
    # Runs [first, end) of row numbers of the rows with the wrong number of fields, in order: runs, so
    # that a file of such rows only (a wrong delimiter), which Arrow returns no rows of, holds two numbers.
    ragged: deque[list[int]] = deque()

    recorded = 0  # one past the last ragged row recorded: a read again in larger blocks meets them again

    def skip_ragged(bad: pcsv.InvalidRow) -> str:
        nonlocal recorded
        if bad.number is None:  # Arrow numbers rows only when it parses on one thread
            return "error"
        number = bad.number - 2  # Arrow counts rows from 1, the header included
        if number < recorded:
            return "skip"
        recorded = number + 1
        if ragged and ragged[-1][1] == number:
            ragged[-1][1] += 1
        else:
            ragged.append([number, number + 1])
        return "skip"

    parse.invalid_row_handler = skip_ragged
    out: dict[str, list[Any]] = {c: [] for c in wanted}
    row = 0  # the row number of the next row to put in ``out``

    def place(cols: dict[str, list[Any]], n: int, last: bool = False) -> Iterator[dict[str, list[Any]]]:
        """Arrow's next ``n`` rows, with each ragged row among or right after them (all that are left,
        if ``last``) in its place; ``out``'s rows in blocks of ``block_rows``."""
        nonlocal out, row
        j = 0
        while True:
            if ragged and (ragged[0][0] <= row or last):
                k = min(ragged[0][1] - ragged[0][0], block_rows)
                for values in out.values():
                    values.extend([_WRONG_FIELD_COUNT] * k)
                ragged[0][0] += k
                if ragged[0][0] == ragged[0][1]:
                    ragged.popleft()
            elif j < n:
                k = n - j if not ragged else min(n - j, ragged[0][0] - row)
                for c, values in out.items():
                    values.extend(cols[c][j : j + k])
                j += k
            else:
                break
            row += k
            while len(out[wanted[0]]) >= block_rows:
                yield {c: values[:block_rows] for c, values in out.items()}
                out = {c: values[block_rows:] for c, values in out.items()}

    block, placed = CSV_BLOCK_BYTES, 0  # placed: Arrow's rows already in ``out`` or yielded
    while True:
        try:
            with open_binary(src.path) as f:
                reader = pcsv.open_csv(
                    _WholeLineBreaks(f),
                    read_options=pcsv.ReadOptions(block_size=block, use_threads=False),
                    parse_options=parse,
                    convert_options=convert,
                )
                seen = 0
                for rb in reader:  # Arrow's blocks are bytes, any number of rows
                    seen += rb.num_rows
                    if seen <= placed:  # placed before a read again in larger blocks
                        continue
                    rb = rb.slice(rb.num_rows - (seen - placed))
                    yield from place({c: rb.column(c).to_pylist() for c in wanted}, rb.num_rows)
                    placed = seen
            break
        except pa.ArrowInvalid as e:
            if "straddl" not in str(e) or block >= CSV_MAX_BLOCK_BYTES:
                raise
            block *= 4  # a row longer than a block: read again, on from the rows placed
    yield from place({}, 0, last=True)
    if out[wanted[0]]:
        yield out


class _WholeLineBreaks(io.RawIOBase):
    """A binary stream whose reads never end between the ``\\r`` and the ``\\n`` of a line break.

    Why: Arrow cuts its CSV blocks where a read of its input ends, and where a block ends between the two
    bytes of a ``\\r\\n`` inside a quoted value, Arrow's reader drops the ``\\n`` (pyarrow 26): the review
    would lose a character and every span after it would be off by one. A read that would end on
    ``\\r`` leaves it (with the byte after it) for the next read.
    """

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._held = b""

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            data, self._held = self._held + self._raw.read(), b""
            return data
        data = self._held + self._raw.read(max(1, size - len(self._held)))
        self._held = b""
        if data.endswith(b"\r"):
            after = self._raw.read(1)
            if len(data) > 1:
                data, self._held = data[:-1], b"\r" + after
            else:  # a read of one byte, "\r": give it with the byte after it, if that is no "\r"
                data += after
                if data.endswith(b"\r\r"):
                    data, self._held = data[:-1], b"\r"
        return data


def _read_jsonl(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    text_col = wanted[0]
    block: dict[str, list[Any]] = {c: [] for c in wanted}
    checked = False  # keys are checked on a file's first object; later ones may omit them
    bad, first_bad = 0, []  # lines that are no JSON object: how many, and the first few
    with open_binary(src.path) as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = _json_line(raw)
            except json.JSONDecodeError as e:
                obj = e
            if not isinstance(obj, dict):
                what = (
                    f"not JSON: {obj.msg} at character {obj.pos + 1}"
                    if isinstance(obj, json.JSONDecodeError)
                    else f"got {type(obj).__name__}"
                )
                if not checked:  # the file's first line: no JSON lines file at all
                    raise InputError(
                        f"{src.path}:{lineno}: expected a JSON object on each line ({what}); "
                        "is it JSON lines, one object a line?"
                    )
                bad += 1
                if len(first_bad) < 5:
                    first_bad.append(lineno)
                obj = dict.fromkeys(wanted, _NOT_JSON)
            elif not checked:
                missing = [c for c in wanted if c not in obj]
                if missing:
                    raise InputError(
                        f"{src.path}:{lineno}: no key {', '.join(repr(c) for c in missing)}; "
                        f"keys there: {', '.join(obj) or '(none)'}"
                    )
                checked = True
            for c in wanted:
                block[c].append(obj.get(c))
            if len(block[text_col]) >= block_rows:
                yield block
                block = {c: [] for c in wanted}
    if block[text_col]:
        yield block
    if bad:
        lines = ", ".join(map(str, first_bad)) + (", ..." if bad > len(first_bad) else "")
        log.warning(
            "%s: %s not a JSON object (%s); recorded with status not_json",
            src.path,
            "1 line is" if bad == 1 else f"{bad} lines are",
            f"line {lines}" if bad == 1 else f"lines {lines}",
        )


def _read_text(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    extra = [c for c in wanted if c != TEXT_FILE_COLUMN]
    if extra:
        raise InputError(
            f"{src.path}: a plain-text file has one column, {TEXT_FILE_COLUMN!r}; "
            f"it has no {', '.join(repr(c) for c in extra)}"
        )
    block: list[Any] = []
    with open_binary(src.path) as f:
        for i, raw in enumerate(f):
            if i == 0:  # an editor's byte-order mark is no part of the review
                raw = raw.removeprefix(codecs.BOM_UTF8)
            block.append(raw.rstrip(b"\r\n"))
            if len(block) >= block_rows:
                yield {TEXT_FILE_COLUMN: block}
                block = []
    if block:
        yield {TEXT_FILE_COLUMN: block}


def _load_dataset(path: Path) -> Any:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as e:
        raise InputError(f"{path}: not a saved datasets dataset: {first_line(e)}") from None
    if isinstance(ds, datasets.DatasetDict):
        splits = ", ".join(f"{path}/{s}" for s in ds)
        raise InputError(f"{path} holds several splits; name one: {splits}")
    return ds


def class_label_names(ds: Any) -> dict[str, list[str]]:
    """The names of a dataset's ``ClassLabel`` columns: their integers are ids, not the labels."""
    import datasets

    return {c: list(f.names) for c, f in ds.features.items() if isinstance(f, datasets.ClassLabel)}


def class_label_order(sources: Iterable[Source], column: str) -> list[str]:
    """The names of ``column``'s ``ClassLabel`` in id order, where every source is a saved dataset with
    that same ``ClassLabel`` (a classifier trained on them can then keep the dataset's ids); else none."""
    orders = {
        tuple(class_label_names(_load_dataset(src.path)).get(column, ())) if src.format == "datasets" else ()
        for src in sources
    }
    return list(orders.pop()) if len(orders) == 1 else []


def name_class_labels(table: pa.Table, names: dict[str, list[str]]) -> pa.Table:
    """Replace ``ClassLabel`` ids by their names (-1, a missing label, and other out-of-range ids become
    null), so that ``label`` compares with ``pred_label`` and a classifier trains on the real names."""
    for c, labels in names.items():
        if c in table.column_names:
            ids = table[c]
            valid = pc.and_(pc.greater_equal(ids, 0), pc.less(ids, len(labels)))
            named = pc.take(pa.array(labels, pa.string()), pc.if_else(valid, ids, None))
            table = table.set_column(table.column_names.index(c), c, named)
    return table


def _read_datasets(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    ds = _load_dataset(src.path).select_columns(wanted)
    names = class_label_names(ds)
    for table in ds.with_format("arrow").iter(batch_size=block_rows):  # memory-mapped: bounded memory
        table = name_class_labels(table, names)
        yield {c: column_values(table.column(c)) for c in wanted}


def count_rows(sources: Iterable[Source]) -> int | None:
    """Total rows where the formats record it (Parquet, datasets) without reading data; else None."""
    total = 0
    for src in sources:
        if src.format == "parquet":
            total += pq.ParquetFile(src.path).metadata.num_rows
        elif src.format == "datasets":
            total += _load_dataset(src.path).num_rows
        else:
            return None
    return total
