"""One reader a format: a source's rows in order, each a tuple of the wanted columns' raw values (strings
as bytes, or with lone surrogates where not UTF-8) or an :class:`Unreadable`; ``read.to_rows`` decides
the rest.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import io
import json
import logging
import re
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice, repeat
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from .. import storage
from ..errors import InputError, first_line
from .files import Source, json_lead

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unreadable:
    """A row a reader could not read as a row: ``status`` says why; its doc id is its row number."""

    status: str


NOT_JSON = Unreadable("not_json")
#: More or fewer fields than the header: which value is which is unknown.
WRONG_FIELD_COUNT = Unreadable("wrong_field_count")
#: A nested value holding bytes that are not UTF-8: as text ``invalid_utf8``, as an id or label missing.
UNDECODABLE = object()

Row = tuple[Any, ...] | Unreadable


class Format(NamedTuple):
    read: Callable[[Source, list[str], int], Iterator[Row]]  # rows, Arrow's read block_rows at a time
    columns: Callable[[Source], list[str] | None]  # without reading the data (None: none to tell)
    rows: Callable[[Source], int] | None = None  # where the format records its number of rows


def some(numbers: list[int], count: int, unit: str) -> str:
    """The first few of ``count`` numbers, as a warning names them: ``rows 2, 3, 4, 5, 6, ...``."""
    listed = ", ".join(map(str, numbers)) + (", ..." if count > len(numbers) else "")
    return f"{unit}{'s' if count > 1 else ''} {listed}"


# -- Arrow columns: Parquet and saved datasets -----------------------------------------------------------
#: Arrow's string types, each with the binary type of the same layout.
_AS_BINARY = {
    pa.string(): pa.binary(),
    pa.large_string(): pa.large_binary(),
    pa.string_view(): pa.binary_view(),
}
#: Bytes read at a time from a column chunk, where Arrow would pre-buffer a row group's whole chunks.
PARQUET_BUFFER_BYTES = 1 << 20


def column_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A column's values as Python objects, its strings as bytes: Arrow does not check that a Parquet
    string holds UTF-8, so each is decoded on its own and a bad one is its row's status."""
    if pa.types.is_dictionary(column.type):  # a pandas categorical, say: its values, not their codes
        column = column.cast(column.type.value_type)
    kind = column.type
    if kind in (pa.float32(), pa.float16()):  # as the narrow float prints (0.1), not as its double would
        narrow = np.float32 if kind == pa.float32() else np.float16
        return [None if v is None else float(str(narrow(v))) for v in column.to_pylist()]
    if kind in _AS_BINARY:
        column = column.cast(_AS_BINARY[kind])  # the same bytes: no copy, no check
    try:
        return column.to_pylist()
    except UnicodeDecodeError:  # a string nested in a list or struct: only the bad values are lost
        values = []
        for v in column:
            try:
                values.append(v.as_py())
            except UnicodeDecodeError:
                values.append(UNDECODABLE)
        return values


def read_parquet(src: Source, wanted: list[str], block_rows: int) -> Iterator[Row]:
    with storage.arrow_file(src.path) as f:
        pf = pq.ParquetFile(
            f, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False, page_checksum_verification=True
        )
        for rb in pf.iter_batches(batch_size=block_rows, columns=wanted):
            yield from zip(*(column_values(rb.column(c)) for c in wanted), strict=True)


def parquet_metadata(src: Source) -> pq.FileMetaData:
    with storage.arrow_file(src.path) as f:
        return pq.read_metadata(f)


def load_dataset(path: Path | str) -> Any:
    """A folder ``Dataset.save_to_disk`` wrote, memory-mapped."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as e:
        raise InputError(f"{path}: not a saved datasets dataset: {first_line(e)}") from None
    if isinstance(ds, datasets.DatasetDict):
        raise InputError(f"{path} holds several splits; name one: {', '.join(f'{path}/{s}' for s in ds)}")
    return ds


def class_label_names(ds: Any) -> dict[str, list[str]]:
    """The names of a dataset's ``ClassLabel`` columns, whose integers are ids, not labels."""
    import datasets

    return {c: list(f.names) for c, f in ds.features.items() if isinstance(f, datasets.ClassLabel)}


