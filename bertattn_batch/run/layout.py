"""The names inside a run directory: the one place that spells them.

```
runs/<run>/
  manifest.json                 what the run is and which parts it committed (run/manifest.py)
  commits.jsonl                 parts committed since the manifest was last written, one a line
  predictions/part-*.parquet    one row per input review
  cls_attention/part-*.parquet  one row per (review, layer, head, content token)
  head_summary/part-*.parquet   one row per (review, layer, head)
  tokens/part-*.parquet         one row per (review, content token): its id, text and span
  aggregates/, report.html      what ``aggregate`` and ``report`` write into a run
  .bertattn.lock                held by the one process writing the run (local disk)
  _lease.json                   held, until it expires, by the one process writing it (object store)
```
"""

from __future__ import annotations

from pathlib import Path

from .. import schema

MANIFEST = "manifest.json"
#: Appended to, one part a line, as parts are committed; folded into the manifest when it is next
#: written (at the end of a pass, and when the run is reopened). Why: rewriting the whole manifest for
#: every part made a run of n parts write O(n²) bytes.
COMMIT_LOG = "commits.jsonl"
FORMAT = "bertattn-batch run"
#: What ``aggregate``, ``faithfulness`` and ``report`` write into a run; with the tables and the
#: manifest, all that --overwrite removes (anything else in the folder is the user's and stays).
AGGREGATES_DIR = "aggregates"
FAITHFULNESS_DIR = "faithfulness"
DERIVED_DIRS = (AGGREGATES_DIR, FAITHFULNESS_DIR)
REPORT_NAME = "report.html"
#: Held (flock) by the one process writing a run; the file stays, the lock dies with its process.
LOCK_NAME = ".bertattn.lock"
#: On an object store, which has no locks: who writes the run, and until when (run/lease.py).
LEASE_NAME = "_lease.json"
TABLES = schema.TABLES


def part_name(start_row: int, generation: int = 0, writer: str = "") -> str:
    """Parts are named by their first row: deterministic, so a retried write replaces, never adds.

    ``generation`` counts incremental passes over a run, whose rows may start where older parts did.
    ``writer`` names the process that holds a run on an object store (run/lease.py): a process that
    was paused mid-upload and woke after another took the run over then uploads under a name no
    manifest lists, instead of over a part the other committed.
    """
    suffix = (f"-g{generation}" if generation else "") + (f"-{writer}" if writer else "")
    return f"part-{start_row:012d}{suffix}.parquet"


def tmp_name(name: str) -> str:
    """A part's file while it is written, before its commit: a name readers skip."""
    return f"_{name}.tmp"


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file() and (path / "predictions").is_dir()
