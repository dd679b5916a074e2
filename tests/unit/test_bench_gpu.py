"""bench/gpu.py dry-run on the CPU with a tiny model: the correctness block compares a job's tables with
transformers' eager attention (on the CPU in float32 they agree to float32's rounding), and the speed
block counts every review. What a GPU machine runs is this same code with other sizes."""

from __future__ import annotations

import json

from helpers import load_bench

gpu = load_bench("gpu")


def test_the_gpu_check_runs_through_on_the_cpu(tiny_zh_dir, zh_sample, tmp_path, capsys):
    out = tmp_path / "gpu.json"
    result = gpu.main(
        ["--device", "cpu", "--corpus", str(zh_sample), "--oracle-model", str(tiny_zh_dir),
         "--oracle-reviews", "12", "--rows", "90", "--threads-rows", "40", "--stage-reviews", "30",
         "--speed-model", str(tiny_zh_dir), "--out", str(out)]
    )  # fmt: skip
    float32 = result["correctness"]["float32"]
    assert float32["weight_max_abs"] < 1e-5 and float32["prob_max_abs"] < 1e-5 and float32["flipped"] == 0
    assert result["e2e"]["reviews"] == 90 and result["e2e"]["e2e_reviews_per_s"] > 0
    assert result["e2e_threads"]["reviews"] == 40 and result["e2e_threads"]["engine"]["host_processes"] == 0
    assert result["stage"]["reviews"] == 30 and all(
        result["stage"][w]["tokens_per_s"] > 0 for w in ("sync", "ahead")
    )
    assert json.loads(out.read_text())["e2e"]["tokens"] == result["e2e"]["tokens"]
    printed = capsys.readouterr().out
    assert "(a) correctness: 12 reviews" in printed and "end to end (threads): 40 reviews" in printed
    assert "FAILED" not in printed
