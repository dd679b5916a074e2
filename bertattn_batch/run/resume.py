"""Where a reopened run goes on: the pass, the rows and ids it skips, and the ids committed rows hold.

Usage::

    point = resume_point(run, incremental=False, by_id=True, sources=source_files(sources))
    point.generation, point.skip_until, point.skip_ids, point.taken_ids

A resume goes on by row number, over the same inputs (refused where they changed); an incremental pass
over a complete run goes by id, skipping every committed id.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, RunDirError
from ..ids import IdSet
from .manifest import PartEntry
from .rundir import RunDir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """Which pass the parts to come are of, and what they skip: the rows before ``skip_until`` and rows
    with ``skip_ids``. ``taken_ids``: ids this pass's committed rows claimed (a repeat is a duplicate)."""

    generation: int = 0
    skip_until: int = 0
    skip_ids: IdSet | None = None
    taken_ids: IdSet | None = None
    #: the committed parts a pass by row number reads again: rows whose digest changed are refused
    digested: list[PartEntry] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """Input rows committed before that this pass does not redo (for the summary)."""
        return self.skip_until + len(self.skip_ids or ())


def resume_point(run: RunDir, incremental: bool, by_id: bool, sources: list[dict[str, Any]] | None = None,
                 limit: int | None = None, compared: list[dict[str, Any]] | None = None,
                 ) -> ResumePoint:  # fmt: skip
    """The resume point of a reopened run (``by_id``: the job has an id column), its pass begun. An
    incremental job starts a new pass over a complete run, and finishes an interrupted one by row number
    unless its inputs changed or a lower limit stops before its rows. ``sources``: the pass's input
    files; ``compared``: those checked against the recorded pass's, where they differ."""
    m, parts, generation = run.manifest, run.parts, run.manifest.generation or 0
    checked = compared if compared is not None else sources
    if sources is not None and m.sources is not None and len(m.sources) == len(sources):
        # the files the run recorded under other names (size and end bytes, in the same order: the
        # project moved), unless they are told apart by their size alone (older runs)
        renamed = [{**b, "path": s["path"]} for b, s in zip(m.sources, sources, strict=True)]
        if (run.inputs_renamed or all("ends_sha256" in b for b in m.sources)) and all(
            map(_same_file, renamed, sources)
        ):
            m.sources = renamed
    if not incremental and (m.passes - {0} or generation):  # its row numbers are not ours
        raise RunDirError(
            f"{run.run_dir} was last run with --incremental (its passes go by id, not by row number); "
            "rerun it with --incremental (or --overwrite)"
        )
    current = [p for p in parts if p.generation == generation]
    skip_until = max((p.end_row for p in current), default=0)
    changes = input_changes(m.sources, checked) if checked is not None and m.sources is not None else []
    short = limit is not None and limit < skip_until  # a limit that stops before the committed rows
    new_pass = incremental and bool(parts) and (run.reopened_status == "complete" or m.generation is None)
    if incremental and not new_pass and skip_until and by_id and (changes or short):
        why = (
            f"the inputs changed ({_listed(changes)})"
            if changes
            else f"--limit {limit:,} stops before the {skip_until:,} input rows it read"
        )
        log.warning("%s: %s since its interrupted pass began; a new pass adds the reviews whose ids are "
                    "not in the run yet", run.run_dir, why)  # fmt: skip
        new_pass = True
    if new_pass:
        generation = max(m.passes) + 1
        run.begin_pass(generation, sources, limit)
        return ResumePoint(generation, 0, run.committed_ids(), None)
    if skip_until and changes:  # a file sorted before the old ones would shift every row
        fix = "restore them, or pass --overwrite to start again"
        if by_id and run.reopened_status == "complete" and not m.generation:
            fix += ", or --incremental to add only the reviews whose ids are new"
        raise RunDirError(
            f"{run.run_dir}: the inputs changed since this run began ({_listed(changes)}); "
            f"a resume goes on by row number and would mix old and new rows: {fix}"
        )
    if skip_until and short:
        raise RunDirError(
            f"{run.run_dir}: the run already holds {skip_until:,} input rows, more than --limit {limit:,} "
            f"(a job's limit); resume with a limit of {skip_until:,} or more (or none), or pass --overwrite "
            "to start again"
        )
    run.begin_pass(generation, sources, limit)
    earlier = [p for p in parts if p.generation < generation]
    taken = run.committed_ids(current, claimed=True) if by_id and skip_until else None
    skip_ids = run.committed_ids(earlier) if earlier else None
    # digests are compared only by row number: a pass by id keeps the text an id had when scored
    return ResumePoint(generation, skip_until, skip_ids, taken, [] if incremental else parts)


def check_read_unchanged(run: RunDir, before: list[dict[str, Any]], now: list[dict[str, Any]]) -> None:
    """Refuse to finish a pass whose input files changed while it read them: it stays interrupted."""
    if changes := input_changes(before, now):
        raise InputError(
            f"{run.run_dir}: the inputs changed while this run read them ({_listed(changes)}), so its "
            "tables may hold rows of two versions of them; once they are final, rerun with --overwrite"
        )


def _listed(changes: list[str]) -> str:
    more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
    return "; ".join(changes[:3]) + more


def input_changes(before: list[dict[str, Any]], now: list[dict[str, Any]]) -> list[str]:
    """How the input files ``now`` differ from those a pass recorded, a phrase each."""
    if len(before) == len(now) and all(map(_same_file, before, now)):
        return []
    old = {s["path"]: s for s in before}
    paths = {s["path"] for s in now}
    changes = [f"{s['path']} is new" for s in now if s["path"] not in old]
    changes += [f"{p} is gone" for p in old if p not in paths]
    for s in now:
        was = old.get(s["path"])
        if was is not None and was["bytes"] != s["bytes"]:
            changes.append(f"{s['path']} changed size")
        elif was is not None and not _same_file(was, s):
            changes.append(f"{s['path']} was rewritten (same size, other bytes at its start or end)")
    return changes or ["the files are read in another order"]


def _same_file(was: dict[str, Any], now: dict[str, Any]) -> bool:
    """The same input file as when the pass began: its size and the bytes at its start and end (older
    runs: the size alone), whatever its time says."""
    if was["path"] != now["path"] or was["bytes"] != now["bytes"]:
        return False
    return "ends_sha256" not in was or was["ends_sha256"] == now["ends_sha256"]
