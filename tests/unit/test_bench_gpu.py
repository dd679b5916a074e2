"""bench/gpu.py dry-run on the CPU with a tiny model: the correctness block compares a job's tables with
transformers' eager attention (on the CPU in float32 they agree to float32's rounding), and the speed
block counts every review. What a GPU machine runs is this same code with other sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_bench

REPO = Path(__file__).resolve().parents[2]

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


def _gpu_sh(tmp_path: Path, python: str, gpu_listed: bool) -> subprocess.CompletedProcess:
    """bench/gpu.sh with ``python`` as its Python, on a PATH whose nvidia-smi lists a GPU or fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{'echo GPU 0: NVIDIA H200' if gpu_listed else 'exit 9'}\n")
    smi.chmod(0o755)
    env = {**os.environ, "PYTHON": python, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(REPO / "bench" / "gpu.sh")], env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("python", "gpu_listed", "rc", "said"),
    [
        (sys.executable, False, 0, "no CUDA device visible"),  # a CPU machine: nothing to do
        (sys.executable, True, 1, "install a CUDA build of torch"),  # this CPU build on a GPU machine
        ("/bin/false", True, 1, "cannot import torch"),  # a Python without torch
    ],
)
def test_gpu_sh_fails_where_a_gpu_is_there_but_its_python_cannot_use_it(
    tmp_path, python, gpu_listed, rc, said
):
    done = _gpu_sh(tmp_path, python, gpu_listed)
    assert done.returncode == rc
    assert said in done.stdout + done.stderr
