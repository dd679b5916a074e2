"""bench/host.py on a few hundred reviews with a tiny model: the stand-in's bert-base-shaped outputs
go through the real pipeline, every row is accounted for, and the real loader is put back."""

from __future__ import annotations

import polars as pl
import pytest
from helpers import load_bench

import bertattn_batch.engines.local as local

harness, host = load_bench("harness"), load_bench("host")


@pytest.mark.parametrize("processes", [0, 2])
def test_the_stand_in_feeds_the_real_pipeline(processes, tiny_zh_dir, zh_sample, tmp_path):
    inputs = harness.repeated_corpus(zh_sample, 300, tmp_path / "in.parquet", ids=True)
    real = local.load_classifier
    figures = host.one(inputs, tmp_path / "run", processes, model=tiny_zh_dir)
    assert figures["plan"]["host_processes"] == processes
    assert local.load_classifier is real
    assert figures["reviews"] == 300
    predictions = pl.read_parquet(tmp_path / "run" / "predictions" / "*.parquet")
    assert predictions.height == 300 and predictions["doc_id"].n_unique() == 300
    attention = pl.read_parquet(tmp_path / "run" / "cls_attention" / "*.parquet")
    assert attention["head"].n_unique() == host.HEADS  # bert-base's heads, not the tiny model's 4
    assert attention.height == figures["attn_rows"]
