"""The row rule: a source's raw values become rows with a doc id, a text, a label and a status.

Usage::

    batch = to_rows({"text": [...], "id": [...]}, first_row=0, n=3, text_col="text", id_col="id",
                    label_col=None)
    batch.row_index, batch.doc_id, batch.text, batch.label, batch.status

Rows that cannot be read as text (a number, invalid UTF-8, a lone surrogate) keep their place with a
status, never dropped; so do a JSON line that is no JSON object (``not_json``) and a CSV row with
more or fewer fields than its header (``wrong_field_count``): readers mark those with the markers here.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import InputError


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
NOT_JSON = _Unreadable("NOT_JSON", "not_json")


#: A CSV or TSV row with more or fewer fields than the header: which value is which is unknown.
WRONG_FIELD_COUNT = _Unreadable("WRONG_FIELD_COUNT", "wrong_field_count")


#: A value nested in a list or struct that holds bytes that are not UTF-8: as text its status is
#: ``invalid_utf8``; as an id or a label it counts as missing.
UNDECODABLE = _Marker("UNDECODABLE")


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
        for name in _FIELDS:
            getattr(self, name).extend(getattr(other, name))

    def slice(self, start: int, end: int) -> RowBatch:
        return RowBatch(*(getattr(self, name)[start:end] for name in _FIELDS))


_FIELDS = ("row_index", "doc_id", "text", "label", "status")


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
        # a label's surrounding spaces are a spreadsheet's, not a class of its own ('positive '), and a
        # blank one is no label: a class named '' would be trained, counted and reported
        label = None if _is_null(raw_label) else _to_str(raw_label).strip() or None
        batch.append(first_row + i, doc_id, text, label, status)
    return batch


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

    Bytes that are not UTF-8 are written with each such byte as an escape (``\\xff``) and each backslash
    of theirs doubled; a lone surrogate that stands for no byte (JSON's ``"\\ud800"``) as ``\\ud800``;
    a text that itself holds such an escape (the four characters ``\\xff``) has its backslashes doubled
    too. So an escape after an odd run of backslashes always stands for a byte or a surrogate, and every
    other text is itself. Numbers are spelled as JSON spells them (a whole float without
    its ``.0``: ``1``, ``1e+300``), booleans ``true``/``false``, as CSV cells read.
    """
    if isinstance(value, bytes):
        try:
            return _plain(value.decode("utf-8"))
        except UnicodeDecodeError:
            return _escaped(value)
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
        except UnicodeEncodeError:  # surrogates: bytes a JSONL line could not decode, or a "\ud800" escape
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
    """Bytes that are not all UTF-8: backslashes doubled, then each undecodable byte as ``\\xNN`` (no
    byte of a multi-byte UTF-8 character is a backslash, so doubling them first is safe)."""
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
        return UNDECODABLE
