"""A part's files: written under temporary names by whoever scored its window, published after its commit.

Usage::

    writer = PartWriter(run_dir)                              # needs no manifest: a Ray worker has one
    entry = writer.stage(start_row, end_row, tables, generation)   # step 1: temporary files, fsynced
    ...                                                       # step 2: RunDir.commit lists the entry
    writer.publish(entry)                                     # step 3: the files take their final names

    for part in committed_files(run_dir, ["cls_attention", "predictions"]):   # what readers read
        part.name, part.files["cls_attention"]
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
from ..storage import is_remote
from .layout import TABLES, part_name, tmp_name
from .lease import LeaseGuard
from .manifest import PartEntry, read_manifest

#: Rows in a row group at most: one to a few a part (DuckDB and Spark parallelise over a run's many
#: part files).
ROW_GROUP_ROWS = 1 << 20
#: Where a Parquet file keeps its Arrow schema (the key pyarrow, polars and arrow-rs read).
ARROW_SCHEMA_KEY = b"ARROW:schema"

#: How long a reader waits for a committed part that a running extract has yet to rename into place.
RENAME_WAIT_SECONDS = 5.0


class PartWriter:
    """Writes and publishes the files of parts; a subclass may override :meth:`_write_parquet` to
    simulate failures in tests (a full disk, a torn file)."""

    def __init__(self, run_dir: str | Path) -> None:
        #: on an object store (no rename) a part is uploaded under its final name: the upload makes the
        #: object visible whole, and only the manifest that lists it commits it
        self.stored = is_remote(run_dir)
        #: on a store, the lease this run holds (run/stored.py): asked before each part's upload, and
        #: naming the holder in the part's name
        self.lease: LeaseGuard | None = None
        #: absolute: a Ray worker on a cluster's node writes from the raylet's directory, not the job's
        self.run_dir: Any = (
            os.fspath(run_dir) if self.stored else Path(storage.absolute(storage.normalize(run_dir)))
        )

    def stage(
        self,
        start_row: int,
        end_row: int,
        tables: dict[str, pa.Table],
        generation: int = 0,
        rows_digest: str = "",
    ) -> PartEntry:
        """Step 1: write every table's file under its temporary name; returns the manifest entry."""
        name = part_name(start_row, generation, self.lease.token if self.lease else "")
        files, counts, nbytes = {}, {}, 0
        if self.lease is not None:
            self.lease()
        try:
            for table_name in TABLES:
                table = schema.cast(tables[table_name], table_name, keep_dictionaries=True)
                if self.stored:
                    nbytes += self._upload(table, storage.join(self.run_dir, table_name, name))
                else:
                    tmp = self.run_dir / table_name / tmp_name(name)
                    self._write_parquet(table, tmp)
                    nbytes += tmp.stat().st_size
                files[table_name] = f"{table_name}/{name}"
                counts[table_name] = table.num_rows
        except StorageError as e:
            raise WriteError(f"writing {name} to {self.run_dir} failed: {first_line(e)}") from e
        except OSError as e:
            raise WriteError(f"writing {name} to {self.run_dir} failed: {e.strerror or e}") from e
        return PartEntry(name, start_row, end_row, files, counts, nbytes, generation, rows_digest)

    def publish(self, entry: PartEntry) -> None:
        """Step 3: rename the part's temporary files to their final names (on a store, they have them)."""
        if self.stored:
            return
        try:
            for table_name in TABLES:
                folder = self.run_dir / table_name
                (folder / tmp_name(entry.name)).replace(folder / entry.name)
        except OSError as e:
            raise WriteError(f"writing {entry.name} to {self.run_dir} failed: {e.strerror or e}") from e

    def _write_parquet(self, table: pa.Table, path: Path | pa.NativeFile) -> None:
        """Write and fsync one file, with a checksum on every page (``validate`` verifies them)."""
        write_table(table, path)
        if isinstance(path, Path):
            fsync_file(path)

    def _upload(self, table: pa.Table, uri: str) -> int:
        """Write one part file to a store under its final name; returns its size. The store makes the
        object visible only once the upload completes: a killed worker leaves none, or a whole one that
        no manifest lists (removed when the run is next opened)."""
        sink = pa.BufferOutputStream()
        self._write_parquet(table, sink)
        data = sink.getvalue()
        storage.write_bytes(uri, data)
        return data.size


