"""The row rule: a source's raw values become rows with a doc id, a text, a label and a status.

Usage::

    batch = to_rows({"text": [...], "id": [...]}, first_row=0, n=3, text_col="text", id_col="id",
                    label_col=None)
    batch.row_index, batch.doc_id, batch.text, batch.label, batch.status

A row that cannot be read as text keeps its place with a status, never dropped; so does a row a reader
could not read as a row at all (a JSON line that is no object, a CSV row of the wrong field count).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import InputError


class Unreadable:
    """The value of every wanted column of a row a reader could not read as a row: ``status`` says why;
    its doc id is its row number (there is no id to read)."""

    def __init__(self, status: str) -> None:
        self.status = status


#: A JSON line or array element that is not a JSON object.
NOT_JSON = Unreadable("not_json")
#: A CSV or TSV row with more or fewer fields than the header: which value is which is unknown.
WRONG_FIELD_COUNT = Unreadable("wrong_field_count")
#: A value nested in a list or struct holding bytes that are not UTF-8: as text ``invalid_utf8``, as
#: an id or label missing.
UNDECODABLE = object()


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

    def extend(self, other: RowBatch) -> None:
        for f in fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))

    def slice(self, start: int, end: int) -> RowBatch:
        return RowBatch(*(getattr(self, f.name)[start:end] for f in fields(self)))


def wanted_columns(text_col: str, id_col: str | None, label_col: str | None) -> list[str]:
    """The columns to read, text first, each once: one column may serve as both text and id."""
    for what, name in (("text", text_col), ("id", id_col), ("label", label_col)):
        if name == "":
            raise InputError(f"the {what} column's name is empty; name a column (or leave the option out)")
    return list(dict.fromkeys(c for c in (text_col, id_col, label_col) if c))


def to_rows(
    cols: dict[str, list[Any]],
    first_row: int,
    n: int,
    text_col: str,
    id_col: str | None,
    label_col: str | None,
) -> RowBatch:
    """The first ``n`` values of each column as rows numbered from ``first_row``, with their statuses:
    the one place that decides a row's text, id, label and status, for every engine."""
    batch = RowBatch()
    for i in range(n):
        row = first_row + i
        if isinstance(unreadable := cols[text_col][i], Unreadable):
            batch.append(row, str(row), None, None, unreadable.status)
            continue
        text, status = _as_text(cols[text_col][i])
        doc_id = str(row)
        if id_col:
            raw_id = cols[id_col][i]
            if _is_null(raw_id):  # before any text problem: a doc id is the row number exactly when null_id
                status = "null_id"
            else:
                doc_id = _to_str(raw_id)
        raw_label = cols[label_col][i] if label_col else None
        # a label's surrounding spaces are a spreadsheet's ('positive '), and a blank one is no class
        label = None if _is_null(raw_label) else _to_str(raw_label).strip() or None
        batch.append(row, doc_id, text, label, status)
    return batch


def some(numbers: list[int], count: int, unit: str) -> str:
    """The first few of ``count`` numbers, as a warning names them: ``rows 2, 3, 4, 5, 6, ...``."""
    listed = ", ".join(map(str, numbers)) + (", ..." if count > len(numbers) else "")
    return f"{unit}{'s' if count > 1 else ''} {listed}"


def _is_null(value: Any) -> bool:
    """None, or a float NaN (how pandas writes a missing number)."""
    return value is None or value is UNDECODABLE or (isinstance(value, float) and math.isnan(value))


#: A backslash escape of a byte, as the ids of bytes that are not UTF-8 are spelled, or of a lone
#: surrogate (``\ud800``), as a JSON text may hold one that stands for no byte.
_BYTE_ESCAPE = re.compile(r"\\x[0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
#: Lone surrogates that do not stand for an undecodable byte (those are U+DC80..U+DCFF).
_LONE_SURROGATE = re.compile("([\ud800-\udc7f\udd00-\udfff])")


def _to_str(value: Any) -> str:
    """An id or label as text, one-to-one: two different values never get the same text, in any format.

    A byte that is not UTF-8 is written ``\\xff`` and a lone surrogate that stands for no byte (JSON's
    ``"\\ud800"``) ``\\ud800``; a text that itself spells such an escape has its backslashes doubled.
    Numbers are spelled as JSON spells them (``1``, ``1e+300``), booleans ``true``/``false``.
    """
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="surrogateescape")
    if isinstance(value, bool):  # as JSON and CSV spell it, so a label reads alike from every format
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    nested = isinstance(value, (dict, list, tuple))  # a JSON object or array, a Parquet struct or list
    text = json.dumps(value, ensure_ascii=False, default=str) if nested else str(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # surrogates: bytes that are not UTF-8, or a JSON "\ud800" escape
            return "".join(
                f"\\u{ord(piece):04x}"
                if _LONE_SURROGATE.fullmatch(piece)
                else _escaped(piece.encode("utf-8", errors="surrogateescape"))
                for piece in _LONE_SURROGATE.split(text)
            )
    return _plain(text)


def _plain(text: str) -> str:
    return text.replace("\\", "\\\\") if _BYTE_ESCAPE.search(text) else text


def _escaped(raw: bytes) -> str:
    """Bytes that are not all UTF-8: backslashes doubled (no byte of a multi-byte character is one),
    then each undecodable byte as ``\\xNN``."""
    return raw.replace(b"\\", b"\\\\").decode("utf-8", errors="backslashreplace")


def _as_text(value: Any) -> tuple[str | None, str]:
    """A cell as review text, with 'ok' or the reason it is not text."""
    if value is None:
        return None, "null_text"
    if value is UNDECODABLE:
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


#: Arrow's string types, each with the binary type of the same layout.
_AS_BINARY = {
    pa.string(): pa.binary(),
    pa.large_string(): pa.large_binary(),
    pa.string_view(): pa.binary_view(),
}


def column_values(column: pa.Array | pa.ChunkedArray) -> list[Any]:
    """A column's values as Python objects, its strings as bytes: Arrow does not check that a Parquet
    string holds UTF-8, so each is decoded on its own by :func:`to_rows` and a bad one is its row's status."""
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
        return UNDECODABLE
