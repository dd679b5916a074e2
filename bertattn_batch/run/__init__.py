"""The run directory: its names and typed manifest, the life cycle of its parts, resuming, reading.

The polars scans (``scan.py``) are imported on first use: writing a run needs no polars.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .lease import Lease, refuse_if_held, status_now, writer_is_live
from .manifest import (
    AGGREGATES_DIR,
    COMMIT_LOG,
    FAITHFULNESS_DIR,
    FORMAT,
    LOCK_NAME,
    MANIFEST,
    REPORT_NAME,
    Manifest,
    PartEntry,
    layer_name,
    load_json,
    model_problems,
    parse_parts,
    read_manifest,
    require_current_tables,
    row_range_problems,
    tmp_name,
)
from .mirror import display_path, local_run, on_local_copy
from .parts import CommittedPart, PartWriter, committed_files, decode_every_page, part_paths, verify_pages
from .rundir import (
    RunDir,
    StoredRunDir,
    check_read_unchanged,
    input_changes,
    old_manifest,
    part_rows,
    refuse_unsafe_store,
    resume_point,
    run_dir_class,
)

if TYPE_CHECKING:
    from .scan import attention_rows, scan_attention, scan_parts, scan_run

__getattr__, __dir__ = lazy_exports(
    __name__, dict.fromkeys(["attention_rows", "scan_attention", "scan_parts", "scan_run"], "scan")
)

__all__ = [
    "AGGREGATES_DIR", "COMMIT_LOG", "FAITHFULNESS_DIR", "FORMAT", "LOCK_NAME", "MANIFEST", "REPORT_NAME",
    "CommittedPart", "Lease", "Manifest", "PartEntry", "PartWriter", "RunDir", "StoredRunDir",
    "attention_rows", "check_read_unchanged", "committed_files", "decode_every_page", "display_path",
    "input_changes", "layer_name", "load_json", "local_run", "model_problems", "old_manifest",
    "on_local_copy", "parse_parts", "part_paths", "part_rows", "read_manifest", "refuse_if_held",
    "refuse_unsafe_store", "require_current_tables", "resume_point", "row_range_problems", "run_dir_class",
    "scan_attention", "scan_parts", "scan_run", "status_now", "tmp_name", "verify_pages", "writer_is_live",
]  # fmt: skip
