"""Write a table derived from a run (``aggregate``, ``faithfulness``): one Parquet file, replaced at once,
whose metadata says which table and schema version it is, the options it was made with and the run it
came from, so that a reader can tell a stale table from a current one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .. import schema
from .._files import atomic_path
from ..errors import WriteError


def write_derived(
    path: Path, arrow: pa.Table, table: str, options: dict[str, Any], run_job_sha256: str, **meta: str
) -> None:
    """Write ``arrow`` (already cast to the schema of ``table``) to ``path``; readers see the old file
    or the new one, never half of it. ``meta``: more metadata keys, as strings."""
    metadata = {
        "table": table,
        "schema_version": str(schema.version(table)),
        "options": json.dumps(options),
        "run_job_sha256": run_job_sha256,
        **meta,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path, unique=True) as tmp:
            pq.write_table(arrow.replace_schema_metadata(metadata), tmp, compression="zstd")
    except OSError as e:
        raise WriteError(f"cannot write {path}: {e.strerror or e}") from None
