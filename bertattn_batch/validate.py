"""Check a run directory against ``schemas/`` and its own manifest, and report every problem found.

Usage::

    bertattn validate runs/r1              # one line per check; exit status 1 on any problem
    bertattn validate runs/r1 --no-source  # do not re-read the inputs for the span check

    from bertattn_batch.validate import validate_run
    report = validate_run("runs/r1")
    report.ok, report.problems, report.checks
    print(report.render())

Why: a run is read by other tools long after it was written. This says whether its files are the ones
the manifest committed, and whether the numbers in them keep the promises extraction makes: every input
row has one predictions row, each head's [CLS] row sums to 1, the scaled weights are that head's
min-max of the raw ones, every scored review has exactly its content tokens 1 .. n-2.

Memory stays bounded: predictions-level checks are polars lazy queries over all parts (one row per
review); per-(review, layer, head) checks run part by part (a part holds one window of reviews); the
span check streams the source alongside the parts, holding one part's reviews at a time.

Files the manifest does not list (``part-*.parquet`` files, ``_*``/``.*`` temporaries in a table folder,
``*.tmp`` beside the manifest) are a warning while the run is not complete (an uncommitted part, which
the next resume removes; a distributed run publishes a part's files just before the driver lists it)
and a problem once the manifest says complete (a finished run has listed and renamed every part).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from . import schema
from .errors import BertAttnError, first_line
from .read import read_rows
from .write import FORMAT, part_generation, read_manifest, row_range_problems, run_inputs, tmp_name

#: The checks, in report order, with what each one promises.
CHECKS = {
    "manifest": "manifest readable, same format and schema versions, run complete",
    "files": "every listed part exists; no unlisted part files, no leftovers",
    "schema": "every part's columns and types equal schemas/, no nulls where none may be",
    "counts": "rows of every part and the run's totals equal the manifest's",
    "row_index": "every input row once: parts cover their row ranges, generation 0 covers 0..N-1",
    "doc_id": "doc ids unique among scored reviews",
    "predictions": "statuses known; probs sum to 1 and pred_id is their argmax when scored, null if not",
    "layers_heads": "every scored review has each manifest layer x heads 0..H-1 once, no other review any",
    "positions": "each head covers positions 1..n-2 once; rows = n_content = n_tokens - 2",
    "tokens": "a review's position has one token id, token and span in all its layers and heads; "
    "a token id one token",
    "attention_mass": "per head: content weights + [CLS] + [SEP] = 1, every weight in [0, 1]",
    "scaling": "weight_scaled in [0, 1] and = (w - min)/(max - min), 0 with no range; min/max of the weights",
    "spans": "0 <= start <= end <= the review text's length",
}
#: |sum(probs) - 1| allowed: probabilities are a float32 softmax whatever the model's dtype.
PROBS_TOLERANCE = 1e-4
#: |content + [CLS] + [SEP] - 1| allowed, by the run's dtype. Eager attention in bf16/fp16 is a softmax
#: rounded to half precision (measured: up to 1e-3 off on 250-token reviews); the SDPA capture computes
#: the row in float32 whatever the model's dtype (measured: 1.3e-7), so it gets float32's tolerance.
MASS_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2, "float16": 2e-2}
MASS_TOLERANCE_DEFAULT = 2e-2
#: |weight_scaled - (w - min)/(max - min)| allowed (both computed from the stored float32 weights).
SCALED_TOLERANCE = 1e-4
#: |weight_min/max - min/max of the stored weights| allowed (the same float32 numbers when intact).
MINMAX_TOLERANCE = 1e-6
#: Examples shown per check in the report, and problems kept per check in ``ValidationReport``.
SHOWN = 3
KEPT = 20

_KEYS = ["doc_id", "layer", "head"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a run (``severity`` 'problem') or worth knowing (``severity`` 'warning')."""

    check: str
    message: str
    severity: str = "problem"


@dataclass
class Check:
    """One check's outcome; ``problems``/``warnings`` are exact counts, ``examples`` the first few."""

    name: str
    description: str
    problems: int = 0
    warnings: int = 0
    examples: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def status(self) -> str:
        if self.problems:
            return "FAIL"
        if self.skipped:
            return "SKIP"
        return "WARN" if self.warnings else "ok"

    def line(self) -> str:
        parts = []
        if self.problems:
            parts.append(f"{self.problems} problem{'s' if self.problems != 1 else ''}")
        if self.warnings:
            parts.append(f"{self.warnings} warning{'s' if self.warnings != 1 else ''}")
        if self.skipped:
            parts.append(f"skipped: {self.skipped}")
        parts.extend(self.notes)
        return f"{self.status:<4}  {self.name:<14}  {'; '.join(parts) or self.description}"


