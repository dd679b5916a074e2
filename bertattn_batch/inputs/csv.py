"""CSV and TSV inputs, parsed by Arrow with every wanted column as bytes (one row of invalid UTF-8 is that
row's status). A row with more or fewer fields than the header keeps its place as ``wrong_field_count``;
a quoted value may hold line breaks, kept byte for byte; an empty cell is missing, a quoted "" is empty.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections import deque
from collections.abc import Iterator
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.csv as pcsv

from ..errors import InputError
from .files import Source
from .rows import WRONG_FIELD_COUNT

#: Bytes Arrow parses at a time; a row longer than that is read again in blocks four times larger, up
#: to CSV_MAX_BLOCK_BYTES (an Arrow block must hold every row that starts in it).
CSV_BLOCK_BYTES = 1 << 22
CSV_MAX_BLOCK_BYTES = 1 << 30
#: How far into a file its header line is looked for, past empty lines.
HEADER_SCAN_BYTES = 1 << 20
#: A quoted field's bytes after its opening quote, to its closing quote.
_REST = re.compile(rb'[^"]*+(?:""[^"]*+)*+"')


def read_csv(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    """A CSV or TSV file's rows in blocks of ``block_rows``."""
    header, rows_follow = _header(src)
    if header is None or not rows_follow:  # Arrow refuses a header without its newline
        return
    # Arrow skips the rows of another field count; they are put back by their numbers, kept as runs
    # [first, end) so that a file of such rows only (a wrong delimiter) holds a few numbers
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
        column_types={c: pa.binary() for c in wanted},
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )
    out: dict[str, list[Any]] = {c: [] for c in wanted}
    row = 0  # the row number of the next row put in ``out``

    def place(cols: dict[str, list[Any]], n: int, last: bool = False) -> Iterator[dict[str, list[Any]]]:
        """Arrow's next ``n`` rows with the ragged rows among them (all left, if ``last``) in their
        places, in blocks of ``block_rows``."""
        nonlocal out, row
        j = 0
        while True:
            room = block_rows - len(out[wanted[0]])
            if ragged and (ragged[0][0] <= row or last):
                k = min(ragged[0][1] - ragged[0][0], room)
                for values in out.values():
                    values.extend([WRONG_FIELD_COUNT] * k)
                ragged[0][0] += k
                if ragged[0][0] == ragged[0][1]:
                    ragged.popleft()
            elif j < n:
                k = min(n - j, room, ragged[0][0] - row if ragged else n)
                for c, values in out.items():
                    values.extend(cols[c][j : j + k])
                j += k
            else:
                return
            row += k
            if k == room:
                yield out
                out = {c: [] for c in wanted}

    block, placed = CSV_BLOCK_BYTES, 0  # placed: Arrow's rows already placed
    while True:
        try:
            with src.open() as f:
                read = pcsv.ReadOptions(block_size=block, use_threads=False)
                seen = 0
                for rb in pcsv.open_csv(_CheckedBytes(f, src), read, parse, convert):
                    seen += rb.num_rows
                    if seen > placed:  # not placed before a read again in larger blocks
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


class _CheckedBytes(io.RawIOBase):
    """A CSV file's bytes as Arrow reads them. A read never ends between the ``\\r`` and ``\\n`` of a line
    break: where an Arrow block ends there inside a quoted value, Arrow drops the ``\\n`` (pyarrow 26). A
    quoted field that never closes, or spans lines and has more than the delimiter or a line break after
    its closing quote, is refused with its line: Arrow reads the lines after such a stray ``"`` into it."""

    def __init__(self, raw: BinaryIO, src: Source) -> None:
        self._raw, self._held, self._src = raw, b"", src
        sep = re.escape(src.sep.encode())
        # bytes up to a quoted field that does not close in them or has more than sep or a line break after
        # it (a field that starts with a quote is quoted; a quote further in is a character)
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
        self._scan(data)
        return data

    def _scan(self, data: bytes) -> None:
        """Scan the bytes read up to the last line break; at the end of the file (``data`` empty), all."""
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
    """The fields of the first line that is not empty, where Arrow takes the header from (None for a file
    of empty lines only), and whether a line follows it. Parsed with the ``csv`` module: Arrow's reader in
    a process that also runs polars' streaming engine can abort the interpreter at exit."""
    with src.open() as f:
        head = f.read(HEADER_SCAN_BYTES)
        more = bool(f.read(1))
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


def csv_columns(src: Source) -> list[str] | None:
    return _header(src)[0]
