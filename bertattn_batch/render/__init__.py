"""The rendering stage: pictures of one review (``plot``) and one self-contained page per run (``report``).
The function ``plot`` is ``render.plot.plot``."""

from .plot import write_review
from .report import build_report
from .review import ReviewAttention, load_review, load_reviews, review_from_text

__all__ = [
    "ReviewAttention",
    "build_report",
    "load_review",
    "load_reviews",
    "review_from_text",
    "write_review",
]