def write_table(table: pa.Table, where: Path | pa.NativeFile, **options: Any) -> None:
    """Write ``table`` as one Parquet file with :func:`write_options`, in row groups of up to
    ``ROW_GROUP_ROWS`` (``options`` override, for benchmarks).

    A dictionary-encoded string column (``schema.cast`` keeps it so) goes in as Parquet's dictionary
    without hashing each value; but pyarrow would then record a dictionary type in the file's Arrow
    schema (polars would read a categorical). So that schema is written here instead, serialised as
    pyarrow does, with the column's plain type: the file's metadata is the same as a plain string
    column's (a test checks it), and every reader reads strings."""
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
        if isinstance(where, Path):  # as pq.write_table does: no file is left half written
            where.unlink(missing_ok=True)
        raise


def _row_groups(table: pa.Table) -> Iterator[pa.Table]:
    """``table`` a row group at a time, each dictionary column's dictionary cut to the stretch its rows
    use (a window's rows come review by review): a row group then lists only its own ids, which a
    reader that skips row groups by their dictionary (Spark) needs, rather than the whole window's."""
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
    """``column`` over the stretch of its dictionary between its smallest and largest index, one
    dictionary for every chunk; as it is where its chunks do not share one."""
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
    """How every part file is written (``pq.ParquetWriter``'s options): zstd, a checksum on every
    page, dictionaries for the string columns (doc ids, tokens, labels), which repeat, and statistics
    (min, max, nulls) where a reader can skip a row group by them.

    Those are every column of predictions (a row a review, in row order) but only ``doc_id`` in the
    tables of a row a token or a head: each of their row groups spans every layer, head, position,
    token and weight, and the minima and maxima of those took a fifth of cls_attention's write time
    and an eighth of tokens'. A dictionary on layer and head took a tenth (plain, zstd packs them
    within 0.3%); weights, positions and offsets rarely repeat, and trying a dictionary on them and
    falling back cost half the write time (docs/performance.md)."""
    per_review = (table_schema.metadata or {}).get(b"table") == b"predictions"
    return {
        "compression": "zstd",
        "use_dictionary": [f.name for f in table_schema if f.type == pa.string()],
        "write_statistics": True if per_review else [f.name for f in table_schema if f.name == "doc_id"],
        "write_page_checksum": True,
    }


#: What a reader says after naming a committed part it cannot use: what the run's committed rows were
#: is lost with it, so only redoing the run gets them back.
DAMAGED = "bertattn validate tells what else is wrong; an extract with --overwrite redoes the run"


def check_part_file(run_dir: Path, path: Path) -> pq.FileMetaData:
    """Raise unless a committed part file is there and its Parquet footer reads (a file cut short by a
    full disk or an interrupted copy has none), and return that footer: a few kilobytes read per file.

    A reader may meet a running extract's part between its commit and its rename (steps 2 and 3 of the
    module docstring): it waits up to ``RENAME_WAIT_SECONDS`` for the file to take its final name.
    """
    if is_remote(path):
        return _check_stored_part(run_dir, os.fspath(path))
    name = path.relative_to(run_dir) if path.is_relative_to(run_dir) else path
    tmp = path.with_name(tmp_name(path.name))
    deadline = time.monotonic() + RENAME_WAIT_SECONDS
    while not path.is_file() and tmp.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    if path.is_file():
        try:
            return pq.read_metadata(path)
        except (pa.ArrowException, OSError) as e:
            problem = f"cannot be read ({first_line(e)})"
    elif tmp.is_file():
        problem = "is committed but still has its temporary name (its extract stopped before renaming it)"
        raise RunDirError(f"{run_dir}: {name} {problem}; rerun the extract to finish the run")
    else:
        problem = "is committed in the manifest but missing"
    raise RunDirError(f"{run_dir}: {name} {problem}; {DAMAGED}")


def check_part_rows(run_dir: Path, part: PartEntry, footers: dict[str, pq.FileMetaData]) -> None:
    """Raise unless a committed part's files hold what its entry records, read from their ``footers``
    (by table, as :func:`check_part_file` returns them): as many rows in each, and row numbers within
    its range in ``predictions``. A part swapped for
    another (a restore from the wrong copy) has sound files and other reviews: resumed, the run would
    say complete with a range missing and another twice."""
    for table, meta in footers.items():
        name = part.files[table]
        problem = None
        if meta.num_rows != part.rows[table]:
            problem = f"holds {meta.num_rows} rows where its commit recorded {part.rows[table]}"
        elif table == "predictions" and meta.num_rows:
            low, high = _row_index_range(meta)
            if low is not None and (low < part.start_row or high >= part.end_row):
                problem = (
                    f"holds input rows {low}..{high}, outside its part's {part.start_row}..{part.end_row - 1}"
                )
        if problem:
            raise RunDirError(
                f"{run_dir}: {name} {problem} (changed or replaced since?); bertattn validate tells "
                "what else is wrong, and --overwrite starts the run again"
            )