def class_label_order(sources: Iterable[Source], column: str) -> list[str]:
    """``column``'s ``ClassLabel`` names in id order where every source is a saved dataset with that same
    ``ClassLabel`` (a classifier trained on them keeps the dataset's ids), else none."""
    orders = {
        tuple(class_label_names(load_dataset(src.path)).get(column, ())) if src.format == "datasets" else ()
        for src in sources
    }
    return [name.strip() for name in orders.pop()] if len(orders) == 1 else []  # as labels are read


def read_datasets(src: Source, wanted: list[str], block_rows: int) -> Iterator[Row]:
    """A ``ClassLabel``'s ids are read as their names (out of range: null), to compare with ``pred_label``."""
    ds = load_dataset(src.path).select_columns(wanted)
    names = class_label_names(ds)
    for table in ds.with_format("arrow").iter(batch_size=block_rows):
        columns = []
        for c in wanted:
            ids = table.column(c)
            if (labels := names.get(c)) is not None:
                valid = pc.and_(pc.greater_equal(ids, 0), pc.less(ids, len(labels)))
                ids = pc.take(pa.array(labels, pa.string()), pc.if_else(valid, ids, None))
            columns.append(column_values(ids))
        yield from zip(*columns, strict=True)


# -- text ------------------------------------------------------------------------------------------------
def read_text(src: Source, wanted: list[str], block_rows: int) -> Iterator[Row]:
    """One review a line (universal newlines, as a CSV reader splits the same bytes), in column ``text``."""
    with io.TextIOWrapper(src.open(), encoding="utf-8-sig", errors="surrogateescape") as f:
        for line in f:
            yield (line.removesuffix("\n"),)


# -- CSV and TSV -----------------------------------------------------------------------------------------
#: Bytes Arrow parses at a time; a row longer than that is read again in blocks four times larger.
CSV_BLOCK_BYTES = 1 << 22
CSV_MAX_BLOCK_BYTES = 1 << 30
#: How far into a file its header line is looked for, past empty lines.
HEADER_SCAN_BYTES = 1 << 20
#: A quoted field's bytes after its opening quote, to its closing quote.
_REST = re.compile(rb'[^"]*+(?:""[^"]*+)*+"')


def read_csv(src: Source, wanted: list[str], block_rows: int) -> Iterator[Row]:
    """A row of another field count than the header is ``wrong_field_count`` in its place; quoted line breaks
    are kept byte for byte; an empty cell is missing, a quoted "" is empty."""
    header, rows_follow = _header(src)
    if header is None or not rows_follow:  # Arrow refuses a header without its newline
        return
    # Arrow skips rows of another field count; they are put back by number, kept as runs [first, end)
    ragged: deque[list[int]] = deque()
    recorded = 0  # one past the last ragged row recorded: a read again in larger blocks meets them again

    def skip_ragged(bad: pcsv.InvalidRow) -> str:
        nonlocal recorded
        if bad.number is None:  # Arrow numbers rows only when it parses on one thread
            return "error"
        number = bad.number - 2  # Arrow counts rows from 1, the header included
        if number >= recorded:
            recorded = number + 1
            if ragged and ragged[-1][1] == number:
                ragged[-1][1] += 1
            else:
                ragged.append([number, number + 1])
        return "skip"

    parse = pcsv.ParseOptions(delimiter=src.sep, newlines_in_values=True, invalid_row_handler=skip_ragged)
    convert = pcsv.ConvertOptions(
        include_columns=wanted,
        column_types=dict.fromkeys(wanted, pa.binary()),
        null_values=[""],  # an empty cell alone: "NA", "null" or "NaN" is a review's text or id
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )

    def arrow_rows(block: int) -> Iterator[tuple[Any, ...]]:
        read = pcsv.ReadOptions(block_size=block, use_threads=False)
        with src.open() as f:
            for rb in pcsv.open_csv(_CheckedBytes(f, src), read, parse, convert):
                yield from zip(*(rb.column(c).to_pylist() for c in wanted), strict=True)

    row = placed = 0  # rows yielded; of them, Arrow's (skipped when read again in larger blocks)
    block = CSV_BLOCK_BYTES
    while True:
        try:
            for values in islice(arrow_rows(block), placed, None):
                while ragged and ragged[0][0] <= row:
                    first, end = ragged.popleft()
                    row += end - first
                    yield from repeat(WRONG_FIELD_COUNT, end - first)
                row, placed = row + 1, placed + 1
                yield values
            break
        except pa.ArrowInvalid as e:
            if "straddl" not in str(e) or block >= CSV_MAX_BLOCK_BYTES:
                raise
            block *= 4  # a row longer than a block: read again, on from the rows placed
    for first, end in ragged:
        yield from repeat(WRONG_FIELD_COUNT, end - first)


