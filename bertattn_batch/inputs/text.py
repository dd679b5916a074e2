"""Plain-text inputs: one review a line, in a column named ``text``; lines end in ``\\n``, ``\\r\\n`` or a
lone ``\\r`` (universal newlines), the rows a CSV reader finds in the same bytes."""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterator
from typing import Any

from .files import Source


def read_text(src: Source, wanted: list[str], block_rows: int) -> Iterator[dict[str, list[Any]]]:
    # bytes that are not UTF-8 become lone surrogates (their rows: invalid_utf8); a byte-order mark is
    # no part of the first review
    with io.TextIOWrapper(src.open(), encoding="utf-8-sig", errors="surrogateescape") as f:
        while block := [line.removesuffix("\n") for line in itertools.islice(f, block_rows)]:
            yield {"text": block}


def text_columns(src: Source) -> list[str]:
    return ["text"]