@dataclass
class ValidationReport:
    """Every check run over a run directory, and the problems and warnings they found."""

    run_dir: str
    checks: list[Check]
    problems: list[Problem]
    warnings: list[Problem]
    header: str = ""

    @property
    def ok(self) -> bool:
        return not any(c.problems for c in self.checks)

    @property
    def problem_count(self) -> int:
        return sum(c.problems for c in self.checks)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def render(self) -> str:
        lines = [self.header or self.run_dir]
        for c in self.checks:
            lines.append(c.line())
            for ex in c.examples[:SHOWN]:
                lines.append(f"        - {ex}")
            hidden = c.problems + c.warnings - min(len(c.examples), SHOWN)
            if c.examples and hidden > 0:
                lines.append(f"        ... and {hidden} more")
        if self.ok:
            n_warn = sum(c.warnings for c in self.checks)
            n_skip = sum(1 for c in self.checks if c.skipped)
            lines.append(
                f"clean: {len(self.checks) - n_skip} checks passed"
                + (f", {n_skip} skipped" if n_skip else "")
                + (f", {n_warn} warnings" if n_warn else "")
            )
        else:
            failed = sum(1 for c in self.checks if c.problems)
            problems = "1 problem" if self.problem_count == 1 else f"{self.problem_count} problems"
            lines.append(f"damaged: {problems} in {failed} of {len(self.checks)} checks")
        return "\n".join(lines)


class _Recorder:
    """Collects findings per check; keeps exact counts and the first few messages."""

    def __init__(self) -> None:
        self.checks = {name: Check(name, desc) for name, desc in CHECKS.items()}
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []

    def fail(self, check: str, message: str) -> None:
        self.fail_many(check, 1, [message])

    def fail_many(self, check: str, count: int, examples: Iterable[str]) -> None:
        if count <= 0:
            return
        c = self.checks[check]
        kept = sum(1 for p in self.problems if p.check == check)
        for msg in list(examples)[: max(0, KEPT - kept)]:
            self.problems.append(Problem(check, msg))
            if len(c.examples) < KEPT:
                c.examples.append(msg)
        c.problems += count

    def warn(self, check: str, message: str) -> None:
        c = self.checks[check]
        c.warnings += 1
        if sum(1 for p in self.warnings if p.check == check) < KEPT:
            self.warnings.append(Problem(check, message, "warning"))
            c.examples.append(f"warning: {message}")

    def note(self, check: str, text: str) -> None:
        self.checks[check].notes.append(text)

    def skip(self, check: str, reason: str) -> None:
        self.checks[check].skipped = reason


@dataclass
class _Part:
    """A manifest part entry, with what the files check learned about its files."""

    name: str
    start_row: int
    end_row: int
    generation: int
    rel: dict[str, str]
    rows: dict[str, int]
    readable: set[str] = field(default_factory=set)  # tables whose file exists and matches its schema
    file_rows: dict[str, int] = field(default_factory=dict)


@dataclass
class _Run:
    path: Path
    manifest: dict[str, Any]
    status: str
    layers: list[int] | None
    num_heads: int | None
    id2label: dict[str, str] | None
    dtype: str
    attention: str
    max_length: int | None
    parts: list[_Part]

    def file(self, part: _Part, table: str) -> Path:
        return self.path / part.rel[table]


def validate_run(run_dir: str | Path, check_source: bool = True) -> ValidationReport:
    """Run every check on ``run_dir``; raise RunDirError only when it is not a readable run directory."""
    path = Path(run_dir)
    manifest = read_manifest(path, check_parts=False)
    rec = _Recorder()
    run = _check_manifest(rec, path, manifest)
    _check_files(rec, run)
    _check_schemas(rec, run)
    _check_counts(rec, run)
    statuses = _check_predictions(rec, run)
    _check_attention(rec, run)
    if check_source:
        _check_source_spans(rec, run)
    else:
        rec.skip("spans", "--no-source: end <= text length not checked")
    return ValidationReport(
        run_dir=str(path),
        checks=list(rec.checks.values()),
        problems=rec.problems,
        warnings=rec.warnings,
        header=_header(run, statuses),
    )


