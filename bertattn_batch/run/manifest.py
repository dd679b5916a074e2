"""The names inside a run directory (docs/run-directory.md), and ``manifest.json`` typed: what a run is,
and the parts it committed. Nothing else spells those names or parses the file; a run whose tables
another version wrote is refused (:func:`require_current_tables`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import schema, storage
from .._files import atomic_write_text, json_text
from ..config import InputSpec, type_hints
from ..errors import DamagedRunError, RunDirError, RunVersionError, WriteError
from ..storage import is_remote

MANIFEST = "manifest.json"
#: Parts committed since the manifest was last written, one a line: a commit costs the same however
#: many parts came before.
COMMIT_LOG = "commits.jsonl"
FORMAT = "bertattn-batch run"
AGGREGATES_DIR = "aggregates"
FAITHFULNESS_DIR = "faithfulness"
#: What the analysis commands write into a run; with the tables and the manifest, all that --overwrite
#: removes (anything else in the folder is the user's).
DERIVED_DIRS = (AGGREGATES_DIR, FAITHFULNESS_DIR)
REPORT_NAME = "report.html"
LOCK_NAME = ".bertattn.lock"  # held by the process writing a run on local disk
LEASE_NAME = "_lease.json"  # on an object store (run/lease.py)
TABLES = schema.TABLES
ALL_TABLES = schema.ALL_TABLES


def part_name(start_row: int, generation: int = 0, writer: str = "") -> str:
    """A part's name: its first row (a retried window replaces, never adds), its pass (``generation``)
    and, on a store, the token of the process holding the run (run/lease.py), so that a writer that
    lost the run uploads under a name no manifest lists."""
    suffix = (f"-g{generation}" if generation else "") + (f"-{writer}" if writer else "")
    return f"part-{start_row:012d}{suffix}.parquet"


def tmp_name(name: str) -> str:
    """A part's file until it is published: a name readers skip."""
    return f"_{name}.tmp"


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file() and (path / "predictions").is_dir()


def _expect(key: str, value: Any, kind: type) -> None:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"{key} is {value!r}, expected {kind.__name__}")


