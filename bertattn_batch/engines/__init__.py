"""The engines: ``run_job`` (the data path, base.py) and where a window's steps run (local, ray)."""

from .base import Engine, RunSummary, engine_for, run_job
from .start import load_classifier, run_header

__all__ = ["Engine", "RunSummary", "engine_for", "load_classifier", "run_header", "run_job"]