def _header(run: _Run, statuses: dict[str, int]) -> str:
    n = sum(statuses.values())
    others = ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()) if k != "ok")
    return (
        f"{run.path}: status {run.status}, {len(run.parts)} parts, {n} reviews "
        f"({statuses.get('ok', 0)} scored{', ' + others if others else ''}), layers {run.layers}, "
        f"{run.num_heads} heads, {run.dtype}"
    )


# -- manifest, files, schemas, counts -----------------------------------------------------------------


def _check_manifest(rec: _Recorder, path: Path, m: dict[str, Any]) -> _Run:
    if m.get("format") != FORMAT:
        rec.fail("manifest", f"format is {m.get('format')!r}, expected {FORMAT!r}")
    if m.get("schema_versions") != schema.versions():
        rec.fail(
            "manifest",
            f"schema versions {m.get('schema_versions')} differ from this version's {schema.versions()}",
        )
    status = str(m.get("status"))
    if status in ("running", "interrupted"):
        rec.warn("manifest", f"status {status!r}: committed parts are checked, totals are not final")
    elif status != "complete":
        rec.fail("manifest", f"unknown status {status!r}")
    model = m.get("model") if isinstance(m.get("model"), dict) else {}
    layers = model.get("layers")
    if not (isinstance(layers, list) and layers and all(isinstance(x, int) for x in layers)):
        rec.fail("manifest", f"model.layers is {layers!r}, expected a list of layer indices")
        layers = None
    heads = model.get("num_heads")
    if not (isinstance(heads, int) and heads > 0):
        rec.fail("manifest", f"model.num_heads is {heads!r}, expected a positive integer")
        heads = None
    id2label = model.get("id2label")
    if not (isinstance(id2label, dict) and id2label):
        rec.fail("manifest", f"model.id2label is {id2label!r}, expected a mapping")
        id2label = None
    max_length = model.get("max_length") if isinstance(model.get("max_length"), int) else None
    parts = _parse_parts(rec, m.get("parts"))
    if status == "complete":
        rec.note("manifest", f"status complete, {len(parts)} parts")
    return _Run(
        path=path,
        manifest=m,
        status=status,
        layers=layers,
        num_heads=heads,
        id2label={str(k): str(v) for k, v in id2label.items()} if id2label else None,
        dtype=str(model.get("dtype", "unknown")),
        attention=str(model.get("attention", "unknown")),
        max_length=max_length,
        parts=parts,
    )


def _parse_parts(rec: _Recorder, entries: Any) -> list[_Part]:
    if not isinstance(entries, list):
        rec.fail("manifest", f"parts is {type(entries).__name__}, expected a list")
        return []
    parts: list[_Part] = []
    seen: set[str] = set()
    for i, e in enumerate(entries):
        try:
            part = _Part(
                name=str(e["name"]),
                start_row=int(e["start_row"]),
                end_row=int(e["end_row"]),
                generation=part_generation(e),
                rel={t: str(e["files"][t]) for t in schema.TABLES},
                rows={t: int(e["rows"][t]) for t in schema.TABLES},
            )
        except (KeyError, TypeError, ValueError) as err:
            rec.fail("manifest", f"parts[{i}] is malformed (missing or bad {err})")
            continue
        if part.name in seen:
            rec.fail("manifest", f"part {part.name} is listed twice")
            continue
        if part.end_row < part.start_row:
            rec.fail("manifest", f"part {part.name}: end_row {part.end_row} < start_row {part.start_row}")
        seen.add(part.name)
        parts.append(part)
    return parts


def _check_files(rec: _Recorder, run: _Run) -> None:
    complete = run.status == "complete"

    def uncommitted(rel: str, what: str) -> None:
        if complete:
            rec.fail("files", f"{rel}: {what} in a run marked complete")
        else:
            rec.warn("files", f"{rel}: {what} (an uncommitted part; the next resume removes it)")

    listed: dict[str, set[str]] = {t: set() for t in schema.TABLES}
    n_files = 0
    for part in run.parts:
        for table in schema.TABLES:
            rel = part.rel[table]
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
    for table in schema.TABLES:
        folder = run.path / table
        if not folder.is_dir():
            rec.fail("files", f"{table}/: folder missing")
            continue
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
    for f in sorted(run.path.iterdir()):
        if f.is_file() and f.name.endswith(".tmp"):
            uncommitted(f.name, "leftover temporary file")
    rec.note("files", f"{n_files} files listed in {len(run.parts)} parts")


