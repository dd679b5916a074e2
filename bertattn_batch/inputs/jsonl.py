"""JSON lines inputs: one object a line; a line that is no object keeps its place as ``not_json``."""

from __future__ import annotations

import codecs
import json
import logging
from collections.abc import Iterator
from typing import Any

from ..errors import InputError
from .discover import Source
from .rows import NOT_JSON

log = logging.getLogger(__name__)


def read_jsonl(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    text_col = wanted[0]
    block: dict[str, list[Any]] = {c: [] for c in wanted}
    first = True  # a first line that is no JSON object: no JSON lines file at all
    # of each kind of line that is no object: its count, then its first line numbers
    bad: dict[str, list[int]] = {"not a JSON object": [0], _TOO_DEEP: [0], _TOO_LONG: [0]}
    with src.open() as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1:  # an editor's byte-order mark, even before a blank line
                raw = raw.removeprefix(codecs.BOM_UTF8)
            if not raw.strip():
                continue
            try:
                obj = _json_line(raw)
            except (json.JSONDecodeError, _Unreadable) as e:
                obj = e
            if not isinstance(obj, dict):
                if first and not isinstance(obj, _Unreadable):
                    what = (
                        f"not JSON: {obj.msg} at character {obj.pos + 1}"
                        if isinstance(obj, json.JSONDecodeError)
                        else f"got {type(obj).__name__}"
                    )
                    raise InputError(
                        f"{src.label}:{lineno}: expected a JSON object on each line ({what}); "
                        "is it JSON lines, one object a line?"
                    )
                kind = bad[str(obj) if isinstance(obj, _Unreadable) else "not a JSON object"]
                kind[0] += 1
                if len(kind) <= 5:
                    kind.append(lineno)
                obj = dict.fromkeys(wanted, NOT_JSON)
            first = False
            for c in wanted:  # a key an object leaves out (exporters drop null fields) is a missing value
                block[c].append(obj.get(c))
            if len(block[text_col]) >= block_rows:
                yield block
                block = {c: [] for c in wanted}
    if block[text_col]:
        yield block
    for what, (count, *linenos) in bad.items():
        if count:
            lines = ", ".join(map(str, linenos)) + (", ..." if count > len(linenos) else "")
            log.warning(
                "%s: %s %s (%s); recorded with status not_json",
                src.label,
                "1 line is" if count == 1 else f"{count} lines are",
                what,
                f"line {lines}" if count == 1 else f"lines {lines}",
            )


class _Unreadable(Exception):
    """A line that may be valid JSON but that Python's JSON reader cannot read; its message says why."""


def _json_line(raw: bytes) -> Any:
    """One JSON line's value. Bytes that are not UTF-8 become lone surrogates: the row keeps its id and
    label, and a text holding them gets the status invalid_utf8."""
    try:
        try:
            return json.loads(raw)
        except UnicodeDecodeError:
            return json.loads(raw.decode("utf-8", errors="surrogateescape"))
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise _Unreadable(_TOO_DEEP) from None
    except ValueError:  # int() refuses more digits than sys.get_int_max_str_digits()
        raise _Unreadable(_TOO_LONG) from None


#: Lines Python's JSON reader cannot read: for their depth (about 1,000 nested arrays or objects), or for
#: an integer of more digits than ``int()`` reads (4,300 by default).
_TOO_DEEP = "nested deeper than the JSON reader goes"
_TOO_LONG = "holding an integer longer than the JSON reader reads"

#: Objects at the start of a JSON lines file whose keys tell its columns (objects may leave keys out).
KEY_SCAN_OBJECTS = 1000


def json_keys(src: Source) -> list[str] | None:
    """Every key of the first ``KEY_SCAN_OBJECTS`` objects of a JSON lines file, in order of first sight:
    a column none of them has is a typo, not a sparse field. None for an empty file, or a first line
    the reader will name with its line number."""
    keys: dict[str, None] = {}
    seen = 0
    with src.open() as f:
        for raw in f:
            raw = raw.removeprefix(codecs.BOM_UTF8) if not seen else raw
            if not raw.strip():
                continue
            try:
                obj = _json_line(raw)
            except json.JSONDecodeError:
                obj = None
            except _Unreadable:  # a row the reader records as not_json, no sign of a wrong format
                continue
            if not isinstance(obj, dict):
                if not seen:
                    return None
                continue
            keys.update(dict.fromkeys(obj))
            seen += 1
            if seen >= KEY_SCAN_OBJECTS:
                break
    return list(keys) if seen else None