def _row_index_range(meta: pq.FileMetaData) -> tuple[int | None, int | None]:
    """The smallest and largest row_index in a predictions file, from its statistics (None: none kept)."""
    lows, highs = [], []
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        column = next(
            (
                group.column(i)
                for i in range(group.num_columns)
                if group.column(i).path_in_schema == "row_index"
            ),
            None,
        )
        stats = column.statistics if column is not None else None
        if stats is None or not stats.has_min_max:
            return None, None
        lows.append(stats.min)
        highs.append(stats.max)
    return (min(lows), max(highs)) if lows else (None, None)


def _check_stored_part(run_dir: str | Path, uri: str) -> pq.FileMetaData:
    """:func:`check_part_file` on a store: there, a committed part has its final name from the start."""
    name = uri.removeprefix(os.fspath(run_dir).rstrip("/") + "/")
    if not storage.is_file(uri):
        problem = "is committed in the manifest but missing"
    else:
        try:
            with storage.arrow_file(uri) as f:
                return pq.read_metadata(f)
        except (pa.ArrowException, OSError) as e:
            problem = f"cannot be read ({first_line(e)})"
    raise RunDirError(f"{run_dir}: {name} {problem}; {DAMAGED}")


@dataclass(frozen=True)
class CommittedPart:
    name: str
    files: dict[str, Any]  # table -> absolute path, or URI on a store


def committed_files(
    run_dir: str | Path, tables: tuple[str, ...] | list[str] = TABLES, verify: bool = False
) -> list[CommittedPart]:
    """The files of ``tables`` of every part the manifest commits, in name order. The manifest, not the
    folder, says what is committed: a stray file is never read, and a committed file that is missing, cut
    short or holding other rows than its commit recorded stops the reader rather than leaving its reviews
    out or counting some twice. ``verify``: every page's checksum
    checked too (:func:`verify_pages`), for a reader of whole runs."""
    run_dir = storage.normalize(run_dir)
    manifest = read_manifest(run_dir)
    out = []
    for part in sorted(manifest.parts, key=lambda p: p.name):
        files = {t: run_file(run_dir, part.files[t]) for t in tables}
        check_part_rows(run_dir, part, {t: check_part_file(run_dir, f) for t, f in files.items()})
        for f in files.values() if verify else ():
            verify_pages(run_dir, f)
        out.append(CommittedPart(part.name, files))
    return out


def verify_pages(run_dir: str | Path, path: Any) -> None:
    """Decode every page of a local part file with its checksum checked, once per file a process.

    polars, which the analysis commands read with, checks no page checksums: a flipped bit on disk
    would be read as a value (a weight of 2e24) and summed into the aggregates. This costs ``aggregate``
    about a tenth more time (docs/reliability.md). A file on a store is left to ``validate``: ``plot`` reads a few
    row groups of it, and the commands that read whole runs read a local mirror."""
    if is_remote(path):
        return
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key in _VERIFIED:
        return
    try:
        decode_every_page(path)
    except (pa.ArrowException, OSError) as e:
        name = path.relative_to(run_dir) if path.is_relative_to(run_dir) else path
        raise RunDirError(f"{run_dir}: {name} is damaged ({first_line(e)}); {DAMAGED}") from None
    _VERIFIED.add(key)


def decode_every_page(path: Any) -> None:
    """Decode every page of a Parquet file with its checksum checked; what pyarrow raises is raised.
    Strings are read as dictionaries: decoded, a doc_id repeated on every attention row would take
    memory in proportion to the file's rows times the id's length."""
    strings = [
        f.name for f in pq.read_schema(path) if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
    ]
    pf = pq.ParquetFile(path, page_checksum_verification=True, read_dictionary=strings)
    try:
        for _ in pf.iter_batches(batch_size=1 << 16):
            pass
    finally:
        pf.close()


#: The part files :func:`verify_pages` found sound, by path, size and modification time.
_VERIFIED: set[tuple[str, int, int]] = set()


def run_file(run_dir: str | Path, name: str) -> Any:
    """A file of a run by its name in the manifest: a path on local disk, a URI on a store."""
    return storage.join(run_dir, name) if is_remote(run_dir) else Path(run_dir) / name
