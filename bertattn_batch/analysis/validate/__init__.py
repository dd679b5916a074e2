"""Check a run directory against ``schemas/`` and its own manifest, and report every problem found:
``bertattn validate RUN`` (exit status 1 on any problem), or ``validate_run(RUN)`` whose report has
``ok``, ``problems``, ``checks`` and ``render()``.

A run is read by other tools long after it was written: this says whether its files are the ones the
manifest committed, and whether their numbers keep the promises extraction makes (``report.CHECKS``).
Memory stays bounded: predictions are checked by lazy queries over all parts, attention part by part,
and the inputs are streamed once beside the parts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ...errors import RunDirError
from ...run import FORMAT, load_json, local_run, require_current_tables, writer_is_live
from ...storage import is_remote
from .files import check_files, check_manifest
from .inputs import check_inputs_and_spans
from .report import CHECKS, Check, Problem, ValidationReport
from .tables import check_attention, check_predictions, check_ranges


def validate_run(run_dir: str | Path, check_source: bool = True) -> ValidationReport:
    """Run every check on ``run_dir`` (a path, or a store's URI: checked on its local mirror, every object
    under its table folders included); raise RunDirError only when it is not a readable run directory."""
    # asked of the run itself (a mirror has no writer): of a store before the mirror is made, of a
    # folder once the manifest is read (which is read again where the job ended in between)
    live = writer_is_live(run_dir) if is_remote(run_dir) else None

    def writing() -> bool | None:
        return live if is_remote(run_dir) else writer_is_live(run_dir)

    with local_run(run_dir) as path:
        try:
            return _validate(path, check_source, shown=os.fspath(run_dir), writing=writing)
        except FileNotFoundError as e:  # (pyarrow's, polars's) a file listed when the checks began
            raise RunDirError(
                f"{run_dir}: {e.filename or 'a part'} went while validate read it (an --overwrite of the run "
                "meanwhile?); run validate again"
            ) from None


def _validate(
    path: Path, check_source: bool, shown: str, writing: Callable[[], bool | None]
) -> ValidationReport:
    manifest = load_json(path)
    if manifest.get("format") == FORMAT:  # another version's tables: nothing here can be checked
        require_current_tables(path, manifest.get("schema_versions"))
    report = ValidationReport(shown)
    run = check_manifest(report, path, manifest, writing)
    check_files(report, run)
    statuses = check_predictions(report, run)
    check_attention(report, run)
    check_ranges(report, run)
    if check_source:
        check_inputs_and_spans(report, run)
    else:
        report.skip("inputs", "--no-source: the inputs' rows not counted")
        report.skip("spans", "--no-source: end <= text length not checked")
    n = sum(statuses.values())
    others = "".join(f", {k} {v}" for k, v in sorted(statuses.items()) if k != "ok")
    report.header = (
        f"{shown}: status {run.status}, {len(run.parts)} parts, {n} reviews "
        f"({statuses.get('ok', 0)} scored{others}), layers {run.layers}, {run.num_heads} heads, {run.dtype}"
    )
    return report


__all__ = ["CHECKS", "Check", "Problem", "ValidationReport", "validate_run"]
