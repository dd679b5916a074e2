"""Part files: written by whoever scored a window (``PartWriter.stage``: no manifest needed, so Ray
workers write their own), published after their commit, checked when read (``committed_files``).
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import schema, storage
from .._files import fsync_file
from ..errors import RunDirError, StorageError, WriteError, first_line
from ..schema import OPTIONAL_TABLES
from ..storage import is_remote
from .lease import LeaseGuard
from .manifest import ALL_TABLES, TABLES, PartEntry, part_name, read_manifest, row_range_problems, tmp_name

#: Rows in a row group at most: one to a few a part (DuckDB and Spark parallelise over part files).
ROW_GROUP_ROWS = 1 << 20
#: Where a Parquet file keeps its Arrow schema (the key pyarrow, polars and arrow-rs read).
ARROW_SCHEMA_KEY = b"ARROW:schema"
#: How long a reader waits for a committed part that a running extract has yet to rename into place.
RENAME_WAIT_SECONDS = 5.0
#: What a reader says after naming a committed part it cannot use.
DAMAGED = "bertattn validate tells what else is wrong; an extract with --overwrite redoes the run"


class PartWriter:
    """Writes and publishes the files of parts. Tests subclass it and override :meth:`_write_parquet`
    to simulate failures (a full disk, a torn file)."""

    def __init__(self, run_dir: str | Path) -> None:
        #: on a store (no rename) a part is uploaded under its final name; only the manifest commits it
        self.stored = is_remote(run_dir)
        #: on a store, the run's lease: asked before each upload, its token in each part's name
        self.lease: LeaseGuard | None = None
        #: absolute: a Ray worker writes from the raylet's directory, not the job's
        self.run_dir: Any = (
            os.fspath(run_dir) if self.stored else Path(storage.absolute(storage.normalize(run_dir)))
        )

    def stage(self, start_row: int, end_row: int, tables: dict[str, pa.Table], generation: int = 0,
              rows_digest: str = "") -> PartEntry:  # fmt: skip
        """Write every table's file under its temporary name (on a store, its final one): its entry."""
        name = part_name(start_row, generation, self.lease.token if self.lease else "")
        files, counts, nbytes = {}, {}, 0
        if self.lease is not None:
            self.lease()
        try:
            for table_name in (t for t in ALL_TABLES if t in tables):
                table = schema.cast(tables[table_name], table_name, keep_dictionaries=True)
                if table_name in OPTIONAL_TABLES and not self.stored:  # a folder where a run asks for it
                    (self.run_dir / table_name).mkdir(exist_ok=True)
                if self.stored:
                    sink = pa.BufferOutputStream()
                    self._write_parquet(table, sink)
                    data = sink.getvalue()
                    storage.write_bytes(storage.join(self.run_dir, table_name, name), data)
                    nbytes += data.size
                else:
                    tmp = self.run_dir / table_name / tmp_name(name)
                    self._write_parquet(table, tmp)
                    nbytes += tmp.stat().st_size
                files[table_name] = f"{table_name}/{name}"
                counts[table_name] = table.num_rows
        except (OSError, StorageError) as e:
            why = getattr(e, "strerror", None) or first_line(e)
            raise WriteError(f"writing {name} to {self.run_dir} failed: {why}") from e
        return PartEntry(name, start_row, end_row, files, counts, nbytes, generation, rows_digest)

    def publish(self, entry: PartEntry) -> None:
        """Rename a committed part's temporary files to their final names (on a store they have them)."""
        if self.stored:
            return
        try:
            for table_name in entry.files:
                folder = self.run_dir / table_name
                (folder / tmp_name(entry.name)).replace(folder / entry.name)
        except OSError as e:
            raise WriteError(f"writing {entry.name} to {self.run_dir} failed: {e.strerror or e}") from e

    def _write_parquet(self, table: pa.Table, path: Path | pa.NativeFile) -> None:
        """Write one file (fsynced where it is one) with a checksum on every page."""
        write_table(table, path)
        if isinstance(path, Path):
            fsync_file(path)


