#!/usr/bin/env bash
# One CUDA GPU, about 5 minutes: the CUDA test subset, then benchmarks/gpu.py (speed fp32 / TF32 / bf16, peak memory
# with 32- and 8-bit optimizer state against the memory plan, a CUDA + CPU swarm with identical replicas), written to
# benchmarks/results/gpu.json. Without a GPU it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device on this machine; nothing to check"
    exit 0
fi
"$PY" -m pytest -q -m cuda tests/unit/test_cuda.py
"$PY" benchmarks/gpu.py --json benchmarks/results/gpu.json
