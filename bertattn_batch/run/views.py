"""The long form of a run's attention: each ``cls_attention`` row with its token's id, text and span.

Usage::

    rows = attention_rows(pl.scan_parquet(attn_files), pl.scan_parquet(token_files))   # one part, or all
    rows = scan_attention("runs/default")    # every committed part of a run, lazily

Since schema version 3 a token is stored once per review position in ``tokens`` rather than once per
layer and head in ``cls_attention`` (the token columns cost 1.2 bytes of every attention row when
repeated per head; see docs/performance.md); this join gives back the one wide table that analysts and our own readers ask questions of.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.dataset as ds

from .. import schema, storage
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
        scan_parts([p.files["cls_attention"] for p in parts]),
        scan_parts([p.files["tokens"] for p in parts]),
    )


#: Schemes that polars reads itself (its own S3 and GCS clients, from the same environment).
POLARS_SCHEMES = (None, "s3", "gs", "gcs")


def scan_parts(files: list[Any]) -> pl.LazyFrame:
    """A lazy scan of part files (all of one run): local ones and those on S3 or GCS by polars itself,
    those of other schemes (HDFS, what fsspec serves) through a pyarrow dataset on their filesystem."""
    scheme = storage.split_uri(files[0])[0] if files else None
    if scheme in POLARS_SCHEMES:
        options = None
        if scheme == "s3" and (endpoint := os.environ.get("AWS_ENDPOINT_URL_S3")):
            options = {"aws_endpoint_url": endpoint}  # polars reads AWS_ENDPOINT_URL, not this one
        return pl.scan_parquet(files, glob=False, storage_options=options)
    fs, _ = storage.resolve(files[0])
    return pl.scan_pyarrow_dataset(
        ds.dataset([storage.resolve(f)[1] for f in files], format="parquet", filesystem=fs)
    )


def _empty(table: str) -> pl.LazyFrame:
    return pl.from_arrow(schema.arrow(table).empty_table()).lazy()  # type: ignore[union-attr]