def _check_schemas(rec: _Recorder, run: _Run) -> None:
    checked = 0
    for part in run.parts:
        for table in schema.TABLES:
            path = run.file(part, table)
            if part.rel[table] != f"{table}/{part.name}" or not path.is_file():
                continue
            try:
                pf = pq.ParquetFile(path)
            except Exception as e:  # any reader error means the file is not usable Parquet
                rec.fail("schema", f"{part.rel[table]}: not readable as Parquet ({first_line(e)})")
                continue
            try:  # every value once: a page that no longer decodes hides behind a sound footer
                for _ in pf.iter_batches(batch_size=1 << 16):
                    pass
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
    """Nulls in non-nullable columns, from the row groups' statistics (counted from data if absent)."""
    wanted = [f.name for f in schema.arrow(table) if not f.nullable and f.name in pf.schema_arrow.names]
    md = pf.metadata
    index = {md.schema.column(i).path: i for i in range(md.num_columns)}
    out: dict[str, int] = {}
    for name in wanted:
        total = 0
        for rg in range(md.num_row_groups):
            i = index.get(name)
            stats = md.row_group(rg).column(i).statistics if i is not None else None
            if stats is None or not stats.has_null_count:
                total = pf.read(columns=[name]).column(name).null_count
                break
            total += stats.null_count
        if total:
            out[name] = total
    return out


def _check_counts(rec: _Recorder, run: _Run) -> None:
    actual: dict[str, int] = dict.fromkeys(schema.TABLES, 0)
    complete_tables = set(schema.TABLES)
    for part in run.parts:
        for table in schema.TABLES:
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
    for table in schema.TABLES:
        listed = sum(p.rows[table] for p in run.parts)
        if counts.get(table) != listed:
            rec.fail("counts", f"counts.{table} is {counts.get(table)}, its parts list {listed} rows")
        elif table in complete_tables and counts.get(table) != actual[table]:
            rec.fail("counts", f"counts.{table} is {counts.get(table)}, its files hold {actual[table]} rows")
    rec.note("counts", ", ".join(f"{t} {actual[t]}" for t in schema.TABLES) + " rows")


# -- predictions --------------------------------------------------------------------------------------


def _check_predictions(rec: _Recorder, run: _Run) -> dict[str, int]:
    """row_index, doc_id and predictions checks over every readable predictions part; status counts."""
    parts = [p for p in run.parts if "predictions" in p.readable]
    _check_row_ranges(rec, run)
    if not parts:
        for check in ("row_index", "doc_id", "predictions"):
            rec.skip(check, "no readable predictions parts")
        return {}
    by_file = {str(run.file(p, "predictions")): p for p in parts}
    lf = pl.scan_parquet(list(by_file), include_file_paths="_file", glob=False).with_columns(
        pl.col("_file").replace_strict({f: p.rel["predictions"] for f, p in by_file.items()})
    )
    statuses = dict(
        lf.group_by("status").agg(pl.len()).collect(engine="streaming").iter_rows()  # (status, n)
    )

    per_file = lf.group_by("_file").agg(
        n=pl.len(),
        lo=pl.col("row_index").min(),
        hi=pl.col("row_index").max(),
        distinct=pl.col("row_index").n_unique(),
    )
    rel_to_part = {p.rel["predictions"]: p for p in parts}
    for rel, n, lo, hi, distinct in per_file.collect(engine="streaming").iter_rows():
        p = rel_to_part[rel]
        if p.generation == 0:
            good = n == distinct == p.end_row - p.start_row and lo == p.start_row and hi == p.end_row - 1
            want = f"each of {p.start_row}..{p.end_row - 1} once"
        else:
            good = n == distinct and (n == 0 or (lo >= p.start_row and hi < p.end_row))
            want = f"distinct indices within {p.start_row}..{p.end_row - 1}"
        if not good:
            rec.fail(
                "row_index",
                f"{rel}: {n} rows, {distinct} distinct row_index in {lo}..{hi}; expected {want}",
            )
    rec.note("row_index", f"{sum(statuses.values())} rows in {len(parts)} parts")

    dups = (
        lf.filter(pl.col("status") == "ok")
        .group_by("doc_id")
        .agg(n=pl.len(), files=pl.col("_file").unique().sort().head(2))
        .filter(pl.col("n") > 1)
        .sort("doc_id")
        .collect(engine="streaming")
    )
    rec.fail_many(
        "doc_id",
        dups.height,
        (f"doc {d!r} scored {n} times ({', '.join(f)})" for d, n, f in dups.head(KEPT).iter_rows()),
    )
    rec.note("doc_id", f"{statuses.get('ok', 0)} scored reviews")
    _apply_rules(rec, lf, _prediction_rules(run))
    labels = f", {len(run.id2label)} labels" if run.id2label else ""
    rec.note("predictions", f"{sum(statuses.values())} rows{labels}")
    return statuses


