"""Plain-text inputs: one review a line, in a column named ``text``.

Lines end as Python's universal newlines end them, in ``\n``, ``\r\n`` or a lone ``\r`` (old Mac files):
the same rows a CSV reader finds in the same bytes.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import Any

from ..errors import InputError
from .discover import Source

#: Text column name for plain-text inputs (one review a line).
TEXT_FILE_COLUMN = "text"


def read_text(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    extra = [c for c in wanted if c != TEXT_FILE_COLUMN]
    if extra:
        raise InputError(
            f"{src.label}: a plain-text file has one column, {TEXT_FILE_COLUMN!r}; "
            f"it has no {', '.join(repr(c) for c in extra)}"
        )
    block: list[Any] = []
    with src.open() as f:
        for i, raw in enumerate(f):
            if i == 0:  # an editor's byte-order mark is no part of the review
                raw = raw.removeprefix(codecs.BOM_UTF8)
            block.extend(_lines(raw))
            if len(block) >= block_rows:
                yield {TEXT_FILE_COLUMN: block}
                block = []
    if block:
        yield {TEXT_FILE_COLUMN: block}


def _lines(raw: bytes) -> list[bytes]:
    """The lines of one ``\n``-terminated chunk (or the file's last, unterminated one), split again at
    each lone ``\r``: ``a\r\r\n`` is ``a`` and an empty line, as Python's universal newlines read it."""
    if raw.endswith(b"\n"):
        return (raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]).split(b"\r")
    lines = raw.split(b"\r")  # the end of the file: a last \r ends a line, and nothing is no line
    return lines[:-1] if not lines[-1] else lines
