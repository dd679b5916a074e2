"""The read phase of ``--engine ray``: the inputs read by Ray tasks, global row numbers, windows of rows.

Usage::

    sources = check_inputs(spec.inputs, ...)
    windows, n_rows = plan_windows(ray, spec, sources, skip_until=0)   # [WindowPlan(start, rows, ref), ...]

Parquet files and saved ``datasets`` folders are read with Ray Data (``read_parquet``,
``from_huggingface``); JSON lines, CSV, TSV and text files by a Ray task per file that runs the local
engine's own reader, so that a malformed row (a JSON line cut short, a CSV row with the wrong number of
fields, invalid UTF-8) gets the status the local engine gives it instead of failing its file, and
every compression the local engine reads is read. The blocks' sizes give each row its number, counted
from 0 across all inputs as ``read_rows`` counts them. Rows are then cut into windows of
``spec.window`` consecutive rows, each built by a small task as one block: the unit of work of the
model stage. This module imports no torch, so the tasks that run it start quickly.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .errors import EngineError, InputError
from .ids import IdSet
from .read import (
    RaggedRows,
    RowBatch,
    Source,
    _load_dataset,
    class_label_names,
    column_values,
    name_class_labels,
    read_columns,
    to_rows,
    wanted_columns,
    wrong_field_count_runs,
)
from .read import (
    log as read_log,
)
from .spec import JobSpec

#: Columns of a window block: the RowBatch fields, then the window's first row and its row count.
ROW_FIELDS = tuple(f.name for f in dataclasses.fields(RowBatch))
_ROW_TYPES = {"row_index": pa.int64()}
WINDOW_START, WINDOW_ROWS = "_window_start", "_window_rows"
#: Formats read by a task per file with the local reader (Ray Data reads the others).
_BY_FILE = ("jsonl", "csv", "tsv", "text")
#: How Ray shows a worker's error: a traceback whose last line is "module.Class: message".
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DIRECT_CAUSE = "The above exception was the direct cause of the following exception"
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Invalid|Interrupt|Exit)\w*): (.*)$")

#: A source block: an Arrow table Ray Data read, or the raw values of each wanted column that the local
#: reader read from a file (texts may be bytes, or markers of rows that are no rows).
Block = pa.Table | dict[str, list[Any]]


# -- rows: the reader's rules, applied to blocks read by Ray tasks ------------------------------------
def _rows(block: Block, first_row: int, lo: int, hi: int, cols: tuple) -> RowBatch:
    """Rows [lo, hi) of a source block whose row 0 is input row ``first_row``; as ``read_rows`` yields them."""
    if isinstance(block, pa.Table):
        part = block.slice(lo, hi - lo)
        data = {c: column_values(part.column(c)) for c in cols if c}
    else:
        data = {c: block[c][lo:hi] for c in cols if c}
    return to_rows(data, first_row + lo, hi - lo, *cols)


def _block_rows(block: Block) -> int:
    return block.num_rows if isinstance(block, pa.Table) else len(next(iter(block.values())))


def _block_info(block: Block) -> tuple[int, list[tuple[int, int]]]:
    """A block's row count, and the runs of its rows (counted from the block's first) that are CSV rows
    with the wrong number of fields, which the driver names in a warning as the local engine does."""
    if isinstance(block, pa.Table):
        return block.num_rows, []
    values = next(iter(block.values()))
    return len(values), wrong_field_count_runs(values, 0)


def _read_file(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]] | list[str]]:
    """A Ray task: one file's raw column values, read by the local reader, in blocks; last, the warnings
    the reader gave (a line cut short, say), for the driver to give: a worker's log reaches no one."""
    said = _Messages()
    read_log.addHandler(said)
    try:
        yield from read_columns(src, wanted, block_rows)
    finally:
        read_log.removeHandler(said)
    yield said.messages


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _block_keys(block: Block, first_row: int, cols: tuple) -> tuple[list[str], list[str]]:
    """(doc ids, statuses) of a block: all the driver needs to find repeated ids in input order."""
    batch = _rows(block, first_row, 0, _block_rows(block), cols)
    return batch.doc_id, batch.status


