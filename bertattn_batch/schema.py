"""The table schemas, read from ``schemas/*.json``: the one place that names every column.

Usage::

    from bertattn_batch import schema
    schema.arrow("predictions")      # pyarrow.Schema with descriptions as field metadata
    schema.cast(table, "predictions")  # reorder/cast a table to the schema, or raise
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa

from .errors import BertAttnError

#: Tables every run directory holds, in commit order.
TABLES = ("predictions", "cls_attention", "head_summary", "tokens")
#: A review's ``status`` in predictions: 'ok', or why it was not scored (described in schemas/).
STATUSES = (
    "ok",
    "null_text",
    "not_text",
    "empty_text",
    "no_tokens",
    "invalid_utf8",
    "not_json",
    "wrong_field_count",
    "duplicate_id",
    "null_id",
)
#: Statuses of rows that have no source id: their doc id is their row number, so the checks for
#: repeated and committed ids leave them out (a real id equal to that number is still new).
ROW_NUMBER_STATUSES = ("null_id", "not_json", "wrong_field_count")
#: Statuses of rows read without a text to score: they do not claim their id within a pass, so a later
#: row with the same id and a text is scored rather than marked ``duplicate_id``. With
#: ``ROW_NUMBER_STATUSES`` and 'ok' they are every status a row can have as it is read.
NO_TEXT_STATUSES = ("null_text", "not_text", "empty_text", "invalid_utf8")

_PRIMITIVES = {
    "string": pa.string(),
    "bool": pa.bool_(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
}


def schema_dir() -> Path:
    """Where the JSON schemas live: packaged beside the code, or the repo's ``schemas/``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_schemas", here.parent / "schemas"):
        if candidate.is_dir():
            return candidate
    raise BertAttnError(f"schema folder not found beside {here}; reinstall bertattn-batch")


def _arrow_type(name: str) -> pa.DataType:
    if name.startswith("list<") and name.endswith(">"):
        return pa.list_(_arrow_type(name[5:-1]))
    try:
        return _PRIMITIVES[name]
    except KeyError:
        raise BertAttnError(f"unknown column type {name!r} in schemas/") from None


@cache
def spec(table: str) -> dict[str, Any]:
    """The raw JSON description of one table."""
    path = schema_dir() / f"{table}.json"
    if not path.is_file():
        raise BertAttnError(f"no schema for table {table!r} (looked for {path})")
    return json.loads(path.read_text(encoding="utf-8"))


def version(table: str) -> int:
    return int(spec(table)["version"])


def versions() -> dict[str, int]:
    """Every table's schema version: recorded in the manifest, checked on resume."""
    return {t: version(t) for t in TABLES}


@cache
def arrow(table: str) -> pa.Schema:
    """The pyarrow schema of a table; each field carries its description as metadata."""
    s = spec(table)
    fields = [
        pa.field(
            c["name"],
            _arrow_type(c["type"]),
            nullable=bool(c["nullable"]),
            metadata={"description": c["description"]},
        )
        for c in s["columns"]
    ]
    return pa.schema(fields, metadata={"table": table, "schema_version": str(s["version"])})


def columns(table: str) -> list[str]:
    return [c["name"] for c in spec(table)["columns"]]


def cast(table: pa.Table, name: str, keep_dictionaries: bool = False) -> pa.Table:
    """Select and cast ``table`` to schema ``name``; raise on missing columns or nulls where none may be.

    ``keep_dictionaries``: a string column that comes dictionary-encoded stays so (the extractor's
    tables repeat each review's id on every token row): the part writer hands its dictionary to Parquet
    as it is instead of hashing every value, and the file reads back as plain strings
    (``run.parts.write_table``)."""
    target = arrow(name)
    missing = [f.name for f in target if f.name not in table.column_names]
    if missing:
        raise BertAttnError(f"table {name!r} lacks columns {missing}")
    kept = [
        f.with_type(table.schema.field(f.name).type)
        if keep_dictionaries and _encoded_string(table.schema.field(f.name).type, f.type)
        else f
        for f in target
    ]
    out = table.select(target.names).cast(pa.schema(kept, metadata=target.metadata))
    for field in target:
        column = out.column(field.name)
        # a dictionary column's nulls may be in its dictionary as well as among its indices
        in_dictionary = pa.types.is_dictionary(column.type) and any(
            c.dictionary.null_count for c in column.chunks
        )
        if not field.nullable and (column.null_count or in_dictionary):
            raise BertAttnError(f"table {name!r}: column {field.name!r} holds nulls")
    return out


def _encoded_string(given: pa.DataType, wanted: pa.DataType) -> bool:
    return pa.types.is_dictionary(given) and given.value_type == wanted == pa.string()


def declared(table_schema: pa.Schema) -> pa.Schema:
    """``table_schema`` with every dictionary-encoded column as its plain value type: what the table's
    columns are, however they are held in memory."""
    fields = [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in table_schema]
    return pa.schema(fields, metadata=table_schema.metadata)


def check(actual: pa.Schema, name: str) -> list[str]:
    """Differences between a written file's schema and the table's schema (empty when they agree)."""
    target = arrow(name)
    problems = []
    if actual.names != target.names:
        problems.append(f"columns {actual.names} != {target.names}")
    for field in target:
        if field.name in actual.names and actual.field(field.name).type != field.type:
            problems.append(f"{field.name}: {actual.field(field.name).type} != {field.type}")
    said = {
        k.decode(errors="replace"): v.decode(errors="replace") for k, v in (actual.metadata or {}).items()
    }
    for key, value in (target.metadata or {}).items():  # which table, of which version, the file says it is
        key, value = key.decode(), value.decode()
        if said.get(key) != value:
            problems.append(f"its metadata says {key} {said.get(key)!r} where schemas/ says {value!r}")
    return problems
