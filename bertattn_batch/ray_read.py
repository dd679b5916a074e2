"""The read phase of ``--engine ray``: Ray Data's readers, global row numbers, windows of rows.

Usage::

    sources = check_inputs(spec.inputs, ...)
    windows, n_rows = plan_windows(ray, spec, sources, skip_until=0)   # [WindowPlan(start, rows, ref), ...]

Every input is read with Ray Data (``read_parquet``, ``read_json``, ``read_csv``, ``read_text``,
``from_huggingface``) in input order; the blocks' sizes give each row its number, counted from 0
across all inputs as ``read_rows`` counts them. Rows are then cut into windows of ``spec.window``
consecutive rows, each built by a small task as one block: the unit of work of the model stage.
This module imports no torch, so the tasks that run it start quickly.

Where Ray Data's readers differ from the local ones: a text file is decoded whole (one invalid UTF-8
byte fails the file, where the local reader marks that line ``invalid_utf8``) and split by
``str.splitlines`` (also at \\r, \\f, \\x85, \\u2028...); JSON lines need one type per key (a
number among strings fails the read, where the local reader gives that row ``not_text``) and a JSON
object on every line (a line cut short fails the read, where the local reader gives it ``not_json``);
a CSV row with the wrong number of fields fails the read (the local reader gives it ``wrong_field_count``).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from .compressed import ARROW_CODECS, compression_of
from .errors import EngineError, InputError
from .ids import IdSet
from .read import (
    RowBatch,
    Source,
    _load_dataset,
    class_label_names,
    column_values,
    csv_options,
    holds_rows,
    name_class_labels,
    to_rows,
    wanted_columns,
)
from .spec import JobSpec

#: Columns of a window block: the RowBatch fields, then the window's first row and its row count.
ROW_FIELDS = tuple(f.name for f in dataclasses.fields(RowBatch))
_ROW_TYPES = {"row_index": pa.int64()}
WINDOW_START, WINDOW_ROWS = "_window_start", "_window_rows"
_JSON_HINT = (
    " (Ray Data's JSON reader needs one type per key, such as strings throughout, and one object a line;"
    " --engine local reads such files, with a status for each value that is not text)"
)
_CSV_HINT = (
    " (Ray Data's CSV reader fails a file with a row of another number of fields than the header;"
    " --engine local reads it, with the status wrong_field_count for that row)"
)
#: How Ray shows a worker's error: a traceback whose last line is "module.Class: message".
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DIRECT_CAUSE = "The above exception was the direct cause of the following exception"
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Invalid|Interrupt|Exit)\w*): (.*)$")


# -- rows: the reader's rules, applied to blocks Ray Data read ----------------------------------------
def _rows(table: pa.Table, first_row: int, lo: int, hi: int, cols: tuple) -> RowBatch:
    """Rows [lo, hi) of a source block whose row 0 is input row ``first_row``; as ``read_rows`` yields them."""
    part = table.slice(lo, hi - lo)
    data = {c: column_values(part.column(c)) for c in cols if c}
    return to_rows(data, first_row + lo, hi - lo, *cols)


def _block_info(table: pa.Table) -> tuple[int, dict[str, pa.DataType]]:
    """A block's row count, and its columns that Arrow read as dates or times, anywhere in their type
    (a list of dates too), each with its type with strings in their place."""
    return table.num_rows, {f.name: _as_strings(f.type) for f in table.schema if _has_dates(f.type)}


def _has_dates(kind: pa.DataType) -> bool:
    return pa.types.is_temporal(kind) or any(_has_dates(kind.field(i).type) for i in range(kind.num_fields))


def _as_strings(kind: pa.DataType) -> pa.DataType:
    """``kind`` with pa.string() for each date or time in it."""
    if pa.types.is_temporal(kind):
        return pa.string()
    if pa.types.is_struct(kind):
        return pa.struct(
            [kind.field(i).with_type(_as_strings(kind.field(i).type)) for i in range(kind.num_fields)]
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        item = kind.value_field.with_type(_as_strings(kind.value_type))
        return pa.list_(item) if pa.types.is_list(kind) else pa.large_list(item)
    return kind


def _block_keys(table: pa.Table, first_row: int, cols: tuple) -> tuple[list[str], list[str]]:
    """(doc ids, statuses) of a block: all the driver needs to find repeated ids in input order."""
    batch = _rows(table, first_row, 0, table.num_rows, cols)
    return batch.doc_id, batch.status


def _window_block(
    cols: tuple, pieces: list[tuple[int, int, int]], keep: list[int] | None, status: dict[int, str], *tables
) -> pa.Table:
    """One window's rows as a block: ``pieces`` are (first_row, lo, hi) of each source block given."""
    rows = RowBatch()
    for (first_row, lo, hi), table in zip(pieces, tables, strict=True):
        piece = _rows(table, first_row, lo, hi, cols)
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


