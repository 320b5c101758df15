"""Training-step throughput of bindjax.training.train.train_step (data generation included).

  python experiments/benchmarks/train_step.py                      # paper + small configs
  python experiments/benchmarks/train_step.py --configs=small --repeats=5 --steps=20
  python experiments/benchmarks/train_step.py --configs=cpu_plain,cpu_product --tag=product_readout
  python experiments/benchmarks/train_step.py --no_donate          # compare without donation
  XLA_FLAGS=... python experiments/benchmarks/train_step.py --tag=myflags

For each config: compile time; steps/s as the median (and min/max) over `--repeats` timed runs of
`--steps` steps each, after warm-up; model FLOPs per step, analytically (3 x the forward matmuls
of both towers, `models.tower_flops`) and from XLA's cost analysis of the compiled step; the
achieved FLOP/s; and the machine's measured float32 matmul FLOP/s for reference (median of
several runs of the model's largest matmul shape and of a square 2048 matmul, measured before
and after the steps; the faster of the two is the reference).

Writes experiments/benchmarks/results/train_step[_TAG].{json,md}. Shared machines are noisy: the
JSON records the load average at the start and end of the run.
"""
import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from bindjax.core import models
from bindjax.runtime import xla_options
from bindjax.training import run_spec
from bindjax.training import train

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _config(name):
  c = run_spec.default_config()       # the published run: C=2, V=20, K=2, d 256, 6 layers, B 512
  c.coverage = 0.8
  if name == "small":               # the CPU preset's model (experiments/train.py:cpu)
    c.space.update(num_concepts=2, num_values=4, max_objects=2)
    c.model.update(d_model=64, num_heads=4, num_layers=2, d_ff=256, d_out=32)
    c.sampler.update(batch_size=64)
  elif name in ("cpu_plain", "cpu_product"):  # the cpu sweep preset's model at |O| = 100
    c.space.update(num_concepts=2, num_values=10, max_objects=2)
    c.model.update(d_model=64, num_heads=4, num_layers=2, d_ff=256, d_out=32,
                   product_readout="both" if name == "cpu_product" else "none")
    c.sampler.update(batch_size=128, train_queries="train")
  elif name != "paper":
    raise ValueError(f"--configs: unknown config {name!r}; expected paper, small, cpu_plain or "
                     "cpu_product")
  return c


def _analytic_flops(spec):
  """Model FLOPs of one training step: 3 x (scene tower + query tower + logits) forward."""
  m = spec.model
  num_queries = (spec.sampler.num_concept_queries(spec.space) +
                 spec.sampler.num_object_queries(spec.space))
  b = spec.sampler.batch_size
  forward = (models.tower_flops(m, b, spec.space.scene_length, m.d_out, tower="scene") +
             models.tower_flops(m, num_queries, spec.space.query_length, m.query_out_features,
                                tower="query") +
             2 * b * num_queries * m.d_out)
  return 3 * forward


def _xla_flops(compiled):
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("flops", float("nan")))
  except Exception:  # cost analysis is optional on some backends
    return float("nan")


def _time_runs(fn, repeats, inner, cpu_times=None):
  """Seconds per call of fn() (which must block) over `repeats` runs of `inner` calls.

  `cpu_times`, if a list, receives the process CPU seconds (all threads) per call: less
  sensitive than wall time to other processes on a shared machine.
  """
  times = []
  for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(inner):
      fn()
    times.append((time.perf_counter() - t0) / inner)
    if cpu_times is not None:
      cpu_times.append((time.process_time() - c0) / inner)
  return times


