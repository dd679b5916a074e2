"""Parquet inputs, read in blocks of rows with bounded buffers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq

from .discover import Source
from .rows import column_values

#: Bytes read at a time from a Parquet column chunk. By default Arrow reads (pre-buffers) a row group's
#: whole column chunks at once: about 150 MB of text for a row group of a million reviews, pyarrow's
#: default row group size. Buffered reads without pre-buffering keep one block's worth in memory.
PARQUET_BUFFER_BYTES = 1 << 20


def read_parquet(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    with src.arrow_file() as f:
        pf = pq.ParquetFile(f, buffer_size=PARQUET_BUFFER_BYTES, pre_buffer=False)
        for rb in pf.iter_batches(batch_size=block_rows, columns=wanted):
            yield {c: column_values(rb.column(c)) for c in wanted}
