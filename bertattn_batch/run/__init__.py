"""The run directory: its layout, its typed manifest, the life cycle of its parts, and resuming."""

from .layout import (
    AGGREGATES_DIR,
    COMMIT_LOG,
    FORMAT,
    LOCK_NAME,
    MANIFEST,
    REPORT_NAME,
    is_run_dir,
    part_name,
    tmp_name,
)
from .manifest import (
    Manifest,
    PartEntry,
    layer_name,
    load_json,
    parse_parts,
    read_manifest,
    row_range_problems,
)
from .parts import CommittedPart, PartWriter, check_part_file, committed_files
from .resume import ResumePoint, input_changes, resume_point
from .rundir import RunDir, old_manifest

__all__ = [
    "AGGREGATES_DIR",
    "COMMIT_LOG",
    "FORMAT",
    "LOCK_NAME",
    "MANIFEST",
    "REPORT_NAME",
    "CommittedPart",
    "Manifest",
    "PartEntry",
    "PartWriter",
    "ResumePoint",
    "RunDir",
    "check_part_file",
    "committed_files",
    "input_changes",
    "is_run_dir",
    "layer_name",
    "load_json",
    "old_manifest",
    "parse_parts",
    "part_name",
    "read_manifest",
    "resume_point",
    "row_range_problems",
    "tmp_name",
]
