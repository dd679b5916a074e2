"""The inputs stage: find the review files, check them, and stream their rows under one row rule.

``discover`` finds the files; ``files`` reads their bytes (compression, encodings, streams) and checks
them; one module a format (``parquet``, ``csv``, ``jsonl``, ``text``, ``hf_datasets``) reads their
values; ``rows`` makes rows of them; ``read`` holds the entry points (:func:`check_inputs`,
:func:`read_sources`); ``fingerprint`` is what a resume checks of them.
"""

from .discover import EXTENSIONS, expand_inputs
from .files import STDIN, Source, is_stream, read_once
from .fingerprint import RowDigests, rows_digest, source_files, streams_as_recorded
from .hf_datasets import class_label_order
from .read import BLOCK_ROWS, check_inputs, count_rows, read_columns, read_rows, read_sources
from .rows import RowBatch, to_rows, wanted_columns

__all__ = [
    "BLOCK_ROWS",
    "EXTENSIONS",
    "STDIN",
    "RowBatch",
    "RowDigests",
    "Source",
    "check_inputs",
    "class_label_order",
    "count_rows",
    "expand_inputs",
    "is_stream",
    "read_columns",
    "read_once",
    "read_rows",
    "read_sources",
    "rows_digest",
    "source_files",
    "streams_as_recorded",
    "to_rows",
    "wanted_columns",
]