def _check_row_ranges(rec: _Recorder, run: _Run) -> None:
    """Generation 0's parts tile 0..N-1 with no gap or overlap; later generations do not overlap."""
    for problem in row_range_problems((p.generation, p.start_row, p.end_row) for p in run.parts):
        rec.fail("row_index", problem)


Rule = tuple[str, pl.Expr, pl.Expr]  # (check, True where a row breaks it, message for such a row)


def _fmt(template: str, *args: str | pl.Expr) -> pl.Expr:
    """``pl.format`` where a plain string names a column; floats are shown to 6 decimals."""
    return pl.format(template, *(pl.col(a) if isinstance(a, str) else a for a in args))


def _r(name: str) -> pl.Expr:
    return pl.col(name).cast(pl.Float64).round(6)


def _prediction_rules(run: _Run) -> list[Rule]:
    ok = pl.col("status") == "ok"
    probs, pred_id = pl.col("probs"), pl.col("pred_id")
    at = _fmt("{} row {} doc '{}'", "_file", "row_index", "doc_id")
    argmax = probs.list.arg_max()
    total = probs.list.sum().cast(pl.Float64)
    predicted = probs.is_not_null() | pred_id.is_not_null() | pl.col("pred_label").is_not_null()
    top = run.max_length or 2**31 - 1
    rules = [
        (~pl.col("status").is_in(schema.STATUSES), _fmt("{}: unknown status '{}'", at, "status")),
        (ok & probs.is_null(), _fmt("{}: scored but probs is null", at)),
        (ok & ~((total - 1).abs() <= PROBS_TOLERANCE), _fmt("{}: probs sum to {}", at, total.round(6))),
        (
            ok & (pred_id.is_null() | (pred_id != argmax)),
            _fmt("{}: pred_id {} is not the argmax {} of probs", at, "pred_id", argmax),
        ),
        (
            ok & ~pl.col("n_tokens").is_between(3, top),
            _fmt("{}: scored with n_tokens {}, expected 3..{}", at, "n_tokens", pl.lit(top)),
        ),
        (
            ~ok & (predicted | (pl.col("n_tokens") != 0)),
            _fmt("{}: status '{}' but a prediction or n_tokens {}", at, "status", "n_tokens"),
        ),
    ]
    if run.id2label:
        n = len(run.id2label)
        label = pred_id.cast(pl.String).replace_strict(run.id2label, default=None, return_dtype=pl.String)
        rules += [
            (
                ok & (probs.list.len() != n),
                _fmt("{}: {} probs for {} labels", at, probs.list.len(), pl.lit(n)),
            ),
            (
                ok & (label.is_null() | (pl.col("pred_label") != label)),
                _fmt("{}: pred_label '{}' is not id2label[{}]", at, "pred_label", "pred_id"),
            ),
        ]
    return [("predictions", bad, msg) for bad, msg in rules]


def _apply_rules(rec: _Recorder, lf: pl.LazyFrame, rules: list[Rule]) -> None:
    """Count the rows breaking each rule in one pass over ``lf``; format messages only for broken rules."""
    flags = [bad.fill_null(False) for _, bad, _ in rules]
    counts = (
        lf.select([f.sum().alias(f"n{i}") for i, f in enumerate(flags)]).collect(engine="streaming").row(0)
    )
    for (check, _, msg), flag, n in zip(rules, flags, counts, strict=True):
        if n:
            examples = lf.filter(flag).head(KEPT).select(msg).collect(engine="streaming").to_series()
            rec.fail_many(check, int(n), examples.to_list())


# -- attention, part by part --------------------------------------------------------------------------