class _CheckedBytes(io.RawIOBase):
    """A CSV file's bytes as Arrow reads them: a read never ends between a ``\\r\\n`` (Arrow drops the ``\\n``
    at a block's end inside a quoted value), and a quoted field that never closes, or spans lines and has
    more than the delimiter after its closing quote, is refused with its line (a stray ``"``)."""

    def __init__(self, raw: BinaryIO, src: Source) -> None:
        self._raw, self._held, self._src = raw, b"", src
        sep = re.escape(src.sep.encode())
        # bytes up to a quoted field that does not close in them or has more than sep or a line break after it
        self._fields = re.compile(
            rb'(?:[^"]++|(?<=[^%b\r\n])"|"%b(?![^%b\r\n]))*+' % (sep, _REST.pattern, sep)
        )
        self._unscanned = bytearray()  # read, after the last line break
        self._offset = 0  # of the first unscanned byte in the file
        self._open = -1  # where a quoted field that has not closed opens in the file (-1: none)

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            data, self._held = self._held + self._raw.read(), b""
        else:
            data, self._held = self._held + self._raw.read(max(1, size - len(self._held))), b""
            if data.endswith(b"\r"):
                after = self._raw.read(1)
                if len(data) > 1:
                    data, self._held = data[:-1], b"\r" + after
                else:  # a read of one byte, "\r": give it with the byte after it, if that is no "\r"
                    data += after
                    if data.endswith(b"\r\r"):
                        data, self._held = data[:-1], b"\r"
        self._scan(data)
        return data

    def _scan(self, data: bytes) -> None:
        if data and b"\n" not in data and b"\r" not in data:
            self._unscanned += data
            return
        buf = bytes(self._unscanned) + data
        end = max(buf.rfind(b"\n"), buf.rfind(b"\r")) + 1 if data else len(buf)
        self._unscanned = bytearray(buf[end:])
        start, i = self._offset, 0
        self._offset += end
        while i < end:
            if self._open >= 0:
                if (m := _REST.match(buf, i, end)) is None:
                    break
                i = m.end()
                crossed = self._open < start or re.search(rb"[\r\n]", buf[self._open - start : i])
                if crossed and buf[i : i + 1] not in b"\r\n" + self._src.sep.encode():
                    raise self._stray()
                self._open = -1
            i = self._fields.match(buf, i, end).end()
            if i < end:
                self._open, i = start + i, i + 1
        if self._open >= 0 and not data:
            raise self._stray()

    def _stray(self) -> InputError:
        line, before = 1, self._open
        with self._src.open() as f:  # the line it opens on, counted again
            for text in io.TextIOWrapper(f, "latin-1", newline=""):
                if (before := before - len(text)) < 0:
                    break
                line += 1
        return InputError(
            f"{self._src.label}, line {line}: a quoted field opens there that runs on over the lines after "
            'it (a stray "?); quote the field whole, doubling each " inside it'
        )