@dataclass
class PartEntry:
    """One committed part: the same rows of every table, named by its first row."""

    name: str
    start_row: int
    end_row: int
    files: dict[str, str]  # table -> path relative to the run directory
    rows: dict[str, int]  # table -> rows in its file
    bytes: int = 0
    generation: int = 0  # the incremental pass that wrote it (0: the first)
    rows_digest: str = ""  # of its input rows as read (inputs/fingerprint.py); empty in a pass by id

    @classmethod
    def parse(cls, data: Any) -> PartEntry:
        """A part from its JSON form; ValueError names the field that is missing or wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        values = {
            f.name: data.get(f.name, None if f.default is dataclasses.MISSING else f.default)
            for f in dataclasses.fields(cls)
        }
        for key, hint in type_hints(cls).items():  # the JSON type of each field
            _expect(key, values[key], typing.get_origin(hint) or hint)
        for key, kind in (("files", str), ("rows", int)):
            optional = [t for t in schema.OPTIONAL_TABLES if t in values[key]]
            values[key] = {t: values[key].get(t) for t in (*TABLES, *optional)}
            for table, value in values[key].items():
                _expect(f"{key}.{table}", value, kind)
        for table, path in values["files"].items():  # a reader must not follow one out of the run
            if Path(path).anchor or ".." in Path(path).parts:
                raise ValueError(f"files.{table} is {path!r}, outside the run")
        if values["end_row"] < values["start_row"]:
            raise ValueError(f"end_row {values['end_row']} < start_row {values['start_row']}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_parts(entries: Any) -> tuple[list[PartEntry], list[str]]:
    """(the parts that parse, a message for each entry that does not or repeats a name)."""
    if not isinstance(entries, list):
        return [], [f"parts is {type(entries).__name__}, expected a list"]
    parts: dict[str, PartEntry] = {}
    problems = []
    for i, entry in enumerate(entries):
        try:
            part = PartEntry.parse(entry)
        except ValueError as e:
            problems.append(f"parts[{i}] is malformed ({e})")
            continue
        if part.name in parts:
            problems.append(f"part {part.name} is listed twice")
        else:
            parts[part.name] = part
    return list(parts.values()), problems


@dataclass
class Manifest:
    """A run's manifest. ``spec``, ``fingerprint``, ``model`` and ``versions`` are fixed for the life of
    the run (``engines.start.run_header``); the rest changes as parts are committed."""

    run_id: str = ""  # names the run in every predictions row
    spec: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    schema_versions: dict[str, int] = field(default_factory=dict)
    status: str = "running"  # running, interrupted or complete
    parts: list[PartEntry] = field(default_factory=list)
    generation: int | None = None  # the pass the run is in; None in runs from before passes
    sources: list[dict[str, Any]] | None = None  # the current pass's input files (inputs.fingerprint)
    limit: int | None = None  # the rows the current pass reads at most
    resumes: int = 0
    created_at: str | None = None
    updated_at: str | None = None
    resumed_at: str | None = None
    completed_at: str | None = None
    last_run: dict[str, Any] | None = None  # the last pass's summary (engines.base.RunSummary)
    counts: dict[str, int] | None = None  # rows of every table over all parts, once complete
    format: str = FORMAT
    extra: dict[str, Any] = field(default_factory=dict)  # keys this version does not know, kept

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "manifest") -> Manifest:
        """A manifest from its JSON form; DamagedRunError for malformed fields."""
        parts, malformed = parse_parts(data.get("parts"))
        problems = [f"its list of parts is missing or malformed ({p})" for p in malformed]
        known = {f.name for f in dataclasses.fields(cls)} - {"extra", "parts"}
        kwargs = {k: v for k, v in data.items() if k in known}
        problems += [
            f"{name} is not an object"
            for name in ("spec", "fingerprint", "model", "versions", "schema_versions")
            if not isinstance(kwargs.get(name, {}), dict)
        ]
        if isinstance(model := kwargs.get("model", {}), dict):
            problems += model_problems(model)
        generation = kwargs.get("generation")
        if generation is not None and (not isinstance(generation, int) or isinstance(generation, bool)):
            problems.append(f"generation is {generation!r}, expected int")
        if problems:
            raise DamagedRunError(f"{where} is damaged: {problems[0]}")
        return cls(**kwargs, parts=parts, extra={k: v for k, v in data.items() if k not in known | {"parts"}})

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        out["parts"] = [p.to_dict() for p in self.parts]
        out = {"format": out.pop("format"), **out, **self.extra}
        # an unset field is left out; a pass's limit of None says "no limit", kept once passes are
        return {
            k: v for k, v in out.items() if v is not None or (k == "limit" and self.generation is not None)
        }

    @property
    def inputs(self) -> list[str]:
        """The run's inputs, to read its reviews again: the fingerprint's (absolute), else the spec's."""
        return list(self.fingerprint.get("inputs") or self.spec.get("inputs") or [])

    @property
    def model_source(self) -> str | None:
        """Where the run's model is, to load it again: a local folder, a hub name or a store's URI."""
        return self.model.get("source") or self.spec.get("model")

    def read_options(self) -> InputSpec:
        """How the run read its inputs (labels left out, and no limit), to read its reviews again."""
        s = self.spec
        return InputSpec(self.inputs, text_col=s.get("text_col") or "text", id_col=s.get("id_col"),
                         format=s.get("input_format") or "auto", encoding=s.get("encoding") or "utf-8",
                         delimiter=s.get("delimiter"))  # fmt: skip

    @property
    def layers(self) -> list[int]:
        return list(self.model.get("layers") or [])

    @property
    def num_layers(self) -> int | None:
        return self.model.get("num_layers")

    @property
    def byte_level(self) -> bool | None:
        """Whether the run's tokens spell bytes (byte-level BPE); None where the run did not record it."""
        return self.model.get("byte_level")

    @property
    def job_sha256(self) -> str:
        return str(self.fingerprint.get("job_sha256", ""))

    @property
    def passes(self) -> set[int]:
        return {p.generation for p in self.parts}

    @property
    def labels(self) -> list[str]:
        """The model's label names in id order."""
        id2label = self.model.get("id2label") or {}
        return [id2label[k] for k in sorted(id2label, key=int)]


def model_problems(model: dict[str, Any]) -> list[str]:
    """What is wrong with the model fields readers rely on, each named (a field left out is not wrong)."""

    def whole(value: Any, least: int) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= least

    problems = [
        f"model.{name} is {model[name]!r}, expected an integer of at least 1"
        for name in ("num_layers", "num_heads", "max_length")
        if model.get(name) is not None and not whole(model[name], 1)
    ]
    layers, id2label = model.get("layers"), model.get("id2label")
    if layers is not None and not (isinstance(layers, list) and all(whole(x, 0) for x in layers)):
        problems.append(f"model.layers is {layers!r}, expected a list of 0-based layer indices")
    if id2label is not None and not (
        isinstance(id2label, dict)
        and all(isinstance(k, str) and k.isdigit() and isinstance(v, str) for k, v in id2label.items())
    ):
        problems.append(f'model.id2label is {id2label!r}, expected label names by id ("0", "1", ...)')
    return problems


def layer_name(layer: int, num_layers: int | None) -> str:
    """``layer 4 (−2)``: as a run stores it (0-based), and counted from the end as ``--layers`` takes it."""
    return f"layer {layer}" + (f" (\u2212{num_layers - layer})" if num_layers else "")