def _mass_tolerance(run: _Run) -> float:
    if run.attention == "sdpa":  # the capture's softmax is float32 in every dtype
        return MASS_TOLERANCE["float32"]
    return MASS_TOLERANCE.get(run.dtype, MASS_TOLERANCE_DEFAULT)


def _check_attention(rec: _Recorder, run: _Run) -> None:
    checks = ("layers_heads", "positions", "tokens", "attention_mass", "scaling")
    if run.layers is None or run.num_heads is None:
        for c in checks:
            rec.skip(c, "the manifest lacks model.layers or model.num_heads")
        return
    parts = [p for p in run.parts if p.readable >= set(schema.TABLES)]
    skipped = len(run.parts) - len(parts)
    heads = 0
    spellings = []  # each part's distinct (token_id, token) pairs
    for part in parts:
        n, spelling = _check_part_attention(rec, run, part)
        heads += n
        spellings.append(spelling)
    if spellings:
        pairs = pl.concat(spellings).unique()
        rec.note("tokens", f"{pairs.height} distinct tokens")
        clashes = (
            pairs.group_by("token_id")
            .agg(pl.col("token").sort())
            .filter(pl.col("token").list.len() > 1)
            .sort("token_id")
        )
        rec.fail_many(
            "tokens",
            clashes.height,
            (
                f"token id {i} is written as {', '.join(map(repr, t))}"
                for i, t in clashes.head(KEPT).iter_rows()
            ),
        )
    tol = _mass_tolerance(run)
    rec.note("layers_heads", f"layers {run.layers} x {run.num_heads} heads")
    rec.note("positions", f"{heads} (review, layer, head) rows")
    rec.note("attention_mass", f"tolerance {tol:g} ({run.dtype}, {run.attention})")
    rec.note("scaling", f"tolerance {SCALED_TOLERANCE:g}")
    if skipped:
        for c in (*checks, "spans"):
            rec.note(c, f"{skipped} parts with a missing or bad file not checked")


