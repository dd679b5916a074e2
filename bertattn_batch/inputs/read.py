"""Check the inputs, then stream their review rows in order, numbered from 0 across all of them.

Usage::

    spec = InputSpec(["reviews/*.parquet"], id_col="id")
    sources = check_inputs(spec)                    # or InputError, one line
    for batch in read_sources(sources, spec):
        batch.doc_id, batch.text, batch.label, batch.status

The checks read only names, headers and first bytes, so a mistyped path or column fails before a model
loads. Every format is read in blocks (bounded memory); row numbers, ``limit`` and the warning that
names malformed CSV rows are decided here, once, for every engine.
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa

from ..config import InputSpec
from ..errors import InputError, first_line
from ..storage import is_remote
from .csv import csv_columns, read_csv
from .discover import expand_inputs
from .files import READ_ERRORS, Source, check_bytes
from .hf_datasets import datasets_columns, datasets_rows, read_datasets
from .jsonl import json_keys, read_jsonl
from .parquet import parquet_columns, parquet_rows, read_parquet
from .rows import RowBatch, some, to_rows, wanted_columns
from .text import read_text, text_columns

log = logging.getLogger(__name__)

BLOCK_ROWS = 4096


class Format(NamedTuple):
    #: one source's raw values of the wanted columns, in blocks of at most ``block_rows`` rows
    read: Callable[[Source, list[str], int], Iterator[dict[str, list[Any]]]]
    #: its column names without reading the data (None where there are none to tell)
    columns: Callable[[Source], list[str] | None]
    #: its number of rows where the format records it
    rows: Callable[[Source], int] | None = None


FORMATS = {
    "parquet": Format(read_parquet, parquet_columns, parquet_rows),
    "csv": Format(read_csv, csv_columns),
    "tsv": Format(read_csv, csv_columns),
    "jsonl": Format(read_jsonl, json_keys),
    "text": Format(read_text, text_columns),
    "datasets": Format(read_datasets, datasets_columns, datasets_rows),
}


def check_inputs(spec: InputSpec, out: str | Path | None = None) -> list[Source]:
    """The sources, once every one is found, readable as its format and has the wanted columns, and
    none inside the run directory ``out`` (which --overwrite would clear)."""
    sources = expand_inputs(spec.paths, spec.format, spec.encoding, spec.delimiter, spec.limit)
    wanted = wanted_columns(spec.text_col, spec.id_col, spec.label_col)
    for src in sources:
        if out and _inside(src.path, out):
            raise InputError(f"input {src.label} lies inside the run directory {out}; choose another --out")
        check_bytes(src)
        _check_columns(src, wanted)
    return sources


def _inside(path: Path | str, folder: str | Path) -> bool:
    if is_remote(path) or is_remote(folder):
        return os.fspath(path).startswith(os.fspath(folder).rstrip("/") + "/")
    return Path(folder).resolve() in Path(path).resolve().parents


def _check_columns(src: Source, wanted: list[str]) -> None:
    if src.format not in FORMATS:
        raise InputError(f"unknown input format {src.format!r}")
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


def read_rows(spec: InputSpec, block_rows: int = BLOCK_ROWS) -> Iterator[RowBatch]:
    """Yield RowBatches over all inputs in order; ``row_index`` counts across inputs from 0."""
    yield from read_sources(check_inputs(spec), spec, block_rows)


def read_sources(
    sources: Iterable[Source], spec: InputSpec, block_rows: int = BLOCK_ROWS
) -> Iterator[RowBatch]:
    """:func:`read_rows` over sources :func:`check_inputs` gave (a job checks them before its model loads)."""
    text_col, id_col, label_col, limit = spec.text_col, spec.id_col, spec.label_col, spec.limit
    wanted = wanted_columns(text_col, id_col, label_col)
    row = 0
    for src in sources:
        ragged: list[int] = []  # the first few rows of the wrong field count, and how many
        count = 0
        try:
            for cols in read_columns(src, wanted, block_rows):
                n = len(cols[text_col]) if limit is None else min(len(cols[text_col]), limit - row)
                if n > 0:
                    batch = to_rows(cols, row, n, text_col, id_col, label_col)
                    bad = [row + i for i, s in enumerate(batch.status) if s == "wrong_field_count"]
                    count += len(bad)
                    ragged += bad[: 5 - len(ragged)]
                    yield batch
                    row += n
                if limit is not None and row >= limit:
                    return
        finally:  # also when the reading stops early (a limit, an interrupt)
            if count:
                log.warning(
                    "%s: %s another number of fields than the header (%s); recorded with status "
                    "wrong_field_count",
                    src.label,
                    "1 row has" if count == 1 else f"{count} rows have",
                    some(ragged, count, "row"),
                )


def read_columns(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    """One source's raw values of the ``wanted`` columns, in blocks of at most ``block_rows`` rows."""
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