def _window_block(
    cols: tuple, pieces: list[tuple[int, int, int]], keep: list[int] | None, status: dict[int, str], *blocks
) -> pa.Table:
    """One window's rows as a block: ``pieces`` are (first_row, lo, hi) of each source block given."""
    rows = RowBatch()
    for (first_row, lo, hi), block in zip(pieces, blocks, strict=True):
        piece = _rows(block, first_row, lo, hi, cols)
        for name in ROW_FIELDS:
            getattr(rows, name).extend(getattr(piece, name))
    if keep is not None:
        wanted = set(keep)
        idx = [i for i, r in enumerate(rows.row_index) if r in wanted]
        rows = RowBatch(**{name: [getattr(rows, name)[i] for i in idx] for name in ROW_FIELDS})
    rows.status = [status.get(r, s) for r, s in zip(rows.row_index, rows.status, strict=True)]
    n = len(rows)
    columns = {name: pa.array(getattr(rows, name), _ROW_TYPES.get(name, pa.string())) for name in ROW_FIELDS}
    columns[WINDOW_START] = pa.array([rows.row_index[0]] * n, pa.int64())
    columns[WINDOW_ROWS] = pa.array([n] * n, pa.int64())
    return pa.table(columns)


def split_windows(batch: pa.Table) -> Iterator[pa.Table]:
    """The whole windows in a batch (one, unless Ray merged blocks); a split window is an error."""
    for start in pc.unique(batch.column(WINDOW_START)).to_pylist():
        window = batch.filter(pc.equal(batch.column(WINDOW_START), start))
        expected = window.column(WINDOW_ROWS)[0].as_py()
        if window.num_rows != expected:
            raise EngineError(f"window at row {start} arrived split ({window.num_rows} of {expected} rows)")
        yield window


# -- the read phase -----------------------------------------------------------------------------------
@dataclass
class _Block:
    ref: Any
    first_row: int
    rows: int


@dataclass
class WindowPlan:
    """A window sent to the model stage: its first row (the part's name), row count and block."""

    start: int
    rows: int
    ref: Any


def _read_dataset(ray: Any, group: list[Source], wanted: list[str]) -> Any:
    """One Ray Dataset over consecutive Parquet files, or over one saved ``datasets`` folder."""
    if group[0].format == "parquet":
        paths = [str(s.path) for s in group]
        return ray.data.read_parquet(paths, partitioning=None, file_extensions=None).select_columns(wanted)
    ds = _load_dataset(group[0].path).select_columns(wanted)
    names = class_label_names(ds)
    out = ray.data.from_huggingface(ds)
    if names:
        out = out.map_batches(name_class_labels, fn_kwargs={"names": names}, batch_format="pyarrow")
    return out


def _groups(sources: list[Source]) -> Iterator[list[Source]]:
    """Runs of consecutive sources of one format (a saved datasets folder alone), in input order."""
    for fmt, run in itertools.groupby(sources, key=lambda s: s.format):
        run = list(run)
        if fmt == "datasets":
            yield from ([s] for s in run)
        else:
            yield run


def _source_blocks(ray: Any, spec: JobSpec, sources: list[Source]) -> list[_Block]:
    """Read every input (as ``check_inputs`` gave them); the blocks in input order, each with its first
    row number."""
    wanted = wanted_columns(spec.text_col, spec.id_col, spec.label_col)
    blocks: list[_Block] = []
    row = 0
    for group in _groups(sources):
        ragged = {src.path: RaggedRows(src.path) for src in group}
        for path, ref, (n, runs) in _read_blocks(ray, group, wanted, spec.window):
            if spec.limit is not None:
                n = min(n, spec.limit - row)
            if n > 0:
                blocks.append(_Block(ref, row, n))
                ragged[path].note((row + a, row + min(b, n)) for a, b in runs if a < n)
                row += n
        for counted in ragged.values():
            counted.warn()
        if spec.limit is not None and row >= spec.limit:
            break
    return blocks


def _read_blocks(
    ray: Any, group: list[Source], wanted: list[str], block_rows: int
) -> list[tuple[Path, Any, tuple[int, list[tuple[int, int]]]]]:
    """A group's blocks in order: the file each comes from (the group's first, where Ray Data read
    them), its object ref, and its :func:`_block_info`."""
    info = ray.remote(_block_info)
    try:
        if group[0].format in _BY_FILE:  # every file at once, a task each
            read = ray.remote(_read_file).options(num_returns="streaming")
            reading = [(src.path, read.remote(src, wanted, block_rows)) for src in group]
            refs = []
            for path, generator in reading:
                *blocks, said = generator
                refs += [(path, ref) for ref in blocks]
                for message in ray.get(said):
                    read_log.warning("%s", message)
        else:
            refs = [(group[0].path, ref) for ref in _read_dataset(ray, group, wanted).to_arrow_refs()]
        found = ray.get([info.remote(ref) for _, ref in refs])
        return [(path, ref, n) for (path, ref), n in zip(refs, found, strict=True)]
    except Exception as e:  # Ray wraps reader errors: the local reader's own message, or the first line
        if isinstance(cause := getattr(e, "cause", None), InputError):
            raise InputError(str(cause)) from None
        where = ", ".join(str(s.path) for s in group[:3]) + (" ..." if len(group) > 3 else "")
        name, message = worker_error(e)
        raise InputError(
            f"{where}: cannot read as {group[0].format}: {name.rpartition('.')[2]}: {message}"
        ) from None


