#!/usr/bin/env bash
# One-GPU sweep benchmark: replica-steps/s and model FLOP utilisation for R in {1, 8, 64} at the
# paper model size (d_model 256, 6 layers, batch 512), float32 and bfloat16 matmuls.
#   bash experiments/benchmarks/device_sweep.sh            (needs jax with CUDA in $PYTHON's env)
# Results: experiments/benchmarks/results/device_sweep_paper{,_bf16}.{md,json} (and $OUT if set).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-.venv/bin/python}
PEAK_BF16=${PEAK_TFLOPS_BF16:-989}   # H200/H100 SXM dense bf16
PEAK_TF32=${PEAK_TFLOPS_TF32:-494}   # dense tf32 (XLA's default float32 matmul precision on GPU)
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
export PYTHONUNBUFFERED=1
"$PYTHON" -c "import jax; print(jax.devices())"
timeout 280 "$PYTHON" experiments/benchmarks/sweep_throughput.py --mode=device --model=paper \
  --replicas=1,8,64 --steps=10 --repeats=3 --peak_tflops="$PEAK_TF32"
timeout 250 "$PYTHON" experiments/benchmarks/sweep_throughput.py --mode=device --model=paper \
  --replicas=1,8,64 --steps=10 --repeats=3 --peak_tflops="$PEAK_BF16" --dtype=bfloat16 \
  --out=experiments/benchmarks/results/device_sweep_paper_bf16
if [ -n "${OUT:-}" ]; then cp experiments/benchmarks/results/device_sweep_paper* "$OUT"/; fi