def _header(src: Source) -> tuple[list[str] | None, bool]:
    """The fields of the first line that is not empty (None: none), and whether a line follows it; by the
    ``csv`` module, as Arrow's reader in a process that runs polars' streaming engine can abort at exit."""
    with src.open() as f:
        head, more = f.read(HEADER_SCAN_BYTES), bool(f.read(1))
    lines = head.removeprefix(codecs.BOM_UTF8).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    if more:
        lines.pop()  # may be cut short
    for i, line in enumerate(lines):
        if line:
            fields = next(csv.reader([line.decode("utf-8", errors="replace")], delimiter=src.sep))
            return fields, more or any(lines[i + 1 :])
    if more:
        raise InputError(f"{src.label}: no header line in its first {HEADER_SCAN_BYTES >> 20} MB")
    return None, False


# -- JSON lines and JSON arrays --------------------------------------------------------------------------
#: Characters of a JSON array read at a time: an element is decoded once the buffer holds all of it.
ARRAY_CHUNK = 1 << 20
#: Characters after an element (or a decoding error) that tell it was not cut by the buffer's end.
_SLACK = 64
_SPACES = re.compile(r"[ \t\r\n]*")
#: Objects at the start of a JSON file whose keys tell its columns (objects may leave keys out).
KEY_SCAN_OBJECTS = 1000


class _Unparsed(Exception):
    """A value that may be valid JSON but that Python's JSON reader cannot read."""


def read_jsonl(src: Source, wanted: list[str], block_rows: int) -> Iterator[Row]:
    """JSON lines or one JSON array of objects; a key an object leaves out is missing, a value that is no
    object a ``not_json`` row."""
    counts: Counter[str] = Counter()  # of each reason a value is no row, and its first numbers
    firsts: dict[str, list[int]] = defaultdict(list)
    with src.open() as f:
        unit, values = json_values(f, src.label)
        for i, (number, obj) in enumerate(values):
            if isinstance(obj, dict):
                yield tuple(map(obj.get, wanted))
                continue
            if i == 0 and not isinstance(obj, _Unparsed):  # no JSON lines file at all
                what = (
                    f"not JSON: {obj.msg} at character {obj.pos + 1}"
                    if isinstance(obj, json.JSONDecodeError)
                    else f"got {type(obj).__name__}"
                )
                where = "on each line" if unit == "line" else "in each element of the array"
                hint = "; is it JSON lines, one object a line?" if unit == "line" else ""
                raise InputError(f"{src.label}:{number}: expected a JSON object {where} ({what}){hint}")
            why = str(obj) if isinstance(obj, _Unparsed) else "not a JSON object"
            counts[why] += 1
            if len(firsts[why]) < 5:
                firsts[why].append(number)
            yield NOT_JSON
    for why, count in counts.items():
        verb = f"1 {unit} is" if count == 1 else f"{count} {unit}s are"
        where = some(firsts[why], count, unit)
        log.warning("%s: %s %s (%s); recorded with status not_json", src.label, verb, why, where)


def json_values(f: BinaryIO, label: str) -> tuple[str, Iterator[tuple[int, Any]]]:
    """What the numbers count ("line" or "element"), and the values numbered from 1, each a value or the
    exception that reading it raised."""
    lead, blank = json_lead(f)
    if lead.lstrip().startswith(b"["):
        return "element", _array_elements(lead, f, label)
    lines = chain(io.BytesIO(lead + f.readline()), f)  # split at b"\n" alone, as a file's lines are
    return "line", ((n, _json_line(raw)) for n, raw in enumerate(lines, 1 + blank) if raw.strip())


def _json_line(raw: bytes) -> Any:
    """One JSON line's value, or the exception reading it raised; bytes not UTF-8 become lone surrogates."""
    try:
        return json.loads(raw.decode("utf-8", "surrogateescape").removeprefix("\ufeff"))
    except json.JSONDecodeError as e:
        return e
    except RecursionError:
        return _Unparsed("nested deeper than the JSON reader goes")  # about 1,000 levels
    except ValueError:  # int() refuses more digits than sys.get_int_max_str_digits()
        return _Unparsed("holding an integer longer than the JSON reader reads")