def _check_part_attention(rec: _Recorder, run: _Run, part: _Part) -> tuple[int, pl.DataFrame]:
    """Per-(review, layer, head) checks of one part; returns how many head_summary rows it checked and
    its distinct (token_id, token) pairs, which the run's parts must agree on."""
    assert run.layers is not None and run.num_heads is not None
    rel_attn, rel_sum = part.rel["cls_attention"], part.rel["head_summary"]
    pred = pl.read_parquet(
        run.file(part, "predictions"), columns=["doc_id", "status", "n_tokens"], glob=False
    )
    scored = pred.filter(pl.col("status") == "ok").select("doc_id", "n_tokens").unique("doc_id")
    summary = pl.read_parquet(run.file(part, "head_summary"), glob=False)  # reviews x layers x heads rows
    attn = pl.scan_parquet(run.file(part, "cls_attention"), glob=False)
    layer_ok = pl.col("layer").is_in(run.layers) & pl.col("head").is_between(0, run.num_heads - 1)
    key = _fmt("doc '{}' layer {} head {}", "doc_id", "layer", "head")

    def report(check: str, rows: pl.DataFrame, message: pl.Expr) -> None:
        rec.fail_many(check, rows.height, rows.head(KEPT).select(message).to_series().to_list())

    # layers and heads: every scored review has the whole grid, once, in both tables; nothing else does
    grid = scored.select("doc_id").join(
        pl.DataFrame(
            {
                "layer": [la for la in run.layers for _ in range(run.num_heads)],
                "head": list(range(run.num_heads)) * len(run.layers),
            },
            schema={"layer": pl.Int16, "head": pl.Int16},
        ),
        how="cross",
    )
    groups = (
        attn.group_by(_KEYS)
        .agg(
            n=pl.len(),
            wsum=pl.col("weight").cast(pl.Float64).sum(),
            wmin=pl.col("weight").min(),
            wmax=pl.col("weight").max(),
            pmin=pl.col("position").min(),
            pmax=pl.col("position").max(),
            distinct=pl.col("position").n_unique(),
        )
        .collect(engine="streaming")
    )
    dup = summary.group_by(_KEYS).agg(n=pl.len()).filter(pl.col("n") > 1)
    report("layers_heads", dup, _fmt("{} {}: {} head_summary rows", pl.lit(rel_sum), key, "n"))
    summary = summary.unique(_KEYS, keep="first", maintain_order=True)
    for rel, table in ((rel_sum, summary), (rel_attn, groups)):
        where = _fmt("{} {}", pl.lit(rel), key)
        wanted = f"layers {run.layers} x heads 0..{run.num_heads - 1}"
        report("layers_heads", table.filter(~layer_ok), _fmt("{}: not among {}", where, pl.lit(wanted)))
        stray = (
            table.filter(layer_ok).join(scored, on="doc_id", how="anti").unique("doc_id", maintain_order=True)
        )
        report(
            "layers_heads",
            stray,
            _fmt("{} doc '{}': not a scored review of this part", pl.lit(rel), "doc_id"),
        )
        report("layers_heads", grid.join(table, on=_KEYS, how="anti"), _fmt("{}: missing", where))

    # per position: the same token in every layer and head
    same = ("token_id", "token", "start", "end")
    positions = (  # one row per (review, position): also where the part's (token_id, token) pairs come from
        attn.group_by("doc_id", "position")
        .agg(
            pl.col("token_id").first().alias("id"),
            pl.col("token").first().alias("text"),
            *(pl.col(c).n_unique() for c in same),
        )
        .collect(engine="streaming")
    )
    report(
        "tokens",
        positions.filter(pl.any_horizontal(pl.col(c) > 1 for c in same)).sort("doc_id", "position"),
        _fmt(
            "{} doc '{}' position {}: {} token ids, {} tokens, {} starts, {} ends over its layers and heads",
            *(pl.lit(rel_attn), "doc_id", "position", *same),
        ),
    )

    # per head: positions, mass, min/max
    tol = _mass_tolerance(run)
    heads = groups.join(summary, on=_KEYS, how="inner").join(scored, on="doc_id", how="inner")
    mass = pl.col("wsum") + pl.col("weight_cls").cast(pl.Float64) + pl.col("weight_sep").cast(pl.Float64)
    content = pl.col("n_tokens") - 2
    at = _fmt("{} {}", pl.lit(rel_attn), key)
    head_rules: list[Rule] = [
        (
            "positions",
            ~((pl.col("n") == pl.col("n_content")) & (pl.col("n_content") == content)),
            _fmt("{}: {} rows, n_content {}, n_tokens - 2 = {}", at, "n", "n_content", content),
        ),
        (
            "positions",
            ~((pl.col("pmin") == 1) & (pl.col("pmax") == content) & (pl.col("distinct") == pl.col("n"))),
            _fmt(
                "{}: positions {}..{} ({} distinct in {} rows), expected 1..{} once each",
                *(at, "pmin", "pmax", "distinct", "n", content),
            ),
        ),
        (
            "attention_mass",
            ~((mass - 1).abs() <= tol),
            _fmt(
                "{}: content {} + [CLS] {} + [SEP] {} = {}, not 1 within {}",
                *(at, _r("wsum"), _r("weight_cls"), _r("weight_sep"), mass.round(6), pl.lit(tol)),
            ),
        ),
        (
            "attention_mass",
            ~(pl.col("weight_cls").is_between(0, 1) & pl.col("weight_sep").is_between(0, 1)),
            _fmt("{}: weight_cls {} or weight_sep {} outside [0, 1]", at, _r("weight_cls"), _r("weight_sep")),
        ),
        (
            "scaling",
            ~(
                ((pl.col("weight_min") - pl.col("wmin")).abs() <= MINMAX_TOLERANCE)
                & ((pl.col("weight_max") - pl.col("wmax")).abs() <= MINMAX_TOLERANCE)
            ),
            _fmt(
                "{}: weight_min/max {}/{}, but the weights' min/max are {}/{}",
                *(at, _r("weight_min"), _r("weight_max"), _r("wmin"), _r("wmax")),
            ),
        ),
    ]
    _apply_rules(rec, heads.lazy(), head_rules)

    # per row: raw weights, scaled weights, spans
    lo, hi = pl.col("weight_min").cast(pl.Float64), pl.col("weight_max").cast(pl.Float64)
    expected = pl.when(hi > lo).then((pl.col("weight").cast(pl.Float64) - lo) / (hi - lo)).otherwise(0.0)
    rows = attn.join(summary.lazy().select(*_KEYS, "weight_min", "weight_max"), on=_KEYS, how="left")
    at = _fmt("{} {} position {}", pl.lit(rel_attn), key, "position")
    scaled = pl.col("weight_scaled")
    row_rules: list[Rule] = [
        (
            "attention_mass",
            ~pl.col("weight").is_between(0, 1),
            _fmt("{}: weight {} outside [0, 1]", at, "weight"),
        ),
        (
            "scaling",
            ~scaled.is_between(0, 1),
            _fmt("{}: weight_scaled {} outside [0, 1]", at, "weight_scaled"),
        ),
        (
            "scaling",
            scaled.is_between(0, 1) & ~((scaled.cast(pl.Float64) - expected).abs() <= SCALED_TOLERANCE),
            _fmt(
                "{}: weight_scaled {}, but (w - min)/(max - min) = {}",
                at,
                _r("weight_scaled"),
                expected.round(6),
            ),
        ),
        (
            "spans",
            ~((pl.col("start") >= 0) & (pl.col("start") <= pl.col("end"))),
            _fmt("{}: span {}..{} is not 0 <= start <= end", at, "start", "end"),
        ),
    ]
    _apply_rules(rec, rows, row_rules)
    return summary.height, positions.select(token_id="id", token="text").unique()


