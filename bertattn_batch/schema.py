"""The table schemas, read from ``schemas/*.json``: the one place that names every column, its type,
whether it may be null, the range its values keep (``validate`` checks it) and each table's key."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa

from .errors import BertAttnError

#: Tables every run directory holds, in commit order.
TABLES = ("predictions", "cls_attention", "head_summary", "tokens")
#: Tables a run holds where its job asked for them (``contributions``: extract --contributions), in every
#: part of it then.
OPTIONAL_TABLES = ("contributions",)
ALL_TABLES = (*TABLES, *OPTIONAL_TABLES)
#: Statuses of rows without a source id: their doc id is their row number, which the checks for repeated
#: and committed ids leave out.
ROW_NUMBER_STATUSES = ("null_id", "not_json", "wrong_field_count")
#: Statuses of rows without a text to score: they claim no id, so a later row with that id and a text is
#: scored, not marked ``duplicate_id``.
NO_TEXT_STATUSES = ("null_text", "not_text", "empty_text", "invalid_utf8")
#: A review's ``status`` in predictions: 'ok', or why it was not scored (described in schemas/).
STATUSES = ("ok", "no_tokens", "duplicate_id", *ROW_NUMBER_STATUSES, *NO_TEXT_STATUSES)


@cache
def spec(table: str) -> dict[str, Any]:
    """The raw JSON description of one table (packaged beside the code, or the repo's ``schemas/``)."""
    here = Path(__file__).resolve().parent
    for folder in (here / "_schemas", here.parent / "schemas"):
        if (folder / f"{table}.json").is_file():
            return json.loads((folder / f"{table}.json").read_text(encoding="utf-8"))
    raise BertAttnError(f"no schema for table {table!r} beside {here}; reinstall bertattn-batch")


def version(table: str) -> int:
    """A table's schema version."""
    return int(spec(table)["version"])


def versions() -> dict[str, int]:
    """Every table's schema version: recorded in the manifest, checked on resume."""
    return {t: version(t) for t in ALL_TABLES}


def key(table: str) -> list[str]:
    """The columns that name a row of ``table`` (what a join and a message find it by)."""
    return list(spec(table).get("key", []))


def ranges(table: str) -> list[tuple[str, Any, Any, str]]:
    """``(column, low, high, check)`` for each column whose values keep a range: a bound is a number,
    another column's name, or None (unbounded); ``check`` is the validate check that promises it."""
    return [(c["name"], *c["range"], c["check"]) for c in spec(table)["columns"] if "range" in c]


def _arrow_type(name: str) -> pa.DataType:
    if name.startswith("list<") and name.endswith(">"):
        return pa.list_(_arrow_type(name[5:-1]))
    try:
        return pa.type_for_alias(name)
    except ValueError:
        raise BertAttnError(f"unknown column type {name!r} in schemas/") from None


@cache
def arrow(table: str) -> pa.Schema:
    """The pyarrow schema of a table; each field carries its description as metadata."""
    s = spec(table)
    fields = [
        pa.field(c["name"], _arrow_type(c["type"]), bool(c["nullable"]), {"description": c["description"]})
        for c in s["columns"]
    ]
    return pa.schema(fields, metadata={"table": table, "schema_version": str(s["version"])})


def columns(table: str) -> list[str]:
    return [c["name"] for c in spec(table)["columns"]]


def cast(table: pa.Table, name: str, keep_dictionaries: bool = False) -> pa.Table:
    """Select and cast ``table`` to schema ``name``; raise on missing columns or nulls where none may be.
    ``keep_dictionaries``: a dictionary-encoded string column stays so, for the part writer to hand to
    Parquet as it is."""
    target = arrow(name)
    if missing := [f.name for f in target if f.name not in table.column_names]:
        raise BertAttnError(f"table {name!r} lacks columns {missing}")
    given = {f.name: f.type for f in table.schema}
    kept = [
        f.with_type(given[f.name])
        if keep_dictionaries and pa.types.is_dictionary(given[f.name]) and f.type == pa.string()
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


def declared(table_schema: pa.Schema) -> pa.Schema:
    """``table_schema`` with every dictionary-encoded column as its plain value type."""
    fields = [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in table_schema]
    return pa.schema(fields, metadata=table_schema.metadata)


def check(actual: pa.Schema, name: str) -> list[str]:
    """Differences between a written file's schema and the table's schema (empty when they agree)."""
    target = arrow(name)
    problems = [f"columns {actual.names} != {target.names}"] if actual.names != target.names else []
    problems += [
        f"{f.name}: {actual.field(f.name).type} != {f.type}"
        for f in target
        if f.name in actual.names and actual.field(f.name).type != f.type
    ]
    said = {
        k.decode(errors="replace"): v.decode(errors="replace") for k, v in (actual.metadata or {}).items()
    }
    for k, v in (target.metadata or {}).items():  # the table and version the file says it is
        if said.get(k.decode()) != v.decode():
            problems.append(
                f"its metadata says {k.decode()} {said.get(k.decode())!r} where schemas/ says {v.decode()!r}"
            )
    return problems
