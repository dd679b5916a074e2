"""The run directory: its layout, its typed manifest, the life cycle of its parts, and resuming.

The polars views (``views.py``) are imported on first use (``_lazy.lazy_exports``): writing a run needs
no polars, so a job's process and its host processes never load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .existing import old_manifest
from .layout import (
    AGGREGATES_DIR,
    COMMIT_LOG,
    FAITHFULNESS_DIR,
    FORMAT,
    LOCK_NAME,
    MANIFEST,
    REPORT_NAME,
    is_run_dir,
    part_name,
    tmp_name,
)
from .lease import Lease, refuse_if_held, status_now, writer_is_live
from .manifest import (
    Manifest,
    PartEntry,
    layer_name,
    load_json,
    model_problems,
    parse_parts,
    read_manifest,
    require_current_tables,
    row_range_problems,
)
from .mirror import display_path, local_run, on_local_copy
from .parts import (
    CommittedPart,
    PartWriter,
    check_part_file,
    committed_files,
    decode_every_page,
    run_file,
    verify_pages,
)
from .resume import ResumePoint, check_read_unchanged, input_changes, resume_point
from .rundir import RunDir, part_rows
from .stored import StoredRunDir, run_dir_class

if TYPE_CHECKING:
    from .views import TOKEN_COLUMNS, TOKEN_KEY, attention_rows, scan_attention, scan_parts

_VIEWS = ["TOKEN_COLUMNS", "TOKEN_KEY", "attention_rows", "scan_attention", "scan_parts"]
__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(_VIEWS, "views"))

__all__ = [
    "AGGREGATES_DIR",
    "COMMIT_LOG",
    "FAITHFULNESS_DIR",
    "FORMAT",
    "LOCK_NAME",
    "MANIFEST",
    "REPORT_NAME",
    "TOKEN_COLUMNS",
    "TOKEN_KEY",
    "CommittedPart",
    "Lease",
    "Manifest",
    "PartEntry",
    "PartWriter",
    "ResumePoint",
    "RunDir",
    "StoredRunDir",
    "attention_rows",
    "check_part_file",
    "check_read_unchanged",
    "committed_files",
    "decode_every_page",
    "display_path",
    "input_changes",
    "is_run_dir",
    "layer_name",
    "load_json",
    "local_run",
    "model_problems",
    "old_manifest",
    "on_local_copy",
    "parse_parts",
    "part_name",
    "part_rows",
    "read_manifest",
    "refuse_if_held",
    "require_current_tables",
    "resume_point",
    "row_range_problems",
    "run_dir_class",
    "run_file",
    "scan_attention",
    "scan_parts",
    "status_now",
    "tmp_name",
    "verify_pages",
    "writer_is_live",
]
