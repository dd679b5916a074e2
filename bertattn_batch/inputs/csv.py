"""CSV and TSV inputs: every wanted column read as bytes, a row of the wrong field count kept in place.

A row with more or fewer fields than the header keeps its place with the status ``wrong_field_count``
(which value is which is unknown); a quoted value may hold line breaks, kept byte for byte.
"""

from __future__ import annotations

import codecs
import csv
import io
from collections import deque
from collections.abc import Iterator
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.csv as pcsv

from ..errors import InputError
from .discover import Source
from .rows import WRONG_FIELD_COUNT

#: Bytes of a CSV file that Arrow parses at a time; a file with a row longer than that is read again in
#: blocks four times larger, up to CSV_MAX_BLOCK_BYTES (Arrow's blocks must hold any row that crosses one).
CSV_BLOCK_BYTES = 1 << 22
CSV_MAX_BLOCK_BYTES = 1 << 30


#: How far into a CSV file its header line is looked for, past empty lines.
HEADER_SCAN_BYTES = 1 << 20


def csv_options(src: Source, wanted: list[str]) -> tuple[pcsv.ParseOptions, pcsv.ConvertOptions]:
    """How CSV and TSV files are parsed, for every engine.

    Every wanted column is read as bytes, so that one row of invalid UTF-8 becomes that row's status.
    An empty cell is a missing value; a quoted "" is an empty string.
    """
    parse = pcsv.ParseOptions(delimiter=src.sep, newlines_in_values=True)
    convert = pcsv.ConvertOptions(
        include_columns=wanted,
        column_types={c: pa.binary() for c in wanted},
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )
    return parse, convert


def read_csv(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    """A CSV or TSV file's rows. A row with more or fewer fields than the header keeps its place, with
    the status ``wrong_field_count``: which value is which is unknown."""
    if not csv_header(src):  # an empty file, or empty lines only
        return
    with src.open() as f:
        head = f.read(1 << 16)
    if len(head) < 1 << 16:  # a header and no rows: Arrow refuses one without its newline
        body = head.removeprefix(codecs.BOM_UTF8).strip(b"\r\n")
        if b"\n" not in body and b"\r" not in body:
            return
    parse, convert = csv_options(src, wanted)
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
                    values.extend([WRONG_FIELD_COUNT] * k)
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
            with src.open() as f:
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


def csv_header(src: Source) -> list[str] | None:
    """The fields of a CSV file's first line that is not empty, which is where Arrow's reader takes the
    header from (it skips empty lines); None for a file of empty lines only (no rows).

    Parsed with the ``csv`` module: reading a header through ``pyarrow.csv.open_csv`` in a process that
    also runs polars' streaming engine can abort the interpreter at exit.
    """
    with src.open() as f:
        head = f.read(HEADER_SCAN_BYTES)
        more = bool(f.read(1))
    lines = head.removeprefix(codecs.BOM_UTF8).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    if more:
        lines.pop()  # may be cut short
    for line in lines:
        if line:
            return next(csv.reader([line.decode("utf-8", errors="replace")], delimiter=src.sep))
    if more:
        raise InputError(f"{src.label}: no header line in its first {HEADER_SCAN_BYTES >> 20} MB")
    return None
