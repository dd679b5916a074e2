"""The checks of a run's files (its manifest, the files it lists, their schemas and row counts), which
build :class:`RunView`: what the later checks know of the run's parts and their files."""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ... import schema
from ...errors import first_line
from ...model.checks import other_model_files
from ...run import FORMAT, PartEntry, decode_every_page, load_json, model_problems, parse_parts, tmp_name
from .report import ValidationReport


@dataclass
class Part(PartEntry):
    """A committed part, with what the file checks learned of its files."""

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
    live: bool | None  # whether a process writes the run now (None: not known)

    def file(self, part: Part, table: str) -> Path:
        return self.path / part.files[table]

    @property
    def asked(self) -> list[str]:
        """The tables every part must hold: those of every run, and the optional ones its job asked for."""
        spec = self.manifest.get("spec") if isinstance(self.manifest.get("spec"), dict) else {}
        return [*schema.TABLES, *(t for t in schema.OPTIONAL_TABLES if spec.get(t))]

    @property
    def tables(self) -> list[str]:
        """The tables asked for, and any other its parts list: each is checked by its own schema."""
        return list(dict.fromkeys([*self.asked, *(t for p in self.parts for t in p.files)]))


def check_manifest(rec: ValidationReport, path: Path, m: dict[str, Any], live: bool | None) -> RunView:
    """The manifest ``m``'s checks; ``live``: whether a process writes the run now (None: not known)."""
    if m.get("format") != FORMAT:
        rec.fail("manifest", f"format is {m.get('format')!r}, expected {FORMAT!r}")
    status = str(m.get("status"))
    if status == "running" and live is False:
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
    # what the checks below need: a field that is wrong (reported here) or missing is left unchecked
    usable = {k: v for k, v in model.items() if not any(p.startswith(f"model.{k} ") for p in problems)}
    for name in ("layers", "num_heads", "id2label"):
        if name not in model or model[name] in (None, [], {}):
            problems.append(f"model.{name} is {model.get(name)!r}: the run's manifest must name it")
    entries, malformed = parse_parts(m.get("parts"))
    for problem in problems + malformed:
        rec.fail("manifest", problem)
    layers = usable.get("layers") or None
    source = model.get("source")
    if isinstance(source, str) and Path(source).is_dir() and (other := other_model_files(source, model)):
        rec.warn("manifest", f"the model at {source} has {other} than the run records (edited since?): "
                 "faithfulness and plot --pairs refuse it")  # fmt: skip
    _check_spec_layers(rec, m.get("spec"), layers, usable.get("num_layers"))
    parts = [Part(**dataclasses.asdict(e)) for e in entries]
    if status == "complete":
        rec.note("manifest", f"status complete, {len(parts)} parts")
    dtype, attention = (str(model.get(k, "unknown")) for k in ("dtype", "attention"))
    heads, id2label = usable.get("num_heads") or None, usable.get("id2label") or None
    return RunView(
        path, m, status, layers, heads, id2label, dtype, attention, usable.get("max_length"), parts, live
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


def check_files(rec: ValidationReport, run: RunView) -> None:
    """Every listed file there, decodable, of its table's schema and of the rows the manifest records; every
    other file of a table folder named; the totals of a complete run."""
    listed: dict[str, set[str]] = {t: set() for t in run.tables}
    for part in run.parts:
        for table in (t for t in run.asked if t not in part.files):
            rec.fail("files", f"part {part.name}: lists no {table} file, which the run's job asked for")
        for table in part.files:
            rel, want = part.files[table], f"{table}/{part.name}"
            if rel != want:
                rec.fail("files", f"part {part.name}: {table} file is {rel!r}, expected {want!r}")
                continue
            listed[table].add(part.name)
            if run.file(part, table).is_file():
                _check_file(rec, run.file(part, table), part, table)
            elif (run.path / table / tmp_name(part.name)).is_file():  # killed between commit and rename
                listed[table].add(tmp_name(part.name))
                rec.warn("files", f"{rel}: committed, still under its temporary name; a rerun renames it")
            else:
                rec.fail("files", f"{rel}: listed in the manifest but missing")
    _check_unlisted(rec, run, listed)
    rec.note("files", f"{sum(map(len, listed.values()))} files listed in {len(run.parts)} parts")
    rec.note("schema", f"{sum(len(p.file_rows) for p in run.parts)} files read")
    _check_counts(rec, run)


def _check_file(rec: ValidationReport, path: Path, part: Part, table: str) -> None:
    rel = part.files[table]
    try:
        pf = pq.ParquetFile(path)
        decode_every_page(path)  # every value once: a page that no longer decodes hides behind a sound footer
    except Exception as e:  # any reader error means the file is not usable Parquet
        rec.fail("schema", f"{rel}: its data cannot be decoded ({first_line(e)})")
        return
    part.file_rows[table] = pf.metadata.num_rows
    if part.file_rows[table] != part.rows[table]:
        rec.fail("counts", f"{rel}: {pf.metadata.num_rows} rows, the manifest says {part.rows[table]}")
    diffs = schema.check(pf.schema_arrow, table)
    # a required column (as this project writes them) cannot store a null: count them where it may
    names = pf.schema_arrow.names
    may_not = [f.name for f in schema.arrow(table) if not f.nullable and f.name in names]
    nulls = {
        c: sum(b.column(0).null_count for b in pf.iter_batches(columns=[c]))
        for c in may_not
        if pf.schema_arrow.field(c).nullable
    }
    diffs += [f"column {c!r} holds {n} nulls where none may be" for c, n in nulls.items() if n]
    for d in diffs:
        rec.fail("schema", f"{rel}: {d}")
    if not diffs:
        part.readable.add(table)


def _check_unlisted(rec: ValidationReport, run: RunView, listed: dict[str, set[str]]) -> None:
    """What a table folder holds that the manifest does not list (a problem once the run is complete);
    temporaries beside the manifest."""
    live = run.status == "running" and run.live is True
    in_hand = 0
    for table in run.tables:
        folder = run.path / table  # a store has no folders: a run stopped before its first part has none
        for f in sorted(folder.iterdir()) if folder.is_dir() else ():
            rel, temporary = f"{table}/{f.name}", f.name.startswith(("_", "."))
            if f.name in listed[table]:
                continue
            if not temporary and not fnmatch.fnmatch(f.name, "part-*.parquet"):
                rec.warn("files", f"{rel}: unexpected file")
                continue
            unlisted = "not listed in the manifest (readers that glob part-*.parquet read it)"
            what = "leftover temporary file" if temporary else unlisted
            if run.status == "complete":
                rec.fail("files", f"{rel}: {what} in a run marked complete")
            elif live:  # the extract writing the run now is writing it
                in_hand += 1
            else:
                rec.warn("files", f"{rel}: {what} (an uncommitted part; the next resume removes it)")
    for f in sorted(run.path.iterdir()):  # the manifest's or the report's: another command writing, or
        if f.is_file() and f.name.endswith(".tmp"):  # one killed; no part, so no damage
            rec.warn("files", f"{f.name}: a temporary file of a command writing the run's manifest or report")
    if in_hand:
        rec.note("files", f"{in_hand} uncommitted files that the running extract is writing")


def _check_counts(rec: ValidationReport, run: RunView) -> None:
    actual = {t: sum(p.file_rows.get(t, 0) for p in run.parts) for t in run.tables}
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
        elif (
            all(table in p.file_rows for p in run.parts if table in p.files)
            and counts.get(table) != actual[table]
        ):
            rec.fail("counts", f"counts.{table} is {counts.get(table)}, its files hold {actual[table]} rows")
    rec.note("counts", ", ".join(f"{t} {n}" for t, n in actual.items()) + " rows")
