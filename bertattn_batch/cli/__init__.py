"""The ``bertattn`` command: each command parses its options, calls one library function, prints, and
maps the library's errors to exit codes."""

from . import jobs, runs
from .base import app, main
from .jobs import CLI_ONLY_OPTIONS, extract

__all__ = ["CLI_ONLY_OPTIONS", "app", "extract", "jobs", "main", "runs"]
