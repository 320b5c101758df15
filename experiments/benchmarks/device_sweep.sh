#!/usr/bin/env bash
# The paper-scale sweep on one accelerator, in one call:
#   1. jax with CUDA if missing (pip, when a package index is reachable; wheels in ./.whl/ are
#      installed first, for machines without one);
#   2. the throughput table: replica-steps/s and model FLOP utilisation for R in {1, 8, 64} of the
#      published towers (d_model 256, 6 layers, batch 512) with bfloat16 matmuls;
#   3. the gpu_quick coverage sweep (experiments/coverage_sweep.py:gpu_quick), its step count set
#      from the R=8 rate so that training takes about QUICK_SECONDS; `bindjax sweep` writes its
#      report (final step) under quick/report/;
#   4. `bindjax binding` on that sweep's replicas (experiments/binding.py:paper: the default fit,
#      the paper's MLP width) and, from its measured fitting seconds per replica, the projected
#      cost of the sweep-wide fits of 500 replicas on this device (binding_projection.{md,json}).
# Everything lands in $OUT (default runs/device_sweep): the throughput table (.md/.json), the
# sweep's results.jsonl, summary.csv and report/, the binding fits under quick_binding/, the
# projection, and device_sweep.log.
#
#   bash experiments/benchmarks/device_sweep.sh            # GPU machine: every stage
#   bash experiments/benchmarks/device_sweep.sh throughput # or quick, or binding: one stage
#   bash experiments/benchmarks/device_sweep.sh learning_time   # only when named: the plain
#       towers' learning time at coverage 1 at the original code's width (d_ff 2,048) for
#       |O| = 64, 225 and 400, 4 seeds, 60,000 steps (the CPU law puts |O| = 400 near 43,000;
#       docs/findings/learning_time.md; LT_SIZES, LT_MODELS, LT_SEEDS, LT_STEPS, LT_SECONDS
#       override), for a second call when the device has time left after the first
#   bash experiments/benchmarks/device_sweep.sh plain400   # only when named: plain towers at
#       the study's |O| = 400 (experiments/coverage_sweep.py:gpu_plain_400), their rate at 32
#       replicas measured first and the sweep sized to PLAIN_SECONDS (210) of training; rows and
#       report come back in plain400.tar.gz (docs/findings/scaling_law.md)
#   DEVICE_SWEEP_CPU=1 bash experiments/benchmarks/device_sweep.sh   # CPU fallback: tiny model
# The quick stage sizes its steps from $OUT/throughput.json when there is one, else it keeps the
# preset's step count.
#
# Without a GPU (or with DEVICE_SWEEP_CPU=1) the same three steps run on a tiny model, with XLA's
# cheaper CPU compiles (sweep.fast_compile), in about a
# minute, which is what tests/test_device_sweep.py checks.
set -uo pipefail
cd "$(dirname "$0")/../.."
STAGE=${1:-all}
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "$PYTHON" = python3 ] && PYTHON=.venv/bin/python
OUT=${OUT:-runs/device_sweep}
QUICK_SECONDS=${QUICK_SECONDS:-300}
PEAK_BF16=${PEAK_TFLOPS_BF16:-989}   # H100/H200 SXM dense bfloat16
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device_sweep.log") 2>&1

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/bindjax_site \
    .whl/*.whl && export PYTHONPATH=/tmp/bindjax_site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
backend() { "$PYTHON" -c "import jax; print(jax.default_backend())" 2>/dev/null; }
if [ "${DEVICE_SWEEP_CPU:-0}" != 1 ] && [ "$(backend)" != gpu ] && command -v nvidia-smi >/dev/null; then
  echo "installing jax with CUDA"
  PIP=("$PYTHON" -m pip install -q -U --timeout 20 --retries 1)
  "${PIP[@]}" "jax[cuda13]" || "${PIP[@]}" "jax[cuda12]" ||
    echo "could not install jax with CUDA: running the CPU fallback"
fi
if [ "${DEVICE_SWEEP_CPU:-0}" = 1 ] || [ "$(backend)" != gpu ]; then
  echo "no GPU: CPU fallback on a tiny model"
  MODEL=small; REPLICAS=1,2; STEPS=2; REPEATS=1; PRESET=smoke; MIN_STEPS=10; FITS=smoke
  LT_DEFAULT_SIZES=3; LT_DEFAULT_STEPS=20; LT_DEFAULT_EVERY=10; LT_DEFAULT_MODELS=cpu
  QUICK_SECONDS=${QUICK_SECONDS_CPU:-1}
  PLAIN_SECONDS=${PLAIN_SECONDS_CPU:-1}; PLAIN_PROBE=1; PLAIN_ROUND=10; PEAK_FP32=1
  EXTRA=(--config.grid.spaces='(2,4),' --config.grid.coverages=0.5 --config.grid.seeds=0
         --config.eval.batches=1 --config.sweep.fast_compile=True)
  FAST=(--fast_compile)
  export JAX_PLATFORMS=cpu
else
  MODEL=paper; REPLICAS=1,8,64; STEPS=10; REPEATS=3; PRESET=gpu_quick; MIN_STEPS=100; EXTRA=()
  FITS=paper; LT_DEFAULT_SIZES=8,15,20; LT_DEFAULT_STEPS=60000; LT_DEFAULT_EVERY=1000
  LT_DEFAULT_MODELS=cpu_ff2048
  PLAIN_SECONDS=${PLAIN_SECONDS:-210}; PLAIN_PROBE=32; PLAIN_ROUND=1000; PEAK_FP32=67; FAST=()
  export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
"$PYTHON" -c "import jax, flax; print('jax', jax.__version__, 'flax', flax.__version__, jax.devices())"

wants() { [ "$STAGE" = all ] || [ "$STAGE" = "$1" ]; }

if wants throughput; then
timeout "${THROUGHPUT_SECONDS:-300}" "$PYTHON" experiments/benchmarks/sweep_throughput.py --mode=device --model=$MODEL \
  --replicas=$REPLICAS --steps=$STEPS --repeats=$REPEATS --peak_tflops="$PEAK_BF16" \
  --dtype=bfloat16 --out="$OUT/throughput" "${FAST[@]}"
fi

# Steps for a sweep of preset $1 (overrides after $4): $2 seconds of training at the rate in
# throughput JSON $3 of the bucket size closest to the sweep's, rounded down to a multiple of
# MIN (at least MIN); the preset's own steps when there is no such file.
size_steps() {
"$PYTHON" - "$@" <<'EOF'
import json, sys
from bindjax.commands import flags
from bindjax.training import grid
preset, seconds, path, least = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
overrides = sys.argv[5:]
fv = flags.new_flag_values(with_workdir=False)
flags.parse(fv, ["steps", f"--config=experiments/coverage_sweep.py:{preset}", *overrides])
replicas = len(grid.expand_grid(fv["config"].value)[0])
try:
  rows = json.load(open(path))["rows"]
  row = min(rows, key=lambda r: abs(r["replicas"] - replicas))
  steps = seconds * row["replica_steps_per_s"] / replicas
except (OSError, KeyError, ValueError):
  steps = fv["config"].value.num_steps
print(max(least, int(steps) // least * least))
EOF
}

if wants quick; then
STEPS_QUICK=$(size_steps "$PRESET" "$QUICK_SECONDS" "$OUT/throughput.json" "$MIN_STEPS" \
  "${EXTRA[@]}")
[ -n "$STEPS_QUICK" ] || { echo "could not size the quick sweep"; exit 1; }
echo "quick sweep: $STEPS_QUICK steps"
EVERY=$(( STEPS_QUICK / 10 > 0 ? STEPS_QUICK / 10 : 1 ))
timeout $(( QUICK_SECONDS * 3 + 120 )) "$PYTHON" -m bindjax.commands.main sweep \
  --config=experiments/coverage_sweep.py:$PRESET --workdir="$OUT/quick" --overwrite \
  --config.num_steps="$STEPS_QUICK" --config.eval.every="$EVERY" \
  --config.checkpoint.every="$STEPS_QUICK" --config.log_every="$EVERY" "${EXTRA[@]}"
fi

if wants binding; then
# The sweep-wide binding fits of the quick sweep's replicas, and what 500 replicas would cost.
timeout "${BINDING_SECONDS:-240}" "$PYTHON" -m bindjax.commands.main binding --workdir="$OUT/quick" \
  --config=experiments/binding.py:$FITS --out="$OUT/quick_binding" --overwrite --noprogress ||
  { echo "binding fits did not finish"; exit 1; }
"$PYTHON" experiments/benchmarks/binding_fits.py --project="$OUT/quick_binding/results.json" \
  --out="$OUT/binding_projection"
fi

if [ "$STAGE" = plain400 ]; then
# Plain towers at the study's |O| = 400 (experiments/coverage_sweep.py:gpu_plain_400): the
# towers' rate at the sweep's bucket size, then the sweep sized to PLAIN_SECONDS of training
# (at most PLAIN_MAX_STEPS steps), evaluated 20 times. The workdir stays on the machine
# (checkpoints); its rows, config, replica list and report come back in plain400.tar.gz, also
# when the timeout cuts the sweep.
PLAIN_WORK=${PLAIN_WORKDIR:-/tmp/bindjax_plain400}
timeout "${THROUGHPUT_SECONDS:-300}" "$PYTHON" experiments/benchmarks/sweep_throughput.py \
  --mode=device --model=cpu_plain_ff1024 --replicas=$PLAIN_PROBE --steps=$STEPS \
  --repeats=$REPEATS --peak_tflops="$PEAK_FP32" --out="$OUT/plain400_throughput" "${FAST[@]}"
STEPS_PLAIN=$(size_steps gpu_plain_400 "$PLAIN_SECONDS" "$OUT/plain400_throughput.json" \
  "$PLAIN_ROUND" "${EXTRA[@]}")
[ -n "$STEPS_PLAIN" ] || { echo "could not size the plain sweep"; exit 1; }
MAX_PLAIN=${PLAIN_MAX_STEPS:-150000}
STEPS_PLAIN=$(( STEPS_PLAIN < MAX_PLAIN ? STEPS_PLAIN : MAX_PLAIN ))
echo "plain sweep: $STEPS_PLAIN steps"
EVERY=$(( STEPS_PLAIN / 20 > 0 ? STEPS_PLAIN / 20 : 1 ))
timeout $(( PLAIN_SECONDS * 3 / 2 + 150 )) "$PYTHON" -m bindjax.commands.main sweep \
  --config=experiments/coverage_sweep.py:gpu_plain_400 --workdir="$PLAIN_WORK" --overwrite \
  --config.num_steps="$STEPS_PLAIN" --config.eval.every="$EVERY" --notensorboard \
  --config.checkpoint.every="$STEPS_PLAIN" --config.log_every="$EVERY" "${EXTRA[@]}" ||
  echo "plain sweep stopped (exit $?): its rows so far come back"
( cd "$PLAIN_WORK" && tar -czf "$OUT/plain400.tar.gz" --ignore-failed-read config.json \
    replicas.json results.jsonl summary.csv sweep_done.json report 2>/dev/null )
fi

if [ "$STAGE" = learning_time ]; then
# Plain towers' learning time at coverage 1 at sizes 2 CPU cores cannot finish;
# a run cut by the timeout is tabulated from the rows it wrote.
LT=(--sizes="${LT_SIZES:-$LT_DEFAULT_SIZES}" --models="${LT_MODELS:-$LT_DEFAULT_MODELS}"
    --seeds="${LT_SEEDS:-4}" --eval_every="${LT_EVERY:-$LT_DEFAULT_EVERY}" "${FAST[@]}")
timeout "${LT_SECONDS:-420}" "$PYTHON" experiments/benchmarks/binding_learning_time.py "${LT[@]}" \
  --steps="${LT_STEPS:-$LT_DEFAULT_STEPS}" --workdir="$OUT/learning_time" --out="$OUT/learning_time" ||
  "$PYTHON" experiments/benchmarks/binding_learning_time.py "${LT[@]}" \
    --tabulate="$OUT/learning_time/results.jsonl" --note="cut at ${LT_SECONDS:-420} s" \
    --out="$OUT/learning_time"
fi