def plan_windows(
    ray: Any,
    spec: JobSpec,
    sources: list[Source],
    skip_until: int = 0,
    skip_ids: IdSet | None = None,
    taken_ids: IdSet | None = None,
) -> tuple[list[WindowPlan], int]:
    """Read the inputs and cut them into windows of ``spec.window`` rows (row numbers from 0 across all
    inputs); returns the windows still to do, and the number of input rows. ``taken_ids``: source ids
    of rows already committed (see ``pipeline.resume_point``)."""
    from .pipeline import _select_rows  # the local engine's rule for skipped and repeated ids

    cols = (spec.text_col, spec.id_col, spec.label_col)
    blocks = _source_blocks(ray, spec, sources)
    total = blocks[-1].first_row + blocks[-1].rows if blocks else 0
    need_keys = spec.id_col is not None or skip_ids is not None
    keys_task = ray.remote(_block_keys)
    key_refs = [keys_task.remote(b.ref, b.first_row, cols) for b in blocks] if need_keys else []
    window_task = ray.remote(_window_block)
    seen_ids = IdSet() | (taken_ids or IdSet()) if spec.id_col else None
    keys: dict[int, tuple[list[str], list[str]]] = {}
    windows: list[WindowPlan] = []
    first = 0  # the first block that can overlap the current window
    for a in range(skip_until - skip_until % spec.window, total, spec.window):
        a, b = max(a, skip_until), min(a + spec.window, total)
        if a >= b:
            continue
        while blocks[first].first_row + blocks[first].rows <= a:
            keys.pop(first, None)
            first += 1
        overlap = []
        for i in range(first, len(blocks)):
            if blocks[i].first_row >= b:
                break
            overlap.append(i)
        pieces = [
            (
                blocks[i].first_row,
                max(a - blocks[i].first_row, 0),
                min(b - blocks[i].first_row, blocks[i].rows),
            )
            for i in overlap
        ]
        keep, status, start, n = None, {}, a, b - a
        if need_keys:
            ids, statuses = [], []
            for i, (_, lo, hi) in zip(overlap, pieces, strict=True):
                if i not in keys:
                    keys[i] = ray.get(key_refs[i])
                ids += keys[i][0][lo:hi]
                statuses += keys[i][1][lo:hi]
            block = RowBatch(list(range(a, b)), ids, [None] * n, [None] * n, statuses)
            rows = _select_rows(block, skip_until, skip_ids, seen_ids)
            if not rows:
                continue
            keep = None if len(rows) == n else [r.row_index for r in rows]
            status = {r.row_index: r.status for r in rows if r.status != statuses[r.row_index - a]}
            start, n = rows[0].row_index, len(rows)
        ref = window_task.remote(cols, pieces, keep, status, *(blocks[i].ref for i in overlap))
        windows.append(WindowPlan(start, n, ref))
    if windows:  # every window is built before the model workers take the CPUs
        ray.wait([w.ref for w in windows], num_returns=len(windows), fetch_local=False)
    return windows, total


def worker_error(e: BaseException) -> tuple[str, str]:
    """(qualified class name, message) of the error a Ray worker first raised, read through the
    wrappers of Ray and Ray Data (which keep the original only as text in the worker's traceback)."""
    root = e
    while isinstance(getattr(root, "cause", None), BaseException):  # RayTaskError.cause
        root = root.cause
    for text in (str(e), str(root)):
        text = _ANSI.sub("", text).split(_DIRECT_CAUSE)[0]
        if "Traceback" in text or "ray::" in text:
            for line in reversed(text.strip().splitlines()):
                if m := _ERROR_LINE.match(line.strip()):
                    return m.group(1), m.group(2)
    lines = str(root).strip().splitlines()
    return f"{type(root).__module__}.{type(root).__qualname__}", lines[0] if lines else ""