def matmul_rate(m, k, n, repeats=5):
  """Measured float32 FLOP/s of an [m,k]x[k,n] matmul: (median, min, max)."""
  a = jax.random.normal(jax.random.key(0), (m, k), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (k, n), jnp.float32)
  f = jax.jit(jnp.dot)
  f(a, b).block_until_ready()
  inner = max(1, int(2e9 // (2 * m * k * n)))
  rates = [2 * m * k * n / t for t in _time_runs(lambda: f(a, b).block_until_ready(), repeats,
                                                   inner)]
  return statistics.median(rates), min(rates), max(rates)


def bench_config(name, steps, repeats, donate):
  config = _config(name)
  spec = run_spec.RunSpec.from_config(config)
  inputs, _ = run_spec.inputs_from_config(config, spec)
  inputs = jax.device_put(inputs)
  state = jax.jit(lambda h: train.init(h.key, spec, h))(inputs)
  step_fn = jax.jit(lambda s, h: train.train_step(s, h, spec),
                    donate_argnums=(0,) if donate else ())
  t0 = time.perf_counter()
  compiled = step_fn.lower(state, inputs).compile(
      xla_options.compiler_options(jax.devices()[0].platform))
  compile_s = time.perf_counter() - t0
  holder = {"state": state}

  def one():
    holder["state"], metrics = compiled(holder["state"], inputs)
    jax.block_until_ready(metrics["loss"])

  for _ in range(2):
    one()
  cpu_seconds = []
  seconds = _time_runs(one, repeats, steps, cpu_seconds)
  rates = [1 / s for s in seconds]
  analytic = _analytic_flops(spec)
  median = statistics.median(rates)
  b = spec.sampler.batch_size
  return {
      "config": name, "donate": donate, "batch_size": b,
      "space": list(spec.space.values_per_concept), "max_objects": spec.space.max_objects,
      "d_model": spec.model.d_model, "num_layers": spec.model.num_layers,
      "d_ff": spec.model.d_ff, "d_out": spec.model.d_out,
      "parameters": models.count_parameters(holder["state"].params),
      "compile_s": compile_s, "steps_per_s_median": median, "steps_per_s_min": min(rates),
      "steps_per_s_max": max(rates), "s_per_step_median": 1 / median,
      "cpu_s_per_step_median": statistics.median(cpu_seconds),
      "repeats": repeats, "steps_per_repeat": steps,
      "model_flops_per_step_analytic": analytic,
      "xla_flops_per_step": _xla_flops(compiled),
      "achieved_flops_per_s": analytic * median,
  }


def _write(path, text):
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, path)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", default="paper,small")
  parser.add_argument("--steps", type=int, default=3, help="timed steps per repeat")
  parser.add_argument("--small_steps", type=int, default=50, help="timed steps per repeat, small")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--no_donate", action="store_true")
  parser.add_argument("--tag", default="")
  parser.add_argument("--xla_defaults", action="store_true",
                      help="compile with XLA's own CPU defaults (YNNPACK fusions on) instead of "
                           "bindjax.runtime.xla_options.CPU_OPTIONS, for comparison")
  args = parser.parse_args(argv)
  if args.xla_defaults:
    xla_options.CPU_OPTIONS = {}

  load_start = os.getloadavg()

  def measure_matmuls():
    out = {}
    for shape in ((512 * 9, 256, 2048), (2048, 2048, 2048)):
      med, lo, hi = matmul_rate(*shape)
      out["x".join(map(str, shape))] = {"median": med, "min": lo, "max": hi}
    return out

  # Measured before and after the steps; the higher rate is the reference (load changes).
  matmuls = measure_matmuls()
  rows = []
  for name in args.configs.split(","):
    steps = args.steps if name == "paper" else args.small_steps
    rows.append(bench_config(name, steps, args.repeats, donate=not args.no_donate))
    print(json.dumps(rows[-1]), flush=True)
  for shape, after in measure_matmuls().items():
    if after["median"] > matmuls[shape]["median"]:
      matmuls[shape] = after
  reference = max(m["median"] for m in matmuls.values())
  for row in rows:
    row["fraction_of_matmul_rate"] = row["achieved_flops_per_s"] / reference
  result = {
      "device": str(jax.devices()[0]), "num_cpus": os.cpu_count(), "jax": jax.__version__,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "compiler_options": xla_options.compiler_options(jax.devices()[0].platform),
      "load_average_start": load_start,
      "load_average_end": os.getloadavg(), "matmul_flops_per_s": matmuls,
      "matmul_reference_flops_per_s": reference, "results": rows,
      "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
  }
  suffix = f"_{args.tag}" if args.tag else ""
  os.makedirs(RESULTS, exist_ok=True)
  _write(os.path.join(RESULTS, f"train_step{suffix}.json"), json.dumps(result, indent=2) + "\n")
  lines = [
      f"# train_step throughput ({result['device']}, {result['num_cpus']} CPUs, jax "
      f"{result['jax']}, donate={not args.no_donate}, XLA_FLAGS='{result['xla_flags']}', "
      f"compiler options {result['compiler_options']})", "",
      f"Load average start/end: {load_start[0]:.1f} / {result['load_average_end'][0]:.1f} "
      "(shared machine: numbers are noisy).",
      "Measured float32 matmul: " + ", ".join(
          f"{k}: {v['median'] / 1e9:.0f} GFLOP/s ({v['min'] / 1e9:.0f}-{v['max'] / 1e9:.0f})"
          for k, v in matmuls.items()), "",
      "| config | params | batch | compile s | steps/s median (min-max) | s/step | CPU s/step | "
      "model GFLOP/step (XLA) | achieved GFLOP/s | of matmul rate |",
      "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['config']} | {r['parameters']:,} | {r['batch_size']} | {r['compile_s']:.1f} | "
        f"{r['steps_per_s_median']:.3f} ({r['steps_per_s_min']:.3f}-{r['steps_per_s_max']:.3f}) "
        f"| {r['s_per_step_median']:.3f} | {r['cpu_s_per_step_median']:.3f} | "
        f"{r['model_flops_per_step_analytic'] / 1e9:.1f} "
        f"({r['xla_flops_per_step'] / 1e9:.1f}) | {r['achieved_flops_per_s'] / 1e9:.1f} | "
        f"{100 * r['fraction_of_matmul_rate']:.0f}% |")
  _write(os.path.join(RESULTS, f"train_step{suffix}.md"), "\n".join(lines) + "\n")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
