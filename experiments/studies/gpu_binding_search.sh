#!/usr/bin/env bash
# One GPU call that runs the paper-scale benchmark and, beside it, the binding search whose
# results docs/findings/phase_transition.md reports:
#   1. the throughput table of experiments/benchmarks/device_sweep.sh, alone on the GPU;
#   2. at once, each its own process on the same GPU: device_sweep.sh's gpu_quick sweep and
#      learning  binding learning time at coverage 1, |O| in {400, 100, 36, 16}, with and
#                without the product read-out;
#      product   coverage sweep, |O| in {100, 400}, product read-out, training queries
#                restricted to training objects;
#      plain     the same grid without the product read-out, trained longer;
#      lr        |O| = 400 as product, learning rates 3e-4 and 3e-3, and training queries over
#                all objects at 1e-3.
# Each search is killed at its time limit; its results.jsonl keeps the evaluations done by then.
# Everything (logs too) is packed into $OUT/search.tgz; $OUT/summary.txt holds the tables.
#   bash experiments/studies/gpu_binding_search.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu_search}
LOGS=runs/gpu_logs
mkdir -p "$OUT" "$LOGS"
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
SEARCH_SECONDS=${SEARCH_SECONDS:-300}

# Wheels carried in .whl/: all of them (bindjax's tested flax/optax/orbax versions), else only
# the packages the machine lacks, whichever passes a two-step smoke run first.
smoke() { "$PYTHON" -m bindjax.commands.main sweep --config=experiments/coverage_sweep.py:smoke \
  --workdir=runs/gpu_smoke --overwrite --progress=false --report=false \
  --config.grid.spaces='(2,4),' --config.grid.coverages=0.5 --config.grid.seeds=0 \
  --config.num_steps=2 --config.eval.every=2 >"$LOGS/smoke.log" 2>&1; }
for pick in "*.whl" "ml_collections*.whl"; do
  rm -rf /tmp/bindjax_site
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/bindjax_site \
    .whl/$pick
  export PYTHONPATH=$PWD:/tmp/bindjax_site
  if smoke; then echo "smoke run passed with wheels $pick"; break; fi
  echo "smoke run failed with wheels $pick:"; tail -5 "$LOGS/smoke.log"
done
mv .whl /tmp/bindjax_whl   # device_sweep.sh must not reinstall them
export OUT_DEVICE=runs/device_sweep

OUT=$OUT_DEVICE THROUGHPUT_SECONDS=150 bash experiments/benchmarks/device_sweep.sh throughput \
  >"$LOGS/throughput.log" 2>&1
echo "throughput exited $?"

search() {  # name, sweep overrides...
  local name=$1; shift
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.1 timeout "$SEARCH_SECONDS" "$PYTHON" -m bindjax.commands.main sweep \
    --config=experiments/coverage_sweep.py:cpu --workdir="runs/search_$name" --overwrite \
    --progress=false --report=false "$@" >"$LOGS/search_$name.log" 2>&1
  echo "search $name exited $?"
}
COVERAGES=0.05,0.1,0.2,0.3,0.4,0.5,0.7,0.9
XLA_PYTHON_CLIENT_MEM_FRACTION=0.1 timeout "$SEARCH_SECONDS" "$PYTHON" \
  experiments/benchmarks/binding_learning_time.py --sizes=20,10,6,4 \
  --models=cpu,cpu_product --seeds=2 --steps=4000 --eval_every=250 \
  --workdir=runs/search_learning --out=runs/binding_learning_time \
  >"$LOGS/search_learning.log" 2>&1 &
search product --config.grid.spaces='(2,10),(2,20)' --config.grid.coverages=$COVERAGES \
  --config.grid.seeds=0,1 --config.num_steps=5000 --config.eval.every=500 \
  --config.model.product_readout=both --config.sampler.train_queries=train &
search plain --config.grid.spaces='(2,10),(2,20)' --config.grid.coverages=$COVERAGES \
  --config.grid.seeds=0,1 --config.num_steps=8000 --config.eval.every=1000 \
  --config.sampler.train_queries=train &
( SEARCH_SECONDS=$(( SEARCH_SECONDS / 2 )) search lr --config.grid.spaces='(2,20),' --config.grid.coverages=$COVERAGES \
    --config.grid.seeds=0 --config.grid.learning_rates=3e-4,3e-3 --config.num_steps=5000 \
    --config.eval.every=500 --config.model.product_readout=both \
    --config.sampler.train_queries=train
  SEARCH_SECONDS=$(( SEARCH_SECONDS / 2 )) search all --config.grid.spaces='(2,20),' --config.grid.coverages=$COVERAGES \
    --config.grid.seeds=0 --config.num_steps=5000 --config.eval.every=500 \
    --config.model.product_readout=both ) &
XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 QUICK_SECONDS=${QUICK_SECONDS:-150} OUT=$OUT_DEVICE \
  timeout $(( SEARCH_SECONDS + 20 )) bash experiments/benchmarks/device_sweep.sh quick \
  >"$LOGS/quick.log" 2>&1
echo "quick sweep exited $?"
wait
for dir in runs/search_product runs/search_plain runs/search_lr runs/search_all runs/search_learning \
           $OUT_DEVICE/quick; do
  [ -f "$dir/results.jsonl" ] && [ ! -f "$dir/report/critical_coverage.md" ] &&
    "$PYTHON" -m bindjax.commands.main report --workdir="$dir" --step=final --draws=200 \
      >>"$LOGS/reports.log" 2>&1
done
mv /tmp/bindjax_whl .whl
{ cat $OUT_DEVICE/throughput.md runs/binding_learning_time.md 2>/dev/null
  for dir in $OUT_DEVICE/quick runs/search_*; do
    echo "== $dir"; cat "$dir/report/critical_coverage.md" 2>/dev/null; done
  tail -n 3 $LOGS/*.log; } >"$OUT/summary.txt"
tar czf "$OUT/search.tgz" --exclude=checkpoints runs/device_sweep runs/search_* runs/gpu_logs \
  runs/binding_learning_time.* 2>/dev/null
ls -la "$OUT"