def _array_elements(lead: bytes, f: BinaryIO, label: str) -> Iterator[tuple[int, Any]]:
    """The elements of a JSON array whose text begins with ``lead``, decoded one at a time from a buffer of
    about ``ARRAY_CHUNK``; an element that is not JSON stops the read (where the next starts is unknown)."""
    decode = json.JSONDecoder().raw_decode
    text = codecs.getincrementaldecoder("utf-8")("surrogateescape")  # as a JSON line's bytes
    buf, pos, ended = text.decode(lead).lstrip()[1:], 0, False
    number, after_element = 0, False

    def more() -> None:  # at least as much again as the buffer holds: a long element costs linear time
        nonlocal buf, pos, ended
        chunk = f.read(max(ARRAY_CHUNK, len(buf) - pos))
        buf, pos, ended = buf[pos:] + text.decode(chunk, final=not chunk), 0, not chunk

    while True:
        pos = _SPACES.match(buf, pos).end()
        if pos == len(buf):
            if ended:
                raise InputError(
                    f"{label}: the JSON array ends without its closing ] (the file is cut short?)"
                )
            more()
        elif buf[pos] == "]" and (after_element or number == 0):
            break
        elif after_element:
            if buf[pos] != ",":
                raise InputError(f"{label}: expected , or ] after element {number} of the JSON array")
            pos, after_element = pos + 1, False
        else:
            try:
                value, end = decode(buf, pos)
            except json.JSONDecodeError as e:
                cut = e.msg.startswith("Unterminated") or e.pos >= len(buf.rstrip())
                if not ended and (cut or e.pos >= len(buf) - _SLACK):  # cut by the buffer ("tru"): read on
                    more()
                    continue
                if cut:
                    raise InputError(
                        f"{label}: the JSON array ends inside element {number + 1} (the file is cut short?)"
                    ) from None
                raise InputError(
                    f"{label}: element {number + 1} of the JSON array is not JSON ({e.msg})"
                ) from None
            except (RecursionError, ValueError):
                raise InputError(
                    f"{label}: element {number + 1} of the JSON array is nested deeper, "
                    "or holds an integer longer, than the JSON reader reads"
                ) from None
            if not ended and len(buf) - end < _SLACK:  # "1." of "1.5e3" decodes too: read on, decode it whole
                more()
                continue
            number, pos, after_element = number + 1, end, True
            yield number, value
    pos += 1
    while (pos := _SPACES.match(buf, pos).end()) == len(buf) and not ended:
        more()
    if pos < len(buf):
        raise InputError(
            f"{label}: text follows the JSON array's closing ] (one array a file, or JSON lines)"
        )


def json_keys(src: Source) -> list[str] | None:
    """Every key of the first ``KEY_SCAN_OBJECTS`` objects, in order of first sight (a column none has is a
    typo); None for an empty file, or a first value the reader will name with its number."""
    keys: dict[str, None] = {}
    seen = 0
    with src.open() as f, contextlib.suppress(InputError):  # an array the reader stops at, in its words
        for _, obj in json_values(f, src.label)[1]:
            if isinstance(obj, dict):
                keys.update(dict.fromkeys(obj))
                if (seen := seen + 1) >= KEY_SCAN_OBJECTS:
                    break
            elif not seen and not isinstance(obj, _Unparsed):  # a not_json row is no sign of a wrong format
                return None
    return list(keys) if seen else None


FORMATS = {
    "parquet": Format(
        read_parquet,
        lambda src: parquet_metadata(src).schema.to_arrow_schema().names,
        lambda src: parquet_metadata(src).num_rows,
    ),
    "csv": Format(read_csv, lambda src: _header(src)[0]),
    "tsv": Format(read_csv, lambda src: _header(src)[0]),
    "jsonl": Format(read_jsonl, json_keys),
    "text": Format(read_text, lambda src: ["text"]),
    "datasets": Format(
        read_datasets,
        lambda src: list(load_dataset(src.path).column_names),
        lambda src: int(load_dataset(src.path).num_rows),
    ),
}