def load_json(run_dir: str | Path) -> dict[str, Any]:
    """The manifest's JSON object as written, with the parts of the commit log after its own."""
    run_dir = storage.normalize(run_dir)
    path = storage.join(run_dir, MANIFEST)
    if not storage.is_file(path):
        gone = not is_remote(run_dir) and not Path(run_dir).exists()  # a mistyped path, say
        raise RunDirError(
            f"{run_dir} does not exist" if gone else f"{run_dir} is not a run directory (no {MANIFEST})"
        )
    try:
        data = json.loads(storage.read_bytes(path).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DamagedRunError(f"{path} is damaged: {e}") from None
    if not isinstance(data, dict):
        raise DamagedRunError(f"{path} is damaged: not a JSON object")
    log = Path(run_dir) / COMMIT_LOG
    try:  # the commit log's entries, a later one of a name replacing an earlier
        lines = [] if is_remote(run_dir) else log.read_bytes().splitlines()
    except FileNotFoundError:
        lines = []
    except OSError as e:
        raise RunDirError(f"{log} cannot be read: {e.strerror or e}") from None
    logged: dict[str, Any] = {}
    for i, line in enumerate(lines):
        try:
            entry = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if i == len(lines) - 1:  # a last line cut short was never committed
                break
            raise DamagedRunError(f"{log} is damaged: line {i + 1} is no JSON") from None
        logged[entry.get("name") if isinstance(entry, dict) else str(i)] = entry
    if logged and isinstance(data.get("parts"), list):
        data["parts"] = [p for p in data["parts"] if not (isinstance(p, dict) and p.get("name") in logged)]
        data["parts"] += logged.values()
    return data


def log_commit(run_dir: Path, entry: PartEntry) -> None:
    """Append a part to the commit log and make it durable: the commit point of a part on local disk."""
    path = run_dir / COMMIT_LOG
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json_text(entry.to_dict()) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise WriteError(f"writing {path} failed: {e.strerror or e}") from e


def read_manifest(run_dir: str | Path) -> Manifest:
    """A run's manifest, checked for the shape every reader relies on."""
    data = load_json(run_dir)
    if data.get("format") != FORMAT:
        raise RunDirError(f"{run_dir} is not a bertattn run directory")
    require_current_tables(run_dir, data.get("schema_versions"))
    return Manifest.from_dict(data, where=storage.join(run_dir, MANIFEST))


def require_current_tables(run_dir: str | Path, written: Any) -> None:
    """Refuse a run whose tables another version of bertattn-batch wrote in another form."""
    current = schema.versions()
    if not isinstance(written, dict):
        return  # none named (a manifest made by hand), left to its own checks
    # an optional table a run never wrote needs no version
    named = [t for t in current if t in written or t not in schema.OPTIONAL_TABLES]
    if all(written.get(t) == current[t] for t in named) and set(written) <= set(current):
        return

    def spell(versions: dict[str, Any]) -> str:
        return ", ".join(f"{t} v{v}" for t, v in sorted(versions.items()))

    raise RunVersionError(
        f"{run_dir} holds tables of another version of bertattn-batch ({spell(written)}; this version "
        f"reads {spell(schema.versions())}): run its job again with --overwrite, or into a new --out"
    )


def manifest_text(manifest: Manifest) -> str:
    return json_text(manifest.to_dict(), indent=1, default=str)


def save_manifest(run_dir: Path, manifest: Manifest) -> None:
    """Write the whole manifest atomically, then drop the commit log it now holds."""
    try:
        atomic_write_text(run_dir / MANIFEST, manifest_text(manifest))
        (run_dir / COMMIT_LOG).unlink(missing_ok=True)
    except OSError as e:
        raise WriteError(f"writing {run_dir / MANIFEST} failed: {e.strerror or e}") from e


def row_range_problems(parts: Iterable[PartEntry]) -> list[str]:
    """What is wrong with committed parts' row ranges: the first pass must tile rows 0..N-1 without a
    gap, and no pass may hold a row twice."""
    by_gen: dict[int, list[tuple[int, int]]] = {}
    for p in parts:
        by_gen.setdefault(p.generation, []).append((p.start_row, p.end_row))
    problems = []
    for gen, ranges in sorted(by_gen.items()):
        ranges.sort()
        expect = 0 if gen == 0 else ranges[0][0]
        for start, end in ranges:
            if start > expect and gen == 0:
                problems.append(f"rows {expect}..{start - 1} are in no committed part")
            elif start < expect:
                problems.append(f"rows {start}..{min(expect, end) - 1} are in two parts of generation {gen}")
            expect = max(expect, end)
    return problems
