"""The inputs check: every input row has its predictions row, and the input files are those the run read.

The inputs are read again (in bounded memory): a run whose manifest and parts agree with each other
can still lack rows of its inputs (rows appended since, a part deleted with the manifest edited to
match). A run of plain passes must cover as many rows as the inputs hold (within its ``limit``); a
run of incremental passes goes by id, so every input row with an id must have it among the run's.
"""

from __future__ import annotations

import dataclasses

import polars as pl

from ... import schema
from ...errors import BertAttnError
from ...ids import IdSet
from ...inputs import RowDigests, check_inputs, read_once, read_sources, source_files
from ...run import Manifest, input_changes
from .layout import RunView
from .report import Recorder


def check_inputs_covered(rec: Recorder, run: RunView) -> None:
    try:
        manifest = Manifest.from_dict({**run.manifest, "parts": []})
    except BertAttnError as e:  # the manifest check names what is wrong with it
        rec.skip("inputs", f"the manifest cannot say which inputs were read ({e})")
        return
    spec, inputs = manifest.spec, manifest.inputs
    if not inputs or any(map(read_once, inputs)):
        rec.skip("inputs", "the run read a stream (or names no inputs), which cannot be read again")
        return
    try:
        read_as = dataclasses.replace(manifest.read_options(), label_col=spec.get("label_col"))
        sources = check_inputs(read_as)

        if manifest.sources is not None:
            for change in input_changes(manifest.sources, source_files(sources))[:3]:
                rec.warn("inputs", f"the inputs changed since the run read them: {change}")
        limit = manifest.limit if "limit" in run.manifest else spec.get("limit")  # of the last pass
        # a pass by id since the first, even one that wrote nothing (its inputs may be another file)
        incremental = bool(manifest.generation) or bool({p.generation for p in run.parts} - {0})
        if incremental:
            _check_ids(rec, run, sources, read_as, limit)
        else:
            # a run made with --incremental keeps the text an id had when scored: not compared
            by_row = spec.get("on_existing") != "incremental"
            _check_count(rec, run, sources, read_as, limit, by_row)
    except BertAttnError as e:
        rec.skip("inputs", f"inputs not readable here ({e}); not checked")


def _check_count(rec: Recorder, run: RunView, sources, columns, limit: int | None, by_row: bool) -> None:
    """As many input rows as the run covers, and (a run by row number) the rows of each part as they
    read when it was written (a file edited in place keeps its size, and its ends where the edit is in
    its middle)."""
    committed = RowDigests(run.parts if by_row else [])
    n, changed = 0, []
    for block in read_sources(sources, dataclasses.replace(columns, limit=limit)):
        n += len(block)
        changed += committed.feed(block)
    rec.fail_many(
        "inputs",
        len(changed),
        [
            f"input rows {a}..{b - 1} read otherwise now than when {name} was written (the inputs edited "
            "since?); rerun the extract with --overwrite to redo the run"
            for name, a, b in changed[:3]
        ],
    )
    covered = max((p.end_row for p in run.parts if p.generation == 0), default=0)
    if n > covered and run.status == "complete":
        rec.fail(
            "inputs",
            f"input rows {covered}..{n - 1} have no predictions row (rows added to the inputs since, or a "
            "part removed?); rerun the extract with --incremental to add them, or with --overwrite to redo it",
        )
    elif n > covered:
        rec.note("inputs", f"rows {covered}..{n - 1} are still to do (the run is {run.status})")
    elif n < covered:
        rec.fail("inputs", f"the run holds rows {n}..{covered - 1}, which the inputs no longer have")
    rec.note("inputs", f"{n} input rows" + (f" (limit {limit})" if limit is not None else ""))


def _check_ids(rec: Recorder, run: RunView, sources, columns, limit: int | None) -> None:
    """Every id among the rows the last pass read (its ``limit``: the first rows of the inputs as they
    are now) is in the run; rows past that limit were never asked for."""
    files = [str(run.file(p, "predictions")) for p in run.parts if "predictions" in p.readable]
    ids = IdSet()
    if files:
        no_id = schema.ROW_NUMBER_STATUSES
        found = pl.scan_parquet(files, glob=False).filter(~pl.col("status").is_in(no_id)).select("doc_id")
        ids.update(found.collect(engine="streaming")["doc_id"].to_list())
    missing, first, n = 0, [], 0
    for block in read_sources(sources, dataclasses.replace(columns, limit=limit)):
        for doc_id, status in zip(block.doc_id, block.status, strict=True):
            n += 1
            if status in schema.ROW_NUMBER_STATUSES or doc_id in ids:
                continue
            missing += 1
            if len(first) < 3:
                first.append(doc_id)
    if missing and run.status == "complete":
        rec.fail_many(
            "inputs",
            missing,
            [
                f"input review {d!r} has no predictions row; rerun the extract with --incremental"
                for d in first
            ],
        )
    rec.note("inputs", f"{n} input rows, by id" + (f" (limit {limit})" if limit is not None else ""))