def write_table(table: pa.Table, where: Path | pa.NativeFile, **options: Any) -> None:
    """Write ``table`` as one Parquet file with :func:`write_options` (``options`` override them); a file
    that fails is removed. A dictionary column is written as Parquet's dictionary under the declared
    Arrow schema (plain strings)."""
    declared = schema.declared(table.schema)
    metadata = {
        **(declared.metadata or {}),
        ARROW_SCHEMA_KEY: base64.b64encode(declared.serialize().to_pybytes()),
    }
    options = {**write_options(declared), **options}
    try:
        with pq.ParquetWriter(where, table.schema, store_schema=False, **options) as writer:
            for group in _row_groups(table):
                writer.write_table(group, row_group_size=ROW_GROUP_ROWS)
            writer.add_key_value_metadata(metadata)
    except BaseException:
        if isinstance(where, Path):
            where.unlink(missing_ok=True)
        raise


def _row_groups(table: pa.Table) -> Iterator[pa.Table]:
    """``table`` a row group at a time, each dictionary cut to the stretch its rows use (readers such as
    Spark skip row groups by it)."""
    if table.num_rows == 0:
        yield table
        return
    for start in range(0, table.num_rows, ROW_GROUP_ROWS):
        group = table.slice(start, ROW_GROUP_ROWS)
        for i, field in enumerate(group.schema):
            if pa.types.is_dictionary(field.type):
                group = group.set_column(i, field, _used_stretch(group.column(i)))
        yield group


