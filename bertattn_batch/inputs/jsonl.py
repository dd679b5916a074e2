"""JSON inputs: JSON lines (one object a line; a line that is no object keeps its place as
``not_json``), or one JSON array of objects, as many exports write, read element by element."""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import logging
from collections.abc import Iterator
from itertools import chain
from typing import Any, BinaryIO

from ..errors import InputError
from .discover import Source
from .rows import NOT_JSON
from .streams import json_lead

log = logging.getLogger(__name__)

#: Bytes of a JSON array read at a time: an element is decoded once the buffer holds all of it.
ARRAY_CHUNK = 1 << 20
#: Characters after an element (or a decoding error) that tell it was not cut by the buffer's end.
_SLACK = 64


def read_jsonl(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    text_col = wanted[0]
    block: dict[str, list[Any]] = {c: [] for c in wanted}
    first = True  # a first value that is no JSON object: no JSON lines file at all
    # of each kind of value that is no object: its count, then its first numbers
    bad: dict[str, list[int]] = {"not a JSON object": [0], _TOO_DEEP: [0], _TOO_LONG: [0]}
    with src.open() as f:
        unit, values = json_values(f, src.label)
        for number, obj in values:
            if not isinstance(obj, dict):
                if first and not isinstance(obj, _Unreadable):
                    what = (
                        f"not JSON: {obj.msg} at character {obj.pos + 1}"
                        if isinstance(obj, json.JSONDecodeError)
                        else f"got {type(obj).__name__}"
                    )
                    where = "on each line" if unit == "line" else "in each element of the array"
                    hint = "; is it JSON lines, one object a line?" if unit == "line" else ""
                    raise InputError(f"{src.label}:{number}: expected a JSON object {where} ({what}){hint}")
                kind = bad[str(obj) if isinstance(obj, _Unreadable) else "not a JSON object"]
                kind[0] += 1
                if len(kind) <= 5:
                    kind.append(number)
                obj = dict.fromkeys(wanted, NOT_JSON)
            first = False
            for c in wanted:  # a key an object leaves out (exporters drop null fields) is a missing value
                block[c].append(obj.get(c))
            if len(block[text_col]) >= block_rows:
                yield block
                block = {c: [] for c in wanted}
    if block[text_col]:
        yield block
    for what, (count, *numbers) in bad.items():
        if count:
            listed = ", ".join(map(str, numbers)) + (", ..." if count > len(numbers) else "")
            log.warning(
                "%s: %s %s (%s); recorded with status not_json",
                src.label,
                f"1 {unit} is" if count == 1 else f"{count} {unit}s are",
                what,
                f"{unit} {listed}" if count == 1 else f"{unit}s {listed}",
            )


def json_values(f: BinaryIO, label: str) -> tuple[str, Iterator[tuple[int, Any]]]:
    """The values of a JSON lines file or of a JSON array, by number from 1, each a value or the
    exception that reading it raised; and what the numbers count ("line" or "element"). Told apart by
    the first character that is not a space (after an editor's byte-order mark)."""
    lead, blank = json_lead(f)
    if lead.lstrip().startswith(b"["):
        return "element", _array_elements(lead, f, label)
    lines = chain(io.BytesIO(lead + f.readline()), f)  # split at b"\n" alone, as a file's lines are
    return "line", ((n, _json_line(raw)) for n, raw in enumerate(lines, 1 + blank) if raw.strip())


def _array_elements(lead: bytes, f: BinaryIO, label: str) -> Iterator[tuple[int, Any]]:
    """The elements of a JSON array whose text begins with ``lead`` (up to and with its ``[``), decoded
    one at a time from a buffer of about ``ARRAY_CHUNK``: memory stays flat in the array's length. An
    element that is not JSON stops the read (where the next one starts is not known)."""
    decode = json.JSONDecoder().raw_decode
    text = codecs.getincrementaldecoder("utf-8")("surrogateescape")  # as a JSON line's bytes
    buf, pos, ended = text.decode(lead).lstrip()[1:], 0, False
    number, expect_value = 0, True

    def more() -> None:  # at least as much again as the buffer holds: a long element costs linear time
        nonlocal buf, pos, ended
        chunk = f.read(max(ARRAY_CHUNK, len(buf) - pos))
        buf, pos, ended = buf[pos:] + text.decode(chunk, final=not chunk), 0, not chunk

    def next_char(at: int) -> int:  # the first that is not a space from ``at``; len(buf) if none
        while at < len(buf) and buf[at] in " \t\r\n":
            at += 1
        return at

    while True:
        pos = next_char(pos)
        if pos == len(buf):
            if ended:
                raise InputError(
                    f"{label}: the JSON array ends without its closing ] (the file is cut short?)"
                )
            more()
            continue
        if buf[pos] == "]" and (not expect_value or number == 0):
            break
        if not expect_value:
            if buf[pos] != ",":
                raise InputError(f"{label}: expected , or ] after element {number} of the JSON array")
            pos, expect_value = pos + 1, True
            continue
        try:
            value, end = decode(buf, pos)
        except json.JSONDecodeError as e:
            at_end = e.msg.startswith("Unterminated") or e.pos >= len(buf.rstrip())
            if not ended and (at_end or e.pos >= len(buf) - _SLACK):  # cut by the buffer ("tru"): read on
                more()
                continue
            if at_end:
                raise InputError(
                    f"{label}: the JSON array ends inside element {number + 1} (the file is cut short?)"
                ) from None
            raise InputError(
                f"{label}: element {number + 1} of the JSON array is not JSON ({e.msg})"
            ) from None
        except (RecursionError, ValueError):
            raise InputError(
                f"{label}: element {number + 1} of the JSON array is {_TOO_DEEP_OR_LONG}"
            ) from None
        if not ended and len(buf) - end < _SLACK:  # "1." of "1.5e3" decodes too: read on, decode it whole
            more()
            continue
        number, pos, expect_value = number + 1, end, False
        yield number, value
    pos += 1
    while (pos := next_char(pos)) == len(buf) and not ended:  # after the array: spaces only
        buf, pos = "", 0
        more()
    if pos < len(buf):
        raise InputError(
            f"{label}: text follows the JSON array's closing ] (one array a file, or JSON lines)"
        )


class _Unreadable(Exception):
    """A line that may be valid JSON but that Python's JSON reader cannot read; its message says why."""


def _json_line(raw: bytes) -> Any:
    """One JSON line's value, or the exception that reading it raised. Bytes that are not UTF-8 become
    lone surrogates: the row keeps its id and label, and a text holding them gets the status
    invalid_utf8."""
    try:
        try:
            return json.loads(raw)
        except UnicodeDecodeError:
            return json.loads(raw.decode("utf-8", errors="surrogateescape"))
    except json.JSONDecodeError as e:
        return e
    except RecursionError:
        return _Unreadable(_TOO_DEEP)
    except ValueError:  # int() refuses more digits than sys.get_int_max_str_digits()
        return _Unreadable(_TOO_LONG)


#: Values Python's JSON reader cannot read: for their depth (about 1,000 nested arrays or objects), or for
#: an integer of more digits than ``int()`` reads (4,300 by default).
_TOO_DEEP = "nested deeper than the JSON reader goes"
_TOO_LONG = "holding an integer longer than the JSON reader reads"
_TOO_DEEP_OR_LONG = "nested deeper, or holds an integer longer, than the JSON reader reads"

#: Objects at the start of a JSON file whose keys tell its columns (objects may leave keys out).
KEY_SCAN_OBJECTS = 1000


def json_keys(src: Source) -> list[str] | None:
    """Every key of the first ``KEY_SCAN_OBJECTS`` objects of a JSON file, in order of first sight: a
    column none of them has is a typo, not a sparse field. None for an empty file, or a first value the
    reader will name with its number."""
    keys: dict[str, None] = {}
    seen = 0
    with src.open() as f, contextlib.suppress(InputError):  # an array the reader stops at, in its words
        for _, obj in json_values(f, src.label)[1]:
            if isinstance(obj, _Unreadable):  # a row recorded as not_json, no sign of a wrong format
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
