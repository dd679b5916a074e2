"""The one windowing rule: which input rows make up each part, for every engine.

Window k holds rows ``[k * window, (k + 1) * window)`` counted across all inputs; a resume starts at its
resume point and goes on to the next grid line. So a part's name and rows follow from the inputs alone.
Rows committed already are left out (before the resume point, or by id in an incremental pass); a later
row with a text and an id seen already is ``duplicate_id``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .. import schema
from ..config import InputSpec
from ..errors import InputsEditedError
from ..ids import IdSet
from ..inputs import RowBatch, RowDigests, Source, read_sources, rows_digest
from ..run.rundir import ResumePoint


@dataclass
class WindowRows:
    """A window's rows still to do, read but not encoded: what an engine schedules. ``start_row`` names its
    part; ``end_row`` is one past its last row."""

    start_row: int
    end_row: int
    rows: RowBatch
    #: of the rows as read, which a resume reads again and compares (empty in a pass by id)
    digest: str = ""


def iter_windows(sources: Iterable[Source], inputs: InputSpec, window: int, point: ResumePoint | None = None,
                 timings: Counter | None = None) -> Iterator[WindowRows]:  # fmt: skip
    """Read the inputs and cut them on the grid; ``timings["read"]`` adds up the seconds spent reading."""
    point = point or ResumePoint()
    # ids are checked for repeats only where the job has an id column: no copy of them otherwise
    seen = (point.skip_ids or IdSet()) | (point.taken_ids or IdSet()) if inputs.id_col else None
    timings = timings if timings is not None else Counter()
    pending = RowBatch()
    committed = RowDigests(point.digested)
    t0 = time.perf_counter()
    for block in read_sources(sources, inputs, block_rows=window):
        if not committed.done and (changed := committed.feed(block)):
            name, a, b = changed[0]
            raise InputsEditedError(
                f"input rows {a}..{b - 1} read otherwise now than when the run committed them (part {name}): "
                f"the inputs were edited since (see bertattn validate); {_ways_out(inputs)}"
            )
        for piece in _on_grid(block, window):
            if pending and piece.row_index[0] // window != pending.row_index[0] // window:
                timings["read"] += time.perf_counter() - t0
                if (done := _window(pending, point, seen)) is not None:
                    yield done
                t0 = time.perf_counter()
                pending = RowBatch()
            pending.extend(piece)
    timings["read"] += time.perf_counter() - t0
    if pending and (done := _window(pending, point, seen)) is not None:
        yield done
    read = pending.row_index[-1] + 1 if pending else 0
    if point.skip_until > read:  # found before any window of this pass: the run is left as it was
        raise InputsEditedError(
            f"the run's committed parts hold rows up to {point.skip_until - 1}, but the inputs"
            f"{' (as limited)' if inputs.limit is not None else ''} have {read} rows: they changed since the "
            f"run (see bertattn validate); {_ways_out(inputs)}"
        )


def _ways_out(inputs: InputSpec) -> str:
    by_id = " (or --incremental to keep what was scored and add the reviews whose ids are new)"
    return "pass --overwrite to start again" + (by_id if inputs.id_col else "")


def _on_grid(block: RowBatch, window: int) -> Iterator[RowBatch]:
    """A block's rows cut where they cross a grid line (a block is consecutive rows)."""
    start = 0
    while start < len(block):
        first = block.row_index[start]
        end = min(len(block), start + (first // window + 1) * window - first)
        yield block if start == 0 and end == len(block) else block.slice(start, end)
        start = end


def _window(block: RowBatch, point: ResumePoint, seen: IdSet | None) -> WindowRows | None:
    if not (rows := select_rows(block, point.skip_until, point.skip_ids, seen)):
        return None
    digest = rows_digest(rows) if point.skip_ids is None else ""  # by row number: every row in its range
    return WindowRows(rows.row_index[0], rows.row_index[-1] + 1, rows, digest)


def select_rows(block: RowBatch, skip_until: int, skip_ids: IdSet | None, seen_ids: IdSet | None) -> RowBatch:
    """The block's rows still to do, in order; a repeated id (``seen_ids`` grows) becomes duplicate_id."""
    todo = [i for i in range(len(block)) if block.row_index[i] >= skip_until]
    if skip_ids is not None:
        # a row without a source id has its row number as doc id, which is no committed source id (the row
        # is recorded again every pass) and no repeat of one
        with_id = [i for i in todo if block.status[i] not in schema.ROW_NUMBER_STATUSES]
        had = skip_ids.contains_each([block.doc_id[i] for i in with_id])
        done = {i for i, is_done in zip(with_id, had, strict=True) if is_done}
        todo = [i for i in todo if i not in done]
    repeated: set[int] = set()
    if seen_ids is not None:
        # only a row with a text claims its id: after a null or empty text, the review under the same id is
        # still scored (the statuses that RunDir.committed_ids(claimed=True) leaves out on a resume)
        unclaimed = schema.ROW_NUMBER_STATUSES + schema.NO_TEXT_STATUSES
        with_text = [i for i in todo if block.status[i] not in unclaimed]
        new = seen_ids.add_each([block.doc_id[i] for i in with_text])
        repeated = {i for i, is_new in zip(with_text, new, strict=True) if not is_new}
    out = RowBatch()
    for i in todo:
        status = "duplicate_id" if i in repeated else block.status[i]
        out.append(block.row_index[i], block.doc_id[i], block.text[i], block.label[i], status)
    return out
