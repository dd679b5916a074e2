"""The names inside a run directory (docs/run-directory.md draws it): the one place that spells them."""

from __future__ import annotations

from pathlib import Path

from .. import schema

MANIFEST = "manifest.json"
#: Parts committed since the manifest was last written, one a line: a commit costs the same however
#: many parts came before.
COMMIT_LOG = "commits.jsonl"
FORMAT = "bertattn-batch run"
AGGREGATES_DIR = "aggregates"
FAITHFULNESS_DIR = "faithfulness"
#: What the analysis commands write into a run; with the tables and the manifest, all that --overwrite
#: removes (anything else in the folder is the user's).
DERIVED_DIRS = (AGGREGATES_DIR, FAITHFULNESS_DIR)
REPORT_NAME = "report.html"
LOCK_NAME = ".bertattn.lock"  # held by the process writing a run on local disk
LEASE_NAME = "_lease.json"  # on an object store (run/lease.py)
TABLES = schema.TABLES
ALL_TABLES = schema.ALL_TABLES


def part_name(start_row: int, generation: int = 0, writer: str = "") -> str:
    """A part's name: its first row (a retried window replaces, never adds), its pass (``generation``)
    and, on a store, the token of the process holding the run (run/lease.py), so that a writer that
    lost the run uploads under a name no manifest lists."""
    suffix = (f"-g{generation}" if generation else "") + (f"-{writer}" if writer else "")
    return f"part-{start_row:012d}{suffix}.parquet"


def tmp_name(name: str) -> str:
    """A part's file until it is published: a name readers skip."""
    return f"_{name}.tmp"


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file() and (path / "predictions").is_dir()
