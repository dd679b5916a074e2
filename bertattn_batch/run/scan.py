"""A run's committed parts as polars LazyFrames, read through the manifest (``scan_run``). A token is
stored once per review position in ``tokens``; :func:`attention_rows` joins it back to each
``cls_attention`` row: the long form.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.dataset as ds

from .. import schema, storage
from .manifest import read_manifest
from .parts import committed_files

#: The columns ``tokens`` adds to each attention row.
TOKEN_COLUMNS = ("token_id", "token", "start", "end", "word", "word_text")
#: What a token row is found by.
TOKEN_KEY = schema.key("tokens")
#: Schemes that polars reads itself (its own S3 and GCS clients, from the same environment).
POLARS_SCHEMES = (None, "s3", "gs", "gcs")


@dataclass(frozen=True)
class RunFrames:
    """One LazyFrame per table of a run, over the parts its manifest commits."""

    predictions: pl.LazyFrame
    cls_attention: pl.LazyFrame
    head_summary: pl.LazyFrame
    tokens: pl.LazyFrame
    contributions: pl.LazyFrame  # empty where the job did not ask for it (extract --contributions)

    @property
    def attention(self) -> pl.LazyFrame:
        """The long form: each ``cls_attention`` row with its token's id, text and span."""
        return attention_rows(self.cls_attention, self.tokens)


def scan_run(run_dir: str | Path) -> RunFrames:
    """Every table of a run, lazily, from the parts its manifest commits, local or on a store."""
    listed = read_manifest(run_dir).parts
    optional = [t for t in schema.OPTIONAL_TABLES if listed and all(t in p.files for p in listed)]
    tables = (*schema.TABLES, *optional)
    parts = committed_files(run_dir, tables)
    empty = {t: pl.DataFrame(schema.arrow(t).empty_table()).lazy() for t in schema.ALL_TABLES}
    return RunFrames(**empty | {t: scan_parts([p.files[t] for p in parts]) for t in tables if parts})


def scan_attention(run_dir: str | Path) -> pl.LazyFrame:
    """The long form of every part a run's manifest commits."""
    return scan_run(run_dir).attention


def attention_rows(attention: pl.LazyFrame, tokens: pl.LazyFrame) -> pl.LazyFrame:
    """Attention rows left-joined with their tokens: a row whose token is missing keeps null columns."""
    return attention.join(tokens.select(*TOKEN_KEY, *TOKEN_COLUMNS), on=TOKEN_KEY, how="left")


def scan_parts(files: list[Any]) -> pl.LazyFrame:
    """A lazy scan of part files: local, S3 and GCS by polars itself, others through a pyarrow dataset."""
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
