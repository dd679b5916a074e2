"""Parquet inputs, read in blocks of rows with bounded buffers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq

from .. import storage
from .files import Source
from .rows import column_values

#: Bytes read at a time from a column chunk: without it Arrow pre-buffers a row group's whole column
#: chunks (about 150 MB of text for pyarrow's default million-row group).
PARQUET_BUFFER_BYTES = 1 << 20


def read_parquet(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    with storage.arrow_file(src.path) as f:
        pf = pq.ParquetFile(
            f, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False, page_checksum_verification=True
        )
        for rb in pf.iter_batches(batch_size=block_rows, columns=wanted):
            yield {c: column_values(rb.column(c)) for c in wanted}


def parquet_columns(src: Source) -> list[str]:
    with storage.arrow_file(src.path) as f:
        return pq.read_schema(f).names


def parquet_rows(src: Source) -> int:
    with storage.arrow_file(src.path) as f:
        return pq.read_metadata(f).num_rows
