"""The rendering stage: pictures of one review (``plot_review``, ``bertattn plot``) and one
self-contained HTML page per run (``build_report``, ``bertattn report``)."""

from .plot import plot_review, review_for_plot, write_review
from .report import build_report
from .review import ReviewAttention, load_review, load_reviews, review_from_text

__all__ = [
    "ReviewAttention",
    "build_report",
    "load_review",
    "load_reviews",
    "plot_review",
    "review_for_plot",
    "review_from_text",
    "write_review",
]