# -- spans against the source text --------------------------------------------------------------------


def _span_ends(run: _Run, part: _Part) -> dict[int, tuple[str, int]]:
    """row_index -> (doc_id, largest span end) for the scored reviews of one part."""
    ends = (
        pl.scan_parquet(run.file(part, "cls_attention"), glob=False)
        .group_by("doc_id")
        .agg(end=pl.col("end").max())
        .join(
            pl.scan_parquet(run.file(part, "predictions"), glob=False)
            .filter(pl.col("status") == "ok")
            .select("doc_id", "row_index"),
            on="doc_id",
            how="inner",
        )
        .collect(engine="streaming")
    )
    return {r: (d, e) for d, e, r in ends.select("doc_id", "end", "row_index").iter_rows()}


def _check_source_spans(rec: _Recorder, run: _Run) -> None:
    """Stream the inputs once, beside the parts in row order, and compare span ends to text lengths."""
    spec = run.manifest.get("spec") if isinstance(run.manifest.get("spec"), dict) else {}
    inputs = run_inputs(run.manifest)
    if not inputs:
        rec.skip("spans", "the manifest names no inputs: end <= text length not checked")
        return
    pending = sorted(
        (p for p in run.parts if p.readable >= {"predictions", "cls_attention"}),
        key=lambda p: (p.start_row, p.generation),
    )
    active: list[tuple[_Part, dict[int, tuple[str, int]]]] = []
    checked = changed = 0
    try:
        for block in read_rows(
            inputs,
            text_col=spec.get("text_col") or "text",
            id_col=spec.get("id_col"),
            label_col=None,
            input_format=spec.get("input_format") or "auto",  # no limit: a resume may have raised it
        ):
            if not pending and not active:
                break  # every part is checked: the rest of the inputs holds no reviews of the run
            hi = block.row_index[-1] + 1
            while pending and pending[0].start_row < hi:
                part = pending.pop(0)
                active.append((part, _span_ends(run, part)))
            for j, row in enumerate(block.row_index):
                for part, ends in active:
                    hit = ends.pop(row, None)
                    if hit is None:
                        continue
                    doc_id, end = hit
                    text = block.text[j]
                    if block.doc_id[j] != doc_id or text is None:
                        changed += 1
                        if changed <= KEPT:
                            rec.warn(
                                "spans", f"input row {row} is now {block.doc_id[j]!r}, the run has {doc_id!r}"
                            )
                        continue
                    checked += 1
                    if end > len(text):
                        rec.fail(
                            "spans",
                            f"{part.rel['cls_attention']} doc {doc_id!r} (row {row}): a token span ends at "
                            f"{end}, past the text's length {len(text)}",
                        )
            active = [(p, e) for p, e in active if p.end_row > hi or e]
    except BertAttnError as e:
        rec.skip("spans", f"inputs not readable here ({e}); end <= text length not checked")
        if checked:
            rec.note("spans", f"{checked} reviews checked before that")
        return
    left = sum(len(e) for _, e in active) + sum(len(_span_ends(run, p)) for p in pending)
    if left:
        rec.warn("spans", f"the inputs end before {left} scored reviews of the run; those were not checked")
    if changed > KEPT:
        rec.checks["spans"].warnings += changed - KEPT
    rec.note("spans", f"{checked} reviews checked against {', '.join(map(str, inputs))}")


__all__ = ["CHECKS", "Check", "Problem", "ValidationReport", "validate_run"]
