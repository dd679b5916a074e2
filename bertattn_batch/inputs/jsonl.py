"""JSON inputs: JSON lines (one object a line; a line that is no object keeps its place as ``not_json``),
or one JSON array of objects, as many exports write, read element by element in bounded memory."""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from itertools import chain
from typing import Any, BinaryIO

from ..errors import InputError
from .files import Source, json_lead
from .rows import NOT_JSON, some

log = logging.getLogger(__name__)

#: Characters of a JSON array read at a time: an element is decoded once the buffer holds all of it.
ARRAY_CHUNK = 1 << 20
#: Characters after an element (or a decoding error) that tell it was not cut by the buffer's end.
_SLACK = 64
_SPACES = re.compile(r"[ \t\r\n]*")
#: Objects at the start of a JSON file whose keys tell its columns (objects may leave keys out).
KEY_SCAN_OBJECTS = 1000


class _Unreadable(Exception):
    """A value that may be valid JSON but that Python's JSON reader cannot read; its message says why."""


_TOO_DEEP = "nested deeper than the JSON reader goes"  # about 1,000 levels
_TOO_LONG = "holding an integer longer than the JSON reader reads"  # int()'s 4,300 digits


def read_jsonl(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    block: dict[str, list[Any]] = {c: [] for c in wanted}
    counts: Counter[str] = Counter()  # of each reason a value is no row, and its first numbers
    firsts: dict[str, list[int]] = defaultdict(list)
    with src.open() as f:
        unit, values = json_values(f, src.label)
        for i, (number, obj) in enumerate(values):
            if not isinstance(obj, dict):
                if i == 0 and not isinstance(obj, _Unreadable):  # no JSON lines file at all
                    what = (
                        f"not JSON: {obj.msg} at character {obj.pos + 1}"
                        if isinstance(obj, json.JSONDecodeError)
                        else f"got {type(obj).__name__}"
                    )
                    where = "on each line" if unit == "line" else "in each element of the array"
                    hint = "; is it JSON lines, one object a line?" if unit == "line" else ""
                    raise InputError(f"{src.label}:{number}: expected a JSON object {where} ({what}){hint}")
                why = str(obj) if isinstance(obj, _Unreadable) else "not a JSON object"
                counts[why] += 1
                if len(firsts[why]) < 5:
                    firsts[why].append(number)
                obj = dict.fromkeys(wanted, NOT_JSON)
            for c in wanted:  # a key an object leaves out (exporters drop null fields) is a missing value
                block[c].append(obj.get(c))
            if len(block[wanted[0]]) >= block_rows:
                yield block
                block = {c: [] for c in wanted}
    if block[wanted[0]]:
        yield block
    for why, count in counts.items():
        verb = f"1 {unit} is" if count == 1 else f"{count} {unit}s are"
        log.warning(
            "%s: %s %s (%s); recorded with status not_json",
            src.label,
            verb,
            why,
            some(firsts[why], count, unit),
        )


def json_values(f: BinaryIO, label: str) -> tuple[str, Iterator[tuple[int, Any]]]:
    """The values of a JSON lines file or of a JSON array, numbered from 1, each a value or the exception
    that reading it raised; and what the numbers count ("line" or "element")."""
    lead, blank = json_lead(f)
    if lead.lstrip().startswith(b"["):
        return "element", _array_elements(lead, f, label)
    lines = chain(io.BytesIO(lead + f.readline()), f)  # split at b"\n" alone, as a file's lines are
    return "line", ((n, _json_line(raw)) for n, raw in enumerate(lines, 1 + blank) if raw.strip())


def _json_line(raw: bytes) -> Any:
    """One JSON line's value, or the exception that reading it raised. Bytes that are not UTF-8 become
    lone surrogates: the row keeps its id and label, and such a text gets the status invalid_utf8."""
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


def _array_elements(lead: bytes, f: BinaryIO, label: str) -> Iterator[tuple[int, Any]]:
    """The elements of a JSON array whose text begins with ``lead`` (its ``[`` included), decoded one
    at a time from a buffer of about ``ARRAY_CHUNK``. An element that is not JSON stops the read: where
    the next one starts is not known."""
    decode = json.JSONDecoder().raw_decode
    text = codecs.getincrementaldecoder("utf-8")("surrogateescape")  # as a JSON line's bytes
    buf, pos, ended = text.decode(lead).lstrip()[1:], 0, False
    number, after_element = 0, False

    def more() -> None:  # at least as much again as the buffer holds: a long element costs linear time
        nonlocal buf, pos, ended
        chunk = f.read(max(ARRAY_CHUNK, len(buf) - pos))
        buf, pos, ended = buf[pos:] + text.decode(chunk, final=not chunk), 0, not chunk

    while True:
        pos = _SPACES.match(buf, pos).end()
        if pos == len(buf):
            if ended:
                raise InputError(
                    f"{label}: the JSON array ends without its closing ] (the file is cut short?)"
                )
            more()
        elif buf[pos] == "]" and (after_element or number == 0):
            break
        elif after_element:
            if buf[pos] != ",":
                raise InputError(f"{label}: expected , or ] after element {number} of the JSON array")
            pos, after_element = pos + 1, False
        else:
            try:
                value, end = decode(buf, pos)
            except json.JSONDecodeError as e:
                cut = e.msg.startswith("Unterminated") or e.pos >= len(buf.rstrip())
                if not ended and (cut or e.pos >= len(buf) - _SLACK):  # cut by the buffer ("tru"): read on
                    more()
                    continue
                if cut:
                    raise InputError(
                        f"{label}: the JSON array ends inside element {number + 1} (the file is cut short?)"
                    ) from None
                raise InputError(
                    f"{label}: element {number + 1} of the JSON array is not JSON ({e.msg})"
                ) from None
            except (RecursionError, ValueError):
                raise InputError(
                    f"{label}: element {number + 1} of the JSON array is nested deeper, or holds an integer "
                    "longer, than the JSON reader reads"
                ) from None
            if not ended and len(buf) - end < _SLACK:  # "1." of "1.5e3" decodes too: read on, decode it whole
                more()
                continue
            number, pos, after_element = number + 1, end, True
            yield number, value
    pos += 1
    while (pos := _SPACES.match(buf, pos).end()) == len(buf) and not ended:
        more()
    if pos < len(buf):
        raise InputError(
            f"{label}: text follows the JSON array's closing ] (one array a file, or JSON lines)"
        )


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
