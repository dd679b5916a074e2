"""The checks of a run's files: its manifest, the files it lists, their schemas and row counts.

They build :class:`RunView`, what the later checks know of the run: its parts, and which of their files
exist and match their schema.

Files the manifest does not list (``part-*.parquet``, ``_*``/``.*`` temporaries in a table folder) are
a warning while the run is not complete (an uncommitted part, which the next resume removes) and a
problem once it is. A ``*.tmp`` beside the manifest (the manifest's or a report's) is a warning.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ... import schema
from ...errors import first_line
from ...run import FORMAT, decode_every_page, load_json, model_problems, parse_parts, tmp_name
from .report import ValidationReport


@dataclass
class Part:
    """A manifest part entry, with what the files check learned about its files."""

    name: str
    start_row: int
    end_row: int
    generation: int
    rel: dict[str, str]
    rows: dict[str, int]
    rows_digest: str = ""  # of its input rows as read (inputs/digest.py)
    readable: set[str] = field(default_factory=set)  # tables whose file exists and matches its schema
    file_rows: dict[str, int] = field(default_factory=dict)


@dataclass
class RunView:
    path: Path
    manifest: dict[str, Any]
    status: str
    layers: list[int] | None
    num_heads: int | None
    id2label: dict[str, str] | None
    dtype: str
    attention: str
    max_length: int | None
    parts: list[Part]
    writing: Callable[[], bool | None] = lambda: None  # whether a process writes the run now
    #: the tables every part must hold: those of every run, and the optional ones the job asked for
    tables: tuple[str, ...] = schema.TABLES

    def file(self, part: Part, table: str) -> Path:
        return self.path / part.rel[table]


def check_manifest(
    rec: ValidationReport, path: Path, m: dict[str, Any], writing: Callable[[], bool | None] = lambda: None
) -> RunView:
    """``writing``: asks whether a process writes the run now (``run.writer_is_live``; None: unknown),
    after its manifest ``m`` was read (a job that ends in between is told by reading it again)."""
    if m.get("format") != FORMAT:
        rec.fail("manifest", f"format is {m.get('format')!r}, expected {FORMAT!r}")
    status = str(m.get("status"))
    if status == "running" and writing() is False:
        ended = load_json(path)  # the job may have ended between the read and the probe
        if ended.get("status") == "running":
            rec.warn(
                "manifest",
                "status 'running', but no process is writing it: it was stopped (killed, or its last "
                "manifest write failed)",
            )
            status = "interrupted"  # rerunning the extract resumes it
        else:  # checked as it ended
            m, status = ended, str(ended.get("status"))
            rec.note("manifest", f"the run's job ended ({status}) while it was read; checked as it ended")
    if status in ("running", "interrupted"):
        rec.warn("manifest", f"status {status!r}: committed parts are checked, totals are not final")
    elif status != "complete":
        rec.fail("manifest", f"unknown status {status!r}")
    model = m.get("model") if isinstance(m.get("model"), dict) else {}
    problems = model_problems(model)
    for problem in problems:
        rec.fail("manifest", problem)
    # what the checks below need: a field that is wrong (just reported) or missing is left unchecked
    usable = {
        name: model.get(name) for name in model if not any(p.startswith(f"model.{name} ") for p in problems)
    }
    for name in ("layers", "num_heads", "id2label"):
        if not usable.get(name):
            if name not in model or model[name] in (None, [], {}):
                rec.fail("manifest", f"model.{name} is {model.get(name)!r}: the run's manifest must name it")
            usable[name] = None
    layers, heads, id2label = usable["layers"], usable["num_heads"], usable["id2label"]
    _check_spec_layers(rec, m.get("spec"), layers, usable.get("num_layers"))
    max_length = usable.get("max_length")
    parts = _parse_parts(rec, m.get("parts"))
    if status == "complete":
        rec.note("manifest", f"status complete, {len(parts)} parts")
    spec = m.get("spec") if isinstance(m.get("spec"), dict) else {}
    asked = [t for t in schema.OPTIONAL_TABLES if spec.get(t) or any(t in p.rel for p in parts)]
    return RunView(
        path=path,
        manifest=m,
        status=status,
        layers=layers,
        num_heads=heads,
        id2label=id2label,
        dtype=str(model.get("dtype", "unknown")),
        attention=str(model.get("attention", "unknown")),
        max_length=max_length,
        parts=parts,
        writing=writing,
        tables=(*schema.TABLES, *asked),
    )


def _check_spec_layers(rec: ValidationReport, spec: Any, layers: list[int] | None, num_layers: Any) -> None:
    """The layers the job asked for (``spec.layers``, negative from the end) are the ones stored."""
    asked = spec.get("layers") if isinstance(spec, dict) else None
    if not layers or not isinstance(num_layers, int) or not isinstance(asked, list):
        return  # what is missing or malformed is named by the checks above
    if not all(isinstance(x, int) for x in asked):
        rec.fail("manifest", f"spec.layers is {asked!r}, expected layer numbers")
    elif [x + num_layers if x < 0 else x for x in asked] != list(layers):
        rec.fail(
            "manifest",
            f"spec.layers {asked} name layers {[x % num_layers for x in asked]} of {num_layers}, but "
            f"model.layers (the layers stored) is {layers}",
        )


def _parse_parts(rec: ValidationReport, entries: Any) -> list[Part]:
    parsed, problems = parse_parts(entries)
    for problem in problems:
        rec.fail("manifest", problem)
    parts: list[Part] = []
    seen: set[str] = set()
    for e in parsed:
        part = Part(e.name, e.start_row, e.end_row, e.generation, dict(e.files), dict(e.rows), e.rows_digest)
        if part.name in seen:
            rec.fail("manifest", f"part {part.name} is listed twice")
            continue
        if part.end_row < part.start_row:
            rec.fail("manifest", f"part {part.name}: end_row {part.end_row} < start_row {part.start_row}")
        seen.add(part.name)
        parts.append(part)
    return parts


def check_files(rec: ValidationReport, run: RunView) -> None:
    complete = run.status == "complete"
    live = run.status == "running" and run.writing() is True
    in_hand: list[str] = []

    def uncommitted(rel: str, what: str) -> None:
        if complete:
            rec.fail("files", f"{rel}: {what} in a run marked complete")
        elif live:  # the extract writing the run now is writing it
            in_hand.append(rel)
        else:
            rec.warn("files", f"{rel}: {what} (an uncommitted part; the next resume removes it)")

    listed: dict[str, set[str]] = {t: set() for t in run.tables}
    n_files = 0
    for part in run.parts:
        for table in run.tables:
            rel = part.rel.get(table)
            if rel is None:
                rec.fail("files", f"part {part.name}: lists no {table} file, which the run's job asked for")
                continue
            want = f"{table}/{part.name}"
            if rel != want:
                rec.fail("files", f"part {part.name}: {table} file is {rel!r}, expected {want!r}")
                continue
            listed[table].add(part.name)
            n_files += 1
            if run.file(part, table).is_file():
                continue
            if (run.path / table / tmp_name(part.name)).is_file():  # killed between commit and rename
                listed[table].add(tmp_name(part.name))
                rec.warn("files", f"{rel}: committed, still under its temporary name; a rerun renames it")
            else:
                rec.fail("files", f"{rel}: listed in the manifest but missing")
    for table in run.tables:
        folder = run.path / table
        if not folder.is_dir():  # a store has no folders: a run stopped before its first part has none
            continue  # (a listed part's missing file is named above)
        for f in sorted(folder.iterdir()):
            rel = f"{table}/{f.name}"
            if f.name in listed[table]:
                continue
            if f.name.startswith(("_", ".")):
                uncommitted(rel, "leftover temporary file")
            elif fnmatch.fnmatch(f.name, "part-*.parquet"):
                uncommitted(rel, "not listed in the manifest (readers that glob part-*.parquet read it)")
            else:
                rec.warn("files", f"{rel}: unexpected file")
    for f in sorted(run.path.iterdir()):  # the manifest's or the report's: another command writing, or
        if f.is_file() and f.name.endswith(".tmp"):  # one killed; no part, so no damage
            rec.warn("files", f"{f.name}: a temporary file of a command writing the run's manifest or report")
    if in_hand:
        rec.note("files", f"{len(in_hand)} uncommitted files that the running extract is writing")
    rec.note("files", f"{n_files} files listed in {len(run.parts)} parts")


def check_schemas(rec: ValidationReport, run: RunView) -> None:
    checked = 0
    for part in run.parts:
        for table in run.tables:
            if part.rel.get(table) != f"{table}/{part.name}" or not run.file(part, table).is_file():
                continue
            path = run.file(part, table)
            try:
                pf = pq.ParquetFile(path)
            except Exception as e:  # any reader error means the file is not usable Parquet
                rec.fail("schema", f"{part.rel[table]}: not readable as Parquet ({first_line(e)})")
                continue
            try:  # every value once: a page that no longer decodes hides behind a sound footer
                decode_every_page(path)
            except Exception as e:
                rec.fail("schema", f"{part.rel[table]}: its data cannot be decoded ({first_line(e)})")
                continue
            checked += 1
            part.file_rows[table] = pf.metadata.num_rows
            diffs = schema.check(pf.schema_arrow, table)
            for d in diffs:
                rec.fail("schema", f"{part.rel[table]}: {d}")
            nulls = _null_counts(pf, table)
            for col, n in nulls.items():
                rec.fail("schema", f"{part.rel[table]}: column {col!r} holds {n} nulls where none may be")
            if not diffs and not nulls:
                part.readable.add(table)
    rec.note("schema", f"{checked} files read")


def _null_counts(pf: pq.ParquetFile, table: str) -> dict[str, int]:
    """Nulls in the columns that may hold none, counted where the file declares the column nullable (a
    required column, as this project writes them, cannot store a null)."""
    names = pf.schema_arrow.names
    may = [f.name for f in schema.arrow(table) if not f.nullable and f.name in names]
    counts = {
        c: sum(b.column(0).null_count for b in pf.iter_batches(columns=[c]))
        for c in may
        if pf.schema_arrow.field(c).nullable
    }
    return {c: n for c, n in counts.items() if n}


def check_counts(rec: ValidationReport, run: RunView) -> None:
    actual: dict[str, int] = dict.fromkeys(run.tables, 0)
    complete_tables = set(run.tables)
    for part in run.parts:
        for table in run.tables:
            n = part.file_rows.get(table)
            if n is None:
                complete_tables.discard(table)
                continue
            actual[table] += n
            if n != part.rows[table]:
                rec.fail("counts", f"{part.rel[table]}: {n} rows, the manifest says {part.rows[table]}")
    if run.status != "complete":
        rec.note("counts", "totals not checked: the run is not complete")
        return
    counts = run.manifest.get("counts")
    if not isinstance(counts, dict):
        rec.fail("counts", "the manifest of a complete run has no counts")
        return
    for table in run.tables:
        listed = sum(p.rows.get(table, 0) for p in run.parts)
        if counts.get(table) != listed:
            rec.fail("counts", f"counts.{table} is {counts.get(table)}, its parts list {listed} rows")
        elif table in complete_tables and counts.get(table) != actual[table]:
            rec.fail("counts", f"counts.{table} is {counts.get(table)}, its files hold {actual[table]} rows")
    rec.note("counts", ", ".join(f"{t} {actual[t]}" for t in run.tables) + " rows")
