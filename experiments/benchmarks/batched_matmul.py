"""XLA CPU: a replica-batched matmul (what vmap makes of a Linear layer) vs the same matmuls alone.

  python experiments/benchmarks/batched_matmul.py

Why the sweep's gain over one-after-another runs is bounded on CPU: vmapping R replicas
turns every Linear layer into one dot with a batch dimension, [R,N,D] x [R,D,F]. On this stack
(jax 0.10 CPU, ops on one thread as `bindjax sweep` runs them) that dot runs at a fraction of
the FLOP rate of the R separate [N,D] x [D,F] dots. Times the batched dot (forward and the
weight-gradient contraction over N) against R separate jitted dots on distinct arrays, for the
shapes of the `cpu` sweep preset's towers. Medians over --repeats. Writes a Markdown table and
JSON to experiments/benchmarks/results/.
"""
import argparse
import json
import os
import platform
import sys
import time

# One thread per op, as bindjax sweep runs on CPU
# (bindjax.runtime.parallel.use_cpu_cores_as_devices).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_cpu_multi_thread_eigen=false").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "experiments", "benchmarks", "results")
from bindjax.base import files  # noqa: E402

# (name, N rows, D in, F out): the cpu preset (batch 128 × 36 scene tokens, d_model 64, d_ff 256).
SHAPES = (("qkv", 4608, 64, 192), ("fc1", 4608, 64, 256), ("fc2", 4608, 256, 64))


def _median_ms(fn, repeats, calls):
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(calls):
      out = fn()
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / calls * 1e3)
  return float(np.median(times))


def measure(replicas, n, d, f, repeats, calls):
  keys = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(keys[0], (replicas, n, d))
  w = jax.random.normal(keys[1], (replicas, d, f))
  g = jax.random.normal(keys[2], (replicas, n, f))
  forward = jax.jit(lambda x, w: jnp.einsum("rnd,rdf->rnf", x, w))
  weight_grad = jax.jit(lambda x, g: jnp.einsum("rnd,rnf->rdf", x, g))
  one_forward = jax.jit(lambda x, w: x @ w)
  one_weight_grad = jax.jit(lambda x, g: x.T @ g)
  xs, ws, gs = ([a[i] + 0 for i in range(replicas)] for a in (x, w, g))
  flops = 2 * replicas * n * d * f
  row = {}
  for name, batched, single, args, single_args in (
      ("forward", forward, one_forward, (x, w), list(zip(xs, ws))),
      ("weight_grad", weight_grad, one_weight_grad, (x, g), list(zip(xs, gs)))):
    batched_ms = _median_ms(lambda: batched(*args), repeats, calls)
    separate_ms = _median_ms(lambda: [single(*a) for a in single_args], repeats, calls)
    row[name] = {"batched_ms": batched_ms, "separate_ms": separate_ms,
                 "batched_gflops": flops / batched_ms / 1e6,
                 "separate_gflops": flops / separate_ms / 1e6,
                 "batched_over_separate_time": batched_ms / separate_ms}
  return row


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--replicas", type=int, default=8, help="replicas per device")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--calls", type=int, default=10)
  args = parser.parse_args(argv)
  rows, table = [], ["| layer | N×D×F | pass | batched ms (GFLOP/s) | separate ms (GFLOP/s) | "
                     "batched / separate time |", "|---|---|---|---:|---:|---:|"]
  for name, n, d, f in SHAPES:
    row = {"layer": name, "shape": [n, d, f], "replicas": args.replicas,
           **measure(args.replicas, n, d, f, args.repeats, args.calls)}
    rows.append(row)
    for kind in ("forward", "weight_grad"):
      r = row[kind]
      table.append(f"| {name} | {n}×{d}×{f} | {kind} | {r['batched_ms']:.2f} "
                   f"({r['batched_gflops']:.0f}) | {r['separate_ms']:.2f} "
                   f"({r['separate_gflops']:.0f}) | {r['batched_over_separate_time']:.2f} |")
  command = " ".join([os.path.relpath(sys.argv[0], REPO)] + (argv or sys.argv[1:]))
  result = {"command": command, "rows": rows, "xla_flags": os.environ["XLA_FLAGS"],
            "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg(),
                        "platform": platform.platform(), "jax": jax.__version__}}
  files.write_atomic(os.path.join(RESULTS, "batched_matmul.json"), json.dumps(result, indent=2))
  text = "\n".join([f"# batched_matmul ({args.replicas} replicas, one thread per op)", "",
                    f"`{command}`", "", *table, "",
                    f"load average during the run: {result['machine']['load_average']}", ""])
  files.write_atomic(os.path.join(RESULTS, "batched_matmul.md"), text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
