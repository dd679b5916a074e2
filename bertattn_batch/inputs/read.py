"""Check the inputs (names, headers, first bytes: before a model loads), then stream their rows in order,
numbered from 0 across inputs, each with a doc id, text, label and status (:func:`to_rows`)."""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from itertools import islice
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..config import InputSpec, inside
from ..errors import InputError, first_line
from .discover import expand_inputs
from .files import READ_ERRORS, Source, check_bytes
from .formats import FORMATS, UNDECODABLE, Row, Unreadable, some

log = logging.getLogger(__name__)

BLOCK_ROWS = 4096


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


def wanted_columns(spec: InputSpec) -> list[str]:
    """The columns to read, text first, each once: one column may serve as both text and id."""
    for what, name in (("text", spec.text_col), ("id", spec.id_col), ("label", spec.label_col)):
        if name == "":
            raise InputError(f"the {what} column's name is empty; name a column (or leave the option out)")
    return list(dict.fromkeys(c for c in (spec.text_col, spec.id_col, spec.label_col) if c))


# -- checks ----------------------------------------------------------------------------------------------
def check_inputs(spec: InputSpec, out: str | Path | None = None) -> list[Source]:
    """The sources, each found, readable as its format, with the wanted columns, none inside ``out``."""
    sources = expand_inputs(spec)
    wanted = wanted_columns(spec)
    for src in sources:
        if out and inside(src.path, out):
            if inside(out, src.path):  # the same path
                raise InputError(f"--out {out} is the input {src.label}; give a folder for the run")
            raise InputError(f"input {src.label} lies inside the run directory {out}; choose another --out")
        check_bytes(src)
        _check_columns(src, wanted)
    return sources


