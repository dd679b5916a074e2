"""The analysis stage: what a run says across the corpus (``aggregate``, ``faithfulness``), and whether
it is sound (``validate``)."""

from .validate import ValidationReport, validate_run

__all__ = ["ValidationReport", "validate_run"]
