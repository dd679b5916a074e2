"""The analysis stage: what a run says across the corpus (``aggregate``), and whether it is sound
(``validate``). The function ``aggregate`` is ``analysis.aggregate.aggregate``."""

from .aggregate import Aggregates, read_aggregates
from .top import format_top, top_tokens
from .validate import ValidationReport, validate_run

__all__ = ["Aggregates", "ValidationReport", "format_top", "read_aggregates", "top_tokens", "validate_run"]
