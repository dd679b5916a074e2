"""Stream review rows from every input in order, numbered from 0 across all of them.

Usage::

    for batch in read_rows(InputSpec(["reviews/*.parquet"], id_col="id")):
        batch.doc_id, batch.text, batch.label, batch.status

Memory stays bounded whatever the corpus size: every format is read in blocks (one module a format:
``parquet``, ``csv``, ``jsonl``, ``text``, ``hf_datasets``). Row numbers, ``limit`` and the warnings
that name malformed rows are decided here, once, for every engine.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..config import InputSpec
from ..errors import InputError, first_line
from .checks import check_inputs
from .compressed import READ_ERRORS
from .csv import read_csv
from .discover import Source
from .hf_datasets import load_dataset, read_datasets
from .jsonl import read_jsonl
from .parquet import read_parquet
from .rows import WRONG_FIELD_COUNT, RowBatch, to_rows, wanted_columns
from .text import read_text

log = logging.getLogger(__name__)

BLOCK_ROWS = 4096


def read_rows(spec: InputSpec, block_rows: int = BLOCK_ROWS) -> Iterator[RowBatch]:
    """Yield RowBatches over all inputs in order; ``row_index`` counts across inputs from 0."""
    yield from read_sources(check_inputs(spec), spec, block_rows)


def read_sources(
    sources: Iterable[Source], spec: InputSpec, block_rows: int = BLOCK_ROWS
) -> Iterator[RowBatch]:
    """:func:`read_rows` over sources that :func:`check_inputs` already gave: a job checks its inputs
    before it loads a model, and need not walk its folders and read their headers twice."""
    text_col, id_col, label_col, limit = spec.text_col, spec.id_col, spec.label_col, spec.limit
    wanted = wanted_columns(text_col, id_col, label_col)
    row = 0
    for src in sources:
        ragged = RaggedRows(src.label)
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
    few by their row numbers (their doc ids), noted by :func:`read_sources` as it numbers the rows."""

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
    for ragged, group in itertools.groupby(values, key=lambda v: v is WRONG_FIELD_COUNT):
        k = sum(1 for _ in group)
        if ragged:
            runs.append((first_row + i, first_row + i + k))
        i += k
    return runs


def read_columns(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    """One source's raw values of the ``wanted`` columns, in blocks of at most ``block_rows`` rows;
    :func:`to_rows` makes rows of them."""
    reader = {
        "parquet": read_parquet,
        "csv": read_csv,
        "tsv": read_csv,
        "jsonl": read_jsonl,
        "text": read_text,
        "datasets": read_datasets,
    }[src.format]
    try:
        yield from reader(src, wanted, block_rows)
    except (pa.ArrowInvalid, *READ_ERRORS) as e:
        raise InputError(f"{src.label}: cannot read as {src.format}: {first_line(e)}") from None


def count_rows(sources: Iterable[Source]) -> int | None:
    """Total rows where the formats record it (Parquet, datasets) without reading data; else None."""
    total = 0
    for src in sources:
        if src.format == "parquet":
            with src.arrow_file() as f:
                total += pq.read_metadata(f).num_rows
        elif src.format == "datasets":
            total += load_dataset(src.path).num_rows
        else:
            return None
    return total