def _check_columns(src: Source, wanted: list[str]) -> None:
    try:
        names = FORMATS[src.format].columns(src)
    except (pa.ArrowInvalid, csv.Error, *READ_ERRORS) as e:
        raise InputError(f"{src.label}: cannot read as {src.format}: {first_line(e)}") from None
    if names is None:
        return
    if repeated := [c for c in wanted if names.count(c) > 1]:
        raise InputError(
            f"{src.label}: column {', '.join(map(repr, repeated))} appears more than once; rename the copies"
        )
    if missing := [c for c in wanted if c not in names]:
        # a name with spaces around it (a header written "id, text"), or none, is shown quoted
        shown = ", ".join(repr(n) if n != n.strip() or not n else n for n in names) or "(none)"
        spaced = [n for n in names if n != n.strip() and n.strip() in {c.strip() for c in missing}]
        hint = (
            f" (give {spaced[0]!r} with its spaces, quoted)"
            if spaced
            else _delimiter_hint(src, names, wanted)
        )
        raise InputError(
            f"{src.label}: no column {', '.join(map(repr, missing))}; columns there: {shown}{hint}"
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


# -- reading ---------------------------------------------------------------------------------------------
def read_rows(spec: InputSpec, block_rows: int = BLOCK_ROWS) -> Iterator[RowBatch]:
    yield from read_sources(check_inputs(spec), spec, block_rows)


def read_sources(
    sources: Iterable[Source], spec: InputSpec, block_rows: int = BLOCK_ROWS
) -> Iterator[RowBatch]:
    """:func:`read_rows` over sources :func:`check_inputs` gave."""
    wanted, limit = wanted_columns(spec), spec.limit
    id_at, label_at = (wanted.index(c) if c else None for c in (spec.id_col, spec.label_col))
    row = 0
    for src in sources:
        if limit is not None and row >= limit:
            return
        ragged: list[int] = []  # the first few rows of the wrong field count, and how many
        count = 0
        rows = read_values(src, wanted, block_rows)
        try:
            while block := list(islice(rows, block_rows if limit is None else min(block_rows, limit - row))):
                batch = to_rows(block, row, id_at, label_at)
                bad = [row + i for i, s in enumerate(batch.status) if s == "wrong_field_count"]
                count += len(bad)
                ragged += bad[: 5 - len(ragged)]
                yield batch
                row += len(block)
        finally:  # also when the reading stops early
            rows.close()
            if count:
                have = "1 row has" if count == 1 else f"{count} rows have"
                log.warning("%s: %s another number of fields than the header (%s); recorded with status "
                            "wrong_field_count", src.label, have, some(ragged, count, "row"))  # fmt: skip


def read_values(src: Source, wanted: list[str], block_rows: int = BLOCK_ROWS) -> Iterator[Row]:
    try:
        yield from FORMATS[src.format].read(src, wanted, block_rows)
    except (pa.ArrowInvalid, *READ_ERRORS) as e:
        raise InputError(f"{src.label}: cannot read as {src.format}: {first_line(e)}") from None


def count_rows(sources: Iterable[Source]) -> int | None:
    """Total rows where the formats record them (Parquet, datasets) without reading data; else None."""
    total = 0
    for src in sources:
        if (rows := FORMATS[src.format].rows) is None:
            return None
        total += rows(src)
    return total


# -- the row rule ----------------------------------------------------------------------------------------
def to_rows(rows: list[Row], first_row: int, id_at: int | None, label_at: int | None) -> RowBatch:
    """``rows`` (text first, id and label at ``id_at``, ``label_at``) numbered from ``first_row``: the one
    place that decides a row's text, id, label and status."""
    out = RowBatch(list(range(first_row, first_row + len(rows))))
    doc_ids, texts, labels, statuses = out.doc_id, out.text, out.label, out.status
    for row, values in enumerate(rows, first_row):
        if isinstance(values, Unreadable):
            text, status, doc_id, label = None, values.status, str(row), None
        else:
            text, status = _as_text(values[0])
            doc_id, raw = str(row), None if id_at is None else values[id_at]
            if id_at is not None and _is_null(raw):  # a doc id is the row number exactly when null_id
                status = "null_id"
            elif raw is not None:
                doc_id = _to_str(raw)
            # a label's surrounding spaces are a spreadsheet's ('positive '), and a blank one is no class
            raw = None if label_at is None else values[label_at]
            label = None if _is_null(raw) else _to_str(raw).strip() or None
        doc_ids.append(doc_id)
        texts.append(text)
        labels.append(label)
        statuses.append(status)
    return out


def _is_null(value: Any) -> bool:
    """None, or a float NaN (how pandas writes a missing number)."""
    return value is None or value is UNDECODABLE or (isinstance(value, float) and math.isnan(value))


#: A backslash escape of a byte, as the ids of bytes that are not UTF-8 are spelled, or of a lone
#: surrogate (``\ud800``), as a JSON text may hold one that stands for no byte.
_BYTE_ESCAPE = re.compile(r"\\x[0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
#: Lone surrogates that do not stand for an undecodable byte (those are U+DC80..U+DCFF).
_LONE_SURROGATE = re.compile("([\ud800-\udc7f\udd00-\udfff])")


def _to_str(value: Any) -> str:
    """An id or label as text, one-to-one: a byte not UTF-8 as ``\\xff``, a lone surrogate as ``\\ud800`` (a
    text spelling such an escape gets its backslashes doubled), numbers and booleans as JSON spells them."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="surrogateescape")
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool):  # as JSON and CSV spell it, so a label reads alike from every format
        return "true" if value else "false"
    elif isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    elif isinstance(value, (dict, list, tuple)):  # a JSON object or array, a Parquet struct or list
        text = json.dumps(value, ensure_ascii=False, default=str)
    else:
        text = str(value)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # surrogates: bytes that are not UTF-8, or a JSON "\ud800" escape
            return "".join(
                f"\\u{ord(piece):04x}"
                if _LONE_SURROGATE.fullmatch(piece)
                # backslashes doubled (no byte of a multi-byte character is one), then each byte as \xNN
                else piece.encode("utf-8", "surrogateescape")
                .replace(b"\\", b"\\\\")
                .decode("utf-8", "backslashreplace")
                for piece in _LONE_SURROGATE.split(text)
            )
    return text.replace("\\", "\\\\") if "\\" in text and _BYTE_ESCAPE.search(text) else text


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
    return value, "ok" if value.strip() else "empty_text"
