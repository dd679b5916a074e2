"""The inputs stage: ``discover`` finds the review files; ``files`` reads and checks their bytes;
``formats`` holds one reader a format; ``read`` the entry points (:func:`check_inputs`,
:func:`read_sources`) and the row rule; ``fingerprint`` is what a resume checks of them."""

from .discover import expand_inputs
from .files import Source, read_once
from .fingerprint import RowDigests, rows_digest, source_files, streams_as_recorded
from .formats import class_label_order
from .read import RowBatch, check_inputs, count_rows, read_rows, read_sources, read_values

__all__ = [
    "RowBatch",
    "RowDigests",
    "Source",
    "check_inputs",
    "class_label_order",
    "count_rows",
    "expand_inputs",
    "read_once",
    "read_rows",
    "read_sources",
    "read_values",
    "rows_digest",
    "source_files",
    "streams_as_recorded",
]