def _used_stretch(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` over the stretch of its dictionary that its indices use (chunks of one dictionary)."""
    chunks = column.chunks
    dictionary = chunks[0].dictionary
    bounds = pc.min_max(pa.chunked_array([c.indices for c in chunks], chunks[0].indices.type))
    lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
    if lo is None or any(not c.dictionary.equals(dictionary) for c in chunks[1:]):
        return column
    used = dictionary.slice(lo, hi - lo + 1)
    shift = pa.scalar(lo, chunks[0].indices.type)
    return pa.chunked_array(
        [pa.DictionaryArray.from_arrays(pc.subtract(c.indices, shift), used, safe=False) for c in chunks]
    )


def write_options(table_schema: pa.Schema) -> dict[str, object]:
    """``pq.ParquetWriter``'s options for every part: zstd, page checksums, dictionaries for the string
    columns, and statistics where a reader can skip row groups by them: every column of predictions
    (a row a review, in row order), only ``doc_id`` elsewhere (docs/performance.md)."""
    per_review = (table_schema.metadata or {}).get(b"table") == b"predictions"
    return {
        "compression": "zstd",
        "use_dictionary": [f.name for f in table_schema if f.type == pa.string()],
        "write_statistics": True if per_review else [f.name for f in table_schema if f.name == "doc_id"],
        "write_page_checksum": True,
    }


def run_file(run_dir: str | Path, name: str) -> Any:
    """A file of a run by its name in the manifest: a path on local disk, a URI on a store."""
    return storage.join(run_dir, name) if is_remote(run_dir) else Path(run_dir) / name


def check_part(
    run_dir: str | Path, part: PartEntry, tables: tuple[str, ...] | list[str] = TABLES
) -> dict[str, Any]:
    """The files of ``tables`` of a committed part; RunDirError where one is missing, cut short, or holds
    other rows than its entry records. A local part between its commit and its rename is waited for."""
    if missing := [t for t in tables if t not in part.files]:
        raise RunDirError(f"{run_dir}: part {part.name} holds no {', '.join(missing)} table")
    files = {t: run_file(run_dir, part.files[t]) for t in tables}
    for table, path in files.items():
        name = _shown(run_dir, path)
        if not is_remote(path):
            tmp = path.with_name(tmp_name(path.name))
            deadline = time.monotonic() + RENAME_WAIT_SECONDS
            while not path.is_file() and tmp.is_file() and time.monotonic() < deadline:
                time.sleep(0.05)
            if not path.is_file() and tmp.is_file():
                raise RunDirError(
                    f"{run_dir}: {name} is committed but still has its temporary name (its extract stopped "
                    "before renaming it); rerun the extract to finish the run"
                )
        try:
            with storage.arrow_file(path) as f:
                meta = pq.read_metadata(f)
        except (pa.ArrowException, OSError, StorageError) as e:
            problem = f"cannot be read ({first_line(e)})"
            if not storage.is_file(path):
                problem = "is committed in the manifest but missing"
            raise RunDirError(f"{run_dir}: {name} {problem}; {DAMAGED}") from None
        ordered = table == "predictions" and meta.num_rows > 0
        indexed = "row_index" in meta.schema.names
        span = _row_index_range(meta) if ordered and indexed else None
        if ordered and not indexed:
            problem = "has no row_index column"
        elif meta.num_rows != part.rows[table]:
            problem = f"holds {meta.num_rows} rows where its commit recorded {part.rows[table]}"
        elif span and (span[0] < part.start_row or span[1] >= part.end_row):
            problem = (
                f"holds input rows {span[0]}..{span[1]}, "
                f"outside its part's {part.start_row}..{part.end_row - 1}"
            )
        else:
            continue
        raise RunDirError(
            f"{run_dir}: {part.files[table]} {problem} (changed or replaced since?); bertattn validate "
            "tells what else is wrong, and --overwrite starts the run again"
        )
    return files


def _row_index_range(meta: pq.FileMetaData) -> tuple[int, int] | None:
    """The smallest and largest row_index of a predictions file, from its statistics (None: none kept)."""
    column = meta.schema.names.index("row_index")
    stats = [meta.row_group(g).column(column).statistics for g in range(meta.num_row_groups)]
    if not stats or any(s is None or not s.has_min_max for s in stats):
        return None
    return min(s.min for s in stats), max(s.max for s in stats)


@dataclass(frozen=True)
class CommittedPart:
    name: str
    files: dict[str, Any]  # table -> absolute path, or URI on a store


def check_row_ranges(run_dir: str | Path, parts: list[PartEntry], then: str = DAMAGED) -> None:
    """RunDirError where committed parts leave input rows out or hold one twice (:func:`row_range_problems`):
    a manifest edited or restored; ``then``: what the user may do."""
    for problem in row_range_problems(parts):
        raise RunDirError(f"{run_dir}: {problem} (was the manifest edited or restored?); {then}")


def committed_files(
    run_dir: str | Path, tables: tuple[str, ...] | list[str] = TABLES, verify: bool = False
) -> list[CommittedPart]:
    """The checked files of ``tables`` of each committed part (``verify``: every page's checksum too); a
    RunDirError where the parts leave input rows out (a manifest edited or restored)."""
    run_dir = storage.normalize(run_dir)
    parts = read_manifest(run_dir).parts
    check_row_ranges(run_dir, parts)
    out = []
    for part in sorted(parts, key=lambda p: p.name):
        files = check_part(run_dir, part, tables)
        for f in files.values() if verify else ():
            verify_pages(run_dir, f)
        out.append(CommittedPart(part.name, files))
    return out


def part_paths(run_dir: str | Path, table: str) -> list[str]:
    """The files of one table a run's manifest commits, for any Parquet reader (a glob reads strays)."""
    return [os.fspath(p.files[table]) for p in committed_files(run_dir, [table])]


#: The part files :func:`verify_pages` found sound, by path, size and modification time.
_VERIFIED: set[tuple[str, int, int]] = set()


def verify_pages(run_dir: str | Path, path: Any) -> None:
    """Decode every page of a local part file with its checksum checked, once per file a process."""
    if is_remote(path):
        return
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _VERIFIED:
        try:
            decode_every_page(path)
        except (pa.ArrowException, OSError) as e:
            raise RunDirError(
                f"{run_dir}: {_shown(run_dir, path)} is damaged ({first_line(e)}); {DAMAGED}"
            ) from None
        _VERIFIED.add(key)


def decode_every_page(path: Any) -> None:
    """Decode every page of a Parquet file with its checksum checked (strings as dictionaries: memory
    does not grow with a repeated doc_id's length)."""
    strings = [f.name for f in pq.read_schema(path) if f.type in (pa.string(), pa.large_string())]
    with pq.ParquetFile(path, page_checksum_verification=True, read_dictionary=strings) as pf:
        for _ in pf.iter_batches(batch_size=1 << 16):
            pass


def _shown(run_dir: str | Path, path: Any) -> str:
    """A run's file as it is named to the user: below the run."""
    root = os.fspath(run_dir).rstrip("/") if is_remote(path) else str(Path(run_dir))
    return os.fspath(path).removeprefix(root + "/")
