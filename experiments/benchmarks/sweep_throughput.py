"""Throughput of the vmapped sweep vs the same runs one after another (issue 6 benchmark).

  .venv/bin/python experiments/benchmarks/sweep_throughput.py            # CPU: 16 replicas
  .venv/bin/python experiments/benchmarks/sweep_throughput.py --mode=device --model=paper \
      --replicas=1,8,64 --peak_tflops=989        # accelerator: replica-steps/s and MFU

compare: R replicas of a small config trained by ONE compiled bucket step (bindjax.sweep) vs R
single-replica runs one after another with the same code (a 1-replica bucket, compiled once),
timing train steps only (compile excluded, reported apart). Medians over --repeats, with the
spread. device: for each R, replica-steps/s and model FLOP utilisation (FLOPs of the matmuls
from bindjax.models.tower_flops, x3 for forward + backward) against --peak_tflops.

Writes a Markdown table and JSON to experiments/benchmarks/results/.
"""
import argparse
import json
import os
import platform
import sys
import time

import jax
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "experiments"))

import coverage_sweep  # noqa: E402
from bindjax import files, models, parallel, sweep  # noqa: E402

RESULTS = os.path.join(REPO, "experiments", "benchmarks", "results")


def config_for(model, replicas):
  """A sweep config with exactly `replicas` replicas (coverages × seeds) of one bucket."""
  c = coverage_sweep.get_config("paper" if model == "paper" else "smoke")
  c.grid.spaces = ((2, 20),) if model == "paper" else ((2, 10),)
  coverages = (0.2, 0.4, 0.6, 0.8)
  c.grid.coverages = coverages[:min(replicas, 4)]
  c.grid.seeds = tuple(range(max(1, replicas // len(c.grid.coverages))))
  c.sweep.fast_compile = False
  if model == "small":
    c.model.update(d_model=32, num_heads=2, num_layers=1, d_ff=64, d_out=16)
    c.sampler.update(batch_size=32)
  elif model == "cpu":
    cpu = coverage_sweep.get_config("cpu")
    c.model = cpu.model
    c.sampler = cpu.sampler
  return c


def bucket_runner(config, devices=None, chunk=sweep.AUTO_CHUNK):
  """(compile seconds, run(steps) -> seconds, bucket) for the config's single bucket."""
  _, buckets = sweep.expand_grid(config)
  (bucket,) = buckets
  mesh = parallel.make_mesh(devices=devices)
  hyper_np, _ = parallel.pad_to_multiple(bucket.stacked_hyper(),
                                         parallel.num_replica_shards(mesh))
  hyper = parallel.shard_replicas(hyper_np, mesh)
  t0 = time.perf_counter()
  init_fn, step_fn, _, _ = sweep.compile_bucket(
      bucket.spec, mesh, hyper, chunk, log=lambda *_: None,
      fast_compile=bool(config.sweep.fast_compile))
  compile_seconds = time.perf_counter() - t0
  state = init_fn(hyper)
  state, metrics = step_fn(state, hyper)  # warm-up
  jax.block_until_ready(metrics)

  def run(steps):
    nonlocal state
    t = time.perf_counter()
    for _ in range(steps):
      state, metrics = step_fn(state, hyper)
    jax.block_until_ready(metrics)
    return time.perf_counter() - t

  return compile_seconds, run, bucket


def compare(args):
  replicas = args.replicas[0]
  config = config_for(args.model, replicas)
  compile_all, run_all, bucket = bucket_runner(config)
  singles = []
  for index in range(replicas):
    one = config_for(args.model, 1)
    one.grid.coverages = (bucket.replicas[index].coverage,)
    one.grid.seeds = (bucket.replicas[index].seed,)
    singles.append(bucket_runner(one))
  compile_one = singles[0][0]
  sweep_rates, sequential_rates = [], []
  for _ in range(args.repeats):
    sweep_rates.append(replicas * args.steps / run_all(args.steps))
    seconds = sum(run(args.steps) for _, run, _ in singles)
    sequential_rates.append(replicas * args.steps / seconds)
  sweep_rates, sequential_rates = np.array(sweep_rates), np.array(sequential_rates)
  speedups = sweep_rates / sequential_rates
  result = {
      "mode": "compare", "model": args.model, "replicas": replicas, "steps": args.steps,
      "repeats": args.repeats, "spec": _describe(bucket.spec),
      "sweep_replica_steps_per_s": _stats(sweep_rates),
      "sequential_replica_steps_per_s": _stats(sequential_rates),
      "speedup": _stats(speedups),
      "compile_s": {"sweep_bucket": round(compile_all, 2), "single_replica": round(compile_one, 2)},
      "note": "train steps only; sequential = one 1-replica bucket per run, compiled once "
              "(the other 15 hit the in-process program cache)",
  }
  table = ["| R | model | sweep replica-steps/s | sequential replica-steps/s | speedup |",
           "|---:|---|---:|---:|---:|",
           f"| {replicas} | {args.model} | {_fmt(result['sweep_replica_steps_per_s'])} | "
           f"{_fmt(result['sequential_replica_steps_per_s'])} | {_fmt(result['speedup'], 2)} |"]
  return result, table


def device(args):
  rows, table = [], ["| R | replica-steps/s | step time (s) | TFLOP/s | MFU | chunk | compile (s) |",
                     "|---:|---:|---:|---:|---:|---:|---:|"]
  for replicas in args.replicas:
    config = config_for(args.model, replicas)
    if args.dtype:
      config.model.compute_dtype = args.dtype
    compile_seconds, run, bucket = bucket_runner(config)
    times = [run(args.steps) / args.steps for _ in range(args.repeats)]
    step_time = float(np.median(times))
    flops = replicas * train_step_flops(bucket.spec)
    tflops = flops / step_time / 1e12
    row = {"replicas": replicas, "replica_steps_per_s": replicas / step_time,
           "step_seconds": _stats(np.array(times)), "tflops": tflops,
           "mfu": tflops / args.peak_tflops, "compile_s": round(compile_seconds, 2),
           "flops_per_replica_step": train_step_flops(bucket.spec)}
    rows.append(row)
    table.append(f"| {replicas} | {row['replica_steps_per_s']:.1f} | {step_time:.4f} | "
                 f"{tflops:.1f} | {row['mfu']:.1%} | - | {compile_seconds:.1f} |")
    print(table[-1], flush=True)
  return {"mode": "device", "model": args.model, "peak_tflops": args.peak_tflops,
          "dtype": args.dtype or "float32", "steps": args.steps, "repeats": args.repeats,
          "rows": rows}, table


def train_step_flops(spec):
  """Matmul FLOPs of one replica's train step: 3 × forward of both towers."""
  space, sampler, model = spec.space, spec.sampler, spec.model
  queries = sampler.num_concept_queries(space) + sampler.num_object_queries(space)
  forward = (models.tower_flops(model, sampler.batch_size, space.scene_length) +
             models.tower_flops(model, queries, space.query_length,
                                out_features=model.query_out_features))
  return 3 * forward


def _describe(spec):
  return {"space_size": spec.space.num_objects, "d_model": spec.model.d_model,
          "num_layers": spec.model.num_layers, "d_ff": spec.model.d_ff,
          "batch_size": spec.sampler.batch_size}


def _stats(x):
  return {"median": float(np.median(x)), "min": float(np.min(x)), "max": float(np.max(x)),
          "values": [float(v) for v in x]}


def _fmt(stats, digits=1):
  return (f"{stats['median']:.{digits}f} ({stats['min']:.{digits}f}–"
          f"{stats['max']:.{digits}f})")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--mode", choices=["compare", "device"], default="compare")
  parser.add_argument("--model", choices=["small", "cpu", "paper"], default="small")
  parser.add_argument("--replicas", default=None, help="comma list (compare uses the first)")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--peak_tflops", type=float, default=989.0,
                      help="device peak for MFU (H200/H100 dense bf16: 989)")
  parser.add_argument("--dtype", default=None, help="model.compute_dtype (e.g. bfloat16)")
  parser.add_argument("--out", default=None, help="output stem (default results/<name>)")
  args = parser.parse_args(argv)
  default_replicas = "16" if args.mode == "compare" else "1,8,64"
  args.replicas = [int(r) for r in (args.replicas or default_replicas).split(",")]
  result, table = compare(args) if args.mode == "compare" else device(args)
  result["machine"] = {"devices": [str(d) for d in jax.devices()], "cpus": os.cpu_count(),
                       "load_average": os.getloadavg(), "platform": platform.platform(),
                       "jax": jax.__version__}
  result["command"] = " ".join([os.path.relpath(sys.argv[0], REPO)] + (argv or sys.argv[1:]))
  name = "sweep_throughput" if args.mode == "compare" else f"device_sweep_{args.model}"
  stem = args.out or os.path.join(RESULTS, name)
  os.makedirs(os.path.dirname(stem), exist_ok=True)
  files.write_atomic(stem + ".json", json.dumps(result, indent=2))
  text = "\n".join([f"# {name}", "", f"`{result['command']}`", "", *table, "",
                    f"load average during the run: {result['machine']['load_average']}", ""])
  files.write_atomic(stem + ".md", text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
