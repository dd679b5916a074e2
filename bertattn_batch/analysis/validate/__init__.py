"""Check a run directory against ``schemas/`` and its own manifest, and report every problem found:
``bertattn validate RUN`` (exit status 1 on any problem), or ``validate_run(RUN)`` whose report has
``ok``, ``problems``, ``checks`` and ``render()``. Memory stays bounded: predictions are checked by lazy
queries over all parts, attention part by part, and the inputs are streamed once beside the parts.
"""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import RunDirError
from ...run import FORMAT, load_json, local_run, require_current_tables, writer_is_live
from ...storage import is_remote
from .files import check_files, check_manifest
from .inputs import check_inputs_and_spans
from .report import CHECKS, Check, Problem, ValidationReport
from .tables import check_attention, check_predictions, check_ranges


def validate_run(run_dir: str | Path, check_source: bool = True) -> ValidationReport:
    """Run every check on ``run_dir`` (a path, or a store's URI: checked on its local mirror); raise
    RunDirError only when it is not a readable run directory."""
    # a mirror has no writer: a store is asked before the mirror is made, a folder after its manifest is read
    live = writer_is_live(run_dir) if is_remote(run_dir) else None
    shown = os.fspath(run_dir)
    with local_run(run_dir) as path:
        try:
            manifest = load_json(path)
            if manifest.get("format") == FORMAT:  # another version's tables: nothing here can be checked
                require_current_tables(path, manifest.get("schema_versions"))
            if not is_remote(run_dir) and manifest.get("status") == "running":
                live = writer_is_live(run_dir)
            report = ValidationReport(shown)
            run = check_manifest(report, path, manifest, live)
            check_files(report, run)
            statuses = check_predictions(report, run)
            check_attention(report, run)
            check_ranges(report, run)
            if check_source:
                check_inputs_and_spans(report, run)
            else:
                report.skip("inputs", "--no-source: the inputs' rows not counted")
                report.skip("spans", "--no-source: end <= text length not checked")
        except FileNotFoundError as e:  # (pyarrow's, polars's) a file listed when the checks began
            raise RunDirError(
                f"{run_dir}: {e.filename or 'a part'} went while validate read it (an --overwrite of the run "
                "meanwhile?); run validate again"
            ) from None
    n = sum(statuses.values())
    others = "".join(f", {k} {v}" for k, v in sorted(statuses.items()) if k != "ok")
    report.header = (
        f"{shown}: status {run.status}, {len(run.parts)} parts, {n} reviews "
        f"({statuses.get('ok', 0)} scored{others}), layers {run.layers}, {run.num_heads} heads, {run.dtype}"
    )
    return report


__all__ = ["CHECKS", "Check", "Problem", "ValidationReport", "validate_run"]
