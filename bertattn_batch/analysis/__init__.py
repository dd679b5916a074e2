"""The analysis stage: what a run says across the corpus (``aggregate``, ``faithfulness``), and whether
it is sound (``validate``)."""

from .aggregate import Aggregates, format_top, read_aggregates, top_tokens
from .validate import ValidationReport, validate_run

__all__ = ["Aggregates", "ValidationReport", "format_top", "read_aggregates", "top_tokens", "validate_run"]
