"""JSON lines inputs: one object a line; a line that is no object keeps its place as ``not_json``."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError
from .compressed import open_binary
from .discover import Source
from .rows import NOT_JSON

log = logging.getLogger(__name__)


def read_jsonl(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    text_col = wanted[0]
    block: dict[str, list[Any]] = {c: [] for c in wanted}
    checked = False  # keys are checked on a file's first object; later ones may omit them
    bad, first_bad = 0, []  # lines that are no JSON object: how many, and the first few
    with open_binary(src.path) as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = _json_line(raw)
            except json.JSONDecodeError as e:
                obj = e
            if not isinstance(obj, dict):
                what = (
                    f"not JSON: {obj.msg} at character {obj.pos + 1}"
                    if isinstance(obj, json.JSONDecodeError)
                    else f"got {type(obj).__name__}"
                )
                if not checked:  # the file's first line: no JSON lines file at all
                    raise InputError(
                        f"{src.path}:{lineno}: expected a JSON object on each line ({what}); "
                        "is it JSON lines, one object a line?"
                    )
                bad += 1
                if len(first_bad) < 5:
                    first_bad.append(lineno)
                obj = dict.fromkeys(wanted, NOT_JSON)
            elif not checked:
                missing = [c for c in wanted if c not in obj]
                if missing:
                    raise InputError(
                        f"{src.path}:{lineno}: no key {', '.join(repr(c) for c in missing)}; "
                        f"keys there: {', '.join(obj) or '(none)'}"
                    )
                checked = True
            for c in wanted:
                block[c].append(obj.get(c))
            if len(block[text_col]) >= block_rows:
                yield block
                block = {c: [] for c in wanted}
    if block[text_col]:
        yield block
    if bad:
        lines = ", ".join(map(str, first_bad)) + (", ..." if bad > len(first_bad) else "")
        log.warning(
            "%s: %s not a JSON object (%s); recorded with status not_json",
            src.path,
            "1 line is" if bad == 1 else f"{bad} lines are",
            f"line {lines}" if bad == 1 else f"lines {lines}",
        )


def _json_line(raw: bytes) -> Any:
    """One JSON line's value. Bytes that are not UTF-8 become lone surrogates: the row keeps its id and
    label, and a text holding them gets the status invalid_utf8."""
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        return json.loads(raw.decode("utf-8", errors="surrogateescape"))


def first_json_keys(path: Path) -> list[str] | None:
    """The keys of a JSON lines file's first object, which the reader checks too (later objects may
    omit keys); None for an empty file, or a first line the reader will name with its line number."""
    with open_binary(path) as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                obj = _json_line(raw)
            except json.JSONDecodeError:
                return None
            return list(obj) if isinstance(obj, dict) else None
    return None