def _read_dataset(
    ray: Any, group: list[Source], wanted: list[str], as_text: dict[str, pa.DataType] | None = None
) -> Any:
    """One Ray Dataset over consecutive sources of one format and compression, read with Ray Data's own
    readers; JSON keys in ``as_text`` are read as the types given (strings where Arrow saw dates)."""
    fmt, paths = group[0].format, [str(s.path) for s in group]
    rd = ray.data
    files = {"partitioning": None, "file_extensions": None}
    kind = _compression(group[0])
    if kind is not None:  # told by the leading bytes, as the local reader tells it, not by the name
        if kind not in ARROW_CODECS:
            raise InputError(
                f"{group[0].path} is {kind}-compressed, which Ray Data cannot read; decompress it, or "
                "run it with --engine local"
            )
        files["arrow_open_stream_args"] = {"compression": kind}
    if fmt == "parquet":
        return rd.read_parquet(paths, **files).select_columns(wanted)
    if fmt == "jsonl":
        if as_text:
            schema = pa.schema(list(as_text.items()))
            files["parse_options"] = pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="infer"
            )
        return rd.read_json(paths, **files).select_columns(wanted)
    if fmt in ("csv", "tsv"):
        parse, convert = csv_options(fmt, wanted)
        return rd.read_csv(paths, **files, parse_options=parse, convert_options=convert)
    if fmt == "text":
        # utf-8-sig: a byte-order mark is no part of the first review, as in the local reader
        return rd.read_text(paths, encoding="utf-8-sig", drop_empty_lines=False, **files)
    if fmt == "datasets":
        ds = _load_dataset(group[0].path).select_columns(wanted)
        names = class_label_names(ds)
        out = rd.from_huggingface(ds)
        if names:
            out = out.map_batches(name_class_labels, fn_kwargs={"names": names}, batch_format="pyarrow")
        return out
    raise InputError(f"unknown input format {fmt!r}")


def _compression(src: Source) -> str | None:
    return None if src.format in ("parquet", "datasets") else compression_of(src.path)


def _groups(sources: list[Source]) -> Iterator[list[Source]]:
    """Runs of consecutive sources of one format and compression (a saved datasets folder alone), in
    input order."""
    for (fmt, _), run in itertools.groupby(sources, key=lambda s: (s.format, _compression(s))):
        run = list(run)
        if fmt == "datasets":
            yield from ([s] for s in run)
        else:
            yield run


def _source_blocks(ray: Any, spec: JobSpec, sources: list[Source]) -> list[_Block]:
    """Read every input (as ``check_inputs`` gave them) with Ray Data; the blocks in input order, each
    with its first row number."""
    wanted = wanted_columns(spec.text_col, spec.id_col, spec.label_col)
    # Files the local reader reads as no rows (empty lines only, a CSV header alone) are passed over:
    # Ray's readers reject some of them. Those it refuses at their start are refused as it refuses them.
    sources = [s for s in sources if s.format in ("parquet", "datasets") or holds_rows(s, wanted)]
    blocks: list[_Block] = []
    row = 0
    for group in _groups(sources):
        refs, sizes, dates = _read_blocks(ray, group, wanted)
        if dates and group[0].format == "jsonl":
            refs, sizes = [], []
            for src in group:  # file by file: another file may hold numbers under the same key
                file_refs, file_sizes, dates = _read_blocks(ray, [src], wanted)
                if dates:
                    # Arrow reads a key whose every value looks like a date as timestamps ("2024-01-01
                    # 00:00:00", a text becomes not_text): read those keys again as the strings they are
                    file_refs, file_sizes, _ = _read_blocks(ray, [src], wanted, as_text=dates)
                refs += file_refs
                sizes += file_sizes
        for ref, n in zip(refs, sizes, strict=True):
            if spec.limit is not None:
                n = min(n, spec.limit - row)
            if n > 0:
                blocks.append(_Block(ref, row, n))
                row += n
        if spec.limit is not None and row >= spec.limit:
            break
    return blocks


def _read_blocks(
    ray: Any, group: list[Source], wanted: list[str], as_text: dict[str, pa.DataType] | None = None
) -> tuple[list[Any], list[int], dict[str, pa.DataType]]:
    """A group's blocks (object refs), their row counts, and the wanted columns some block holds dates
    in, each with its type with strings in their place."""
    info = ray.remote(_block_info)
    try:
        refs = _read_dataset(ray, group, wanted, as_text).to_arrow_refs()
        found = ray.get([info.remote(r) for r in refs])
    except Exception as e:  # Ray wraps reader errors; name the files and the first line
        where = ", ".join(str(s.path) for s in group[:3]) + (" ..." if len(group) > 3 else "")
        name, message = worker_error(e)
        hint = {"jsonl": _JSON_HINT, "csv": _CSV_HINT, "tsv": _CSV_HINT}.get(group[0].format, "")
        raise InputError(
            f"{where}: cannot read as {group[0].format}: {name.rpartition('.')[2]}: {message}{hint}"
        ) from None
    dates = {c: kind for _, cols in found for c, kind in cols.items() if c in wanted}
    return refs, [n for n, _ in found], dates


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
