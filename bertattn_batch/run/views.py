"""The long form of a run's attention: each ``cls_attention`` row with its token's id, text and span.

Usage::

    rows = attention_rows(pl.scan_parquet(attn_files), pl.scan_parquet(token_files))   # one part, or all
    rows = scan_attention("runs/default")    # every committed part of a run, lazily

Since schema version 3 a token is stored once per review position in ``tokens`` rather than once per
layer and head in ``cls_attention`` (the token columns cost 1.2 bytes of every attention row when
repeated per head; see docs/performance.md); this join gives back the one wide table that analysts and our own readers ask questions of.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from .. import schema
from .parts import committed_files

#: The columns ``tokens`` adds to each attention row.
TOKEN_COLUMNS = ("token_id", "token", "start", "end")
#: What a token row is found by.
TOKEN_KEY = ["doc_id", "position"]


def attention_rows(attention: pl.LazyFrame, tokens: pl.LazyFrame) -> pl.LazyFrame:
    """Attention rows joined with their tokens: a left join, so that an attention row whose token row is
    missing keeps null token columns instead of vanishing (``validate`` reports such rows)."""
    return attention.join(tokens.select(*TOKEN_KEY, *TOKEN_COLUMNS), on=TOKEN_KEY, how="left")


def scan_attention(run_dir: str | Path) -> pl.LazyFrame:
    """The long form of every part a run's manifest commits (stray files are never read)."""
    parts = committed_files(run_dir, ("cls_attention", "tokens"))
    if not parts:
        return attention_rows(_empty("cls_attention"), _empty("tokens"))
    return attention_rows(
        pl.scan_parquet([p.files["cls_attention"] for p in parts], glob=False),
        pl.scan_parquet([p.files["tokens"] for p in parts], glob=False),
    )


def _empty(table: str) -> pl.LazyFrame:
    return pl.from_arrow(schema.arrow(table).empty_table()).lazy()  # type: ignore[union-attr]
