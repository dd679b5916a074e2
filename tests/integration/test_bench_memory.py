"""bench/memory.py: extract runs in subprocesses of their own, each sampled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from helpers import load_bench

memory = load_bench("memory")


@pytest.mark.slow
def test_memory_scaling_runs_extract_in_subprocesses(tiny_en_dir, drug_sample, tmp_path):
    mem = memory.memory_scaling(
        Path(tiny_en_dir), Path(drug_sample), tmp_path, (20, 50), 128, "cpu", keep_runs=True
    )
    for n in (20, 50):
        run = mem["runs"][str(n)]
        assert run["peak_rss_mb"] > 100  # torch alone is more than that
        assert len(run["peak_rss_mb_runs"]) == 2 and run["peak_rss_mb"] == max(run["peak_rss_mb_runs"])
        preds = pq.read_table(tmp_path / f"mem-{n}" / "predictions")
        assert preds.num_rows == n
        # the sampled series sees the child, not this process: both halves hold torch and the model
        assert len(run["peak_halves_mb_runs"]) == 2  # each run's own halves
        for first, second in run["peak_halves_mb_runs"]:
            assert 100 < first <= run["peak_rss_mb"] * 1.01 and 100 < second <= run["peak_rss_mb"] * 1.01
    assert mem["growth"] == pytest.approx(
        mem["runs"]["50"]["peak_rss_mb"] / mem["runs"]["20"]["peak_rss_mb"] - 1, abs=1e-3
    )
    assert np.isfinite(mem["growth"])
