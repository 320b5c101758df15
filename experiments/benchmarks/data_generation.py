"""Scene generator throughput: scenes/s with all queries and labels, compiled and warmed up.

  .venv/bin/python experiments/benchmarks/data_generation.py            # B=512, C=2, V=20, K=2
  .venv/bin/python experiments/benchmarks/data_generation.py --repeats=9 --seconds=1

Each row times `repeats` runs of at least `seconds` each, blocking on every call's result (so no
run is flattered by queued asynchronous work), rows interleaved so that load drift on a shared
machine hits them alike, and reports the median scenes/s with its min/max, the median scenes per
CPU-second the process got (robust to other processes' load) and the load average.
Rows: one batch per call (what a train step does), several batches per call (`sample_batches`,
dispatch amortised), the test split, and a 125,000-object world. Prints a table and writes JSON
(atomically) to experiments/benchmarks/results/data_generation.json.
"""
import argparse
import json
import os
import platform
import statistics
import time

import jax
import jax.numpy as jnp

import bindjax
from bindjax.core import coverage_splits
from bindjax.core import scenes
from bindjax.core import world

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "data_generation.json")


def _time_run(fn, scenes_per_call, seconds, seed):
  """(scenes per wall second, scenes per CPU second of this process) of one run calling fn()
  until `seconds` have passed, blocking on each result."""
  calls, start, cpu_start = 0, time.perf_counter(), time.process_time()
  while True:
    jax.block_until_ready(fn(jax.random.key(seed * 1_000_003 + calls)))
    calls += 1
    elapsed = time.perf_counter() - start
    if elapsed >= seconds:
      cpu = max(time.process_time() - cpu_start, 1e-9)
      return calls * scenes_per_call / elapsed, calls * scenes_per_call / cpu


def prepare_row(name, space, sampler, split, coverage, batches_per_call):
  """(description dict, fn(key), scenes per call), compiled and warmed up."""
  tables = coverage_splits.coverage_split(space, coverage, 0)
  permutation = jnp.asarray(tables.permutation)
  num_train = jnp.int32(tables.num_train)
  if batches_per_call == 1:
    def fn(key):
      return scenes.sample_batch(key, permutation, num_train, space=space, sampler=sampler,
                                 split=split)
  else:
    def fn(key):
      return scenes.sample_batches(key, permutation, num_train, batches_per_call, space=space,
                                   sampler=sampler, split=split)
  start = time.perf_counter()
  jax.block_until_ready(fn(jax.random.key(0)))
  compile_s = time.perf_counter() - start
  for i in range(3):
    jax.block_until_ready(fn(jax.random.key(1 + i)))
  row = dict(
      name=name, split=split, coverage=coverage, batch_size=sampler.batch_size,
      batches_per_call=batches_per_call, num_concepts=space.num_concepts,
      values_per_concept=list(space.values_per_concept), max_objects=space.max_objects,
      num_objects=space.num_objects, num_concept_queries=sampler.num_concept_queries(space),
      num_object_queries=sampler.num_object_queries(space), compile_and_first_call_s=compile_s)
  return row, fn, sampler.batch_size * batches_per_call


def run_rows(prepared, repeats, seconds):
  """Times the rows interleaved (repeat r of every row, then r+1) so load drift on a shared
  machine hits all rows alike; returns the rows with median/min/max scenes/s."""
  rates = [[] for _ in prepared]
  for r in range(repeats):
    for i, (_, fn, scenes_per_call) in enumerate(prepared):
      rates[i].append(_time_run(fn, scenes_per_call, seconds, seed=r))
  rows = []
  for (row, _, _), row_rates in zip(prepared, rates):
    wall = [w for w, _ in row_rates]
    cpu = [c for _, c in row_rates]
    rows.append(dict(row, repeats=repeats, seconds_per_repeat=seconds,
                     scenes_per_s_median=statistics.median(wall),
                     scenes_per_s_min=min(wall), scenes_per_s_max=max(wall),
                     scenes_per_s_all=wall,
                     # Load-robust: scenes per CPU-second this process got (all its threads).
                     scenes_per_cpu_s_median=statistics.median(cpu)))
  return rows


def write_json(path, payload):
  """Writes JSON to a temporary name in the same directory, then renames it into place."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.{os.getpid()}.tmp"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=2)
    f.write("\n")
  os.replace(tmp, path)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_size", type=int, default=512)
  parser.add_argument("--num_concepts", type=int, default=2)
  parser.add_argument("--num_values", type=int, default=20)
  parser.add_argument("--max_objects", type=int, default=2)
  parser.add_argument("--coverage", type=float, default=0.8)
  parser.add_argument("--batches_per_call", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--seconds", type=float, default=0.5, help="minimum length of one run")
  parser.add_argument("--skip_extra_rows", action="store_true",
                      help="only the main configuration (1 and N batches per call)")
  parser.add_argument("--output", default=RESULTS)
  args = parser.parse_args(argv)

  space = world.ObjectSpace.uniform(args.num_concepts, args.num_values, args.max_objects)
  sampler = scenes.SamplerConfig(args.batch_size)
  load_before = os.getloadavg()[0]
  prepared = [
      prepare_row("main", space, sampler, "train", args.coverage, 1),
      prepare_row("main", space, sampler, "train", args.coverage, args.batches_per_call)]
  if not args.skip_extra_rows:
    prepared.append(prepare_row("test split", space, sampler, "test", args.coverage, 1))
    big = world.ObjectSpace.uniform(3, 50, args.max_objects)
    prepared.append(prepare_row("|O|=125,000", big, sampler, "train", args.coverage, 1))
  rows = run_rows(prepared, args.repeats, args.seconds)

  header = (f"{'row':<12} {'split':<5} {'|O|':>7} {'B':>4} {'batches':>7} {'Qo':>4} "
            f"{'scenes/s median':>15} {'min':>9} {'max':>9} {'per CPU-s':>9} {'compile s':>9}")
  print(header)
  print("-" * len(header))
  for row in rows:
    print(f"{row['name']:<12} {row['split']:<5} {row['num_objects']:>7} {row['batch_size']:>4} "
          f"{row['batches_per_call']:>7} {row['num_object_queries']:>4} "
          f"{row['scenes_per_s_median']:>15,.0f} {row['scenes_per_s_min']:>9,.0f} "
          f"{row['scenes_per_s_max']:>9,.0f} {row['scenes_per_cpu_s_median']:>9,.0f} "
          f"{row['compile_and_first_call_s']:>9.2f}")
  payload = dict(
      benchmark="data_generation", target_scenes_per_s=200_000,
      command="python experiments/benchmarks/data_generation.py " + " ".join(
          f"--{k}={v}" for k, v in vars(args).items() if k != "output"),
      environment=dict(
          bindjax=bindjax.__version__, jax=jax.__version__, backend=jax.default_backend(),
          devices=[str(d) for d in jax.devices()], cpu_count=os.cpu_count(),
          load_average_1min_before=load_before, load_average_1min_after=os.getloadavg()[0],
          python=platform.python_version(),
          time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
      rows=rows)
  write_json(args.output, payload)
  print(f"wrote {args.output}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
