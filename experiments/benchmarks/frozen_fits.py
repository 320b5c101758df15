r"""Benchmark: one linear-probe fit and one approximator fit against the machine's matmul rate.

  .venv/bin/python experiments/benchmarks/frozen_fits.py                 # this tree only
  .venv/bin/python experiments/benchmarks/frozen_fits.py --baseline=764b466  # and a commit

The probe fit: all heads on a 9,216-scene, D=384 synthetic set (96 objects of 12 × 8 values,
every ordered pair), 40 % training scenes. The approximator fits: sum+product and MLP[1024] at
train fraction 0.5 on a 576-scene, D=512 synthetic set (24 objects), evaluated every 100 steps. Both
are timed after compiling (their second call, or the fit's own compile/run split).

"FLOP time" is the FLOPs XLA's cost analysis counts for one training step on exactly the
training scenes (plus, for the approximator, its evaluations on all scenes) divided by the
float32 matmul rate measured in this run (a 2048² × 2048² product, best of several). With
--baseline the same measurements run on that commit's code (extracted with `git archive` into a
temporary folder, each in a child process), so "before" and "after" share the machine and its
load. Writes experiments/benchmarks/results/frozen_fits.{json,md}.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
PROBE_VALUES, PROBE_DIM, PROBE_TRAIN = (12, 8), 384, 0.4
FIT_VALUES, FIT_DIM, FIT_FRACTION = (8, 3), 512, 0.5
# (label, family, hidden widths): the paper grid's sum+product and MLP.
FIT_MODELS = (("sum_product", "sum_product", ()), ("mlp[1024]", "mlp", (1024,)))


def matmul_gflops(size=2048, repeats=5):
  """Best float32 matmul rate (GFLOP/s) of a jitted size² × size² product."""
  import jax  # pylint: disable=g-import-not-at-top
  a = jax.random.normal(jax.random.key(0), (size, size))
  b = jax.random.normal(jax.random.key(1), (size, size))
  f = jax.jit(lambda a, b: a @ b)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - start)
  return 2 * size ** 3 / best / 1e9


def _flops(fn, *args):
  import jax  # pylint: disable=g-import-not-at-top
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"])


def probe_set():
  """(embeddings [N, D], objects [N, 2, 2], object ids [N, 2]) of the probe benchmark."""
  u = int(np.prod(PROBE_VALUES))
  ids = np.stack(np.meshgrid(np.arange(u), np.arange(u), indexing="ij"), -1).reshape(-1, 2)
  objects = np.stack([ids % PROBE_VALUES[0], ids // PROBE_VALUES[0]], -1)
  rng = np.random.default_rng(0)
  vectors = rng.normal(size=(u, PROBE_DIM)).astype(np.float32)
  emb = vectors[ids].sum(1) + 0.1 * rng.normal(size=(len(ids), PROBE_DIM)).astype(np.float32)
  return emb, objects, ids


def time_probe(steps):
  """Seconds per step of a probe fit (compiled), and the FLOPs of one step on its train rows."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bindjax.frozen.probes import linear  # pylint: disable=g-import-not-at-top
  emb, objects, ids = probe_set()
  u = int(np.prod(PROBE_VALUES))
  labels = linear.probe_labels(objects, np.full(len(ids), 2), PROBE_VALUES, ids, u)
  train_rows, _ = linear.scene_split(len(ids), 0, PROBE_TRAIN)
  mask = linear.rows_to_mask(train_rows, len(ids))
  config = linear.ProbeConfig(steps=steps)
  linear.fit_probes(emb, labels, mask, config)  # compiles
  start = time.perf_counter()
  _, losses = linear.fit_probes(emb, labels, mask, config)
  jax.block_until_ready(losses)
  seconds = time.perf_counter() - start
  weights = linear.init_weights(jax.random.PRNGKey(0), PROBE_VALUES, u, PROBE_DIM, config)
  z_TxD, train_labels = jnp.asarray(emb[train_rows]), labels.take(train_rows)
  ones_T = jnp.ones(len(train_rows), bool)
  step_flops = _flops(lambda w: jax.value_and_grad(linear.probe_loss)(w, z_TxD, train_labels,
                                                                      ones_T), weights)
  return {"steps": steps, "seconds": seconds, "step_flops": step_flops,
          "train_scenes": len(train_rows), "scenes": len(ids)}


def _fit_api():
  """(data, families, fitting) modules, FitConfig and evaluate_predictions, from the package
  layout or the layouts of older commits (the baseline run)."""
  try:
    from bindjax.complexity import data, families, fitting  # pylint: disable=g-import-not-at-top
    from bindjax.complexity import fit_programs  # pylint: disable=g-import-not-at-top
  except ImportError:
    from bindjax import complexity  # pylint: disable=g-import-not-at-top
    from bindjax.frozen.probes import binding  # pylint: disable=g-import-not-at-top
    return complexity, binding, complexity, complexity.FitConfig, complexity.evaluate_predictions
  try:
    from bindjax.complexity import fit_settings  # pylint: disable=g-import-not-at-top
  except ImportError:
    fit_settings = fitting   # the settings lived in fitting before
  return data, families, fitting, fit_settings.FitConfig, fit_programs.evaluate_predictions


def time_approximator(steps, family, widths):
  """Seconds of one approximator fit after compiling, and the FLOPs it needs."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from bindjax.frozen.probes import linear  # pylint: disable=g-import-not-at-top
  data_lib, families, fitting, fit_config, evaluate_predictions = _fit_api()
  objects, ids = data_lib.all_scenes(FIT_VALUES, 2)
  u = int(np.prod(FIT_VALUES))
  rng = np.random.default_rng(0)
  vectors = rng.normal(size=(u, FIT_DIM))
  emb = (vectors[ids].sum(1) + 0.5 * vectors[ids[:, 0]] * vectors[ids[:, 1]]
         + 0.1 * rng.normal(size=(len(ids), FIT_DIM))).astype(np.float32)
  data, _ = data_lib.prepare(emb, objects, np.full(len(ids), 2), FIT_VALUES, ids, u)
  probes = linear.init_weights(jax.random.PRNGKey(0), FIT_VALUES, u, FIT_DIM,
                               linear.ProbeConfig())
  model = families.make(family, FIT_VALUES, 2, FIT_DIM, widths)
  config = fit_config(steps=steps, eval_every=100, schedule="constant")
  points = data_lib.make_points(u, [FIT_FRACTION], [0], [1e-2])
  _, info = fitting.fit_models(model, data, probes, points, config)
  masks = np.asarray(data_lib.scene_masks(data.object_ids_NxK, points.permutation_MxU[0],
                                          points.num_train_M[0]))
  train_rows = np.flatnonzero(masks[0])
  values_T, targets_T = data.values_NxKxC[train_rows], data.targets_NxD[train_rows]
  params = model.init(jax.random.PRNGKey(0))
  step_flops = _flops(lambda p: jax.value_and_grad(
      lambda p: ((model.apply(p, values_T) - targets_T) ** 2).mean())(p), params)
  eval_flops = _flops(lambda p: evaluate_predictions(
      model.apply(p, data.values_NxKxC), data, probes, jnp.asarray(masks)), params)
  return {"steps": steps, "seconds": info["run_s"], "compile_s": info["compile_s"],
          "train_s": info.get("train_s"), "eval_s": info.get("eval_s"),
          "step_flops": step_flops, "eval_flops": eval_flops,
          "num_evals": steps // config.eval_every, "train_scenes": len(train_rows),
          "scenes": len(ids)}


def child(args):
  print(json.dumps({"probe": time_probe(args.probe_steps), **{
      label: time_approximator(args.fit_steps, family, widths)
      for label, family, widths in FIT_MODELS}}))


def run_child(args, code_root):
  env = dict(os.environ, PYTHONPATH=code_root)
  cmd = [sys.executable, os.path.abspath(__file__), "--child", f"--probe_steps={args.probe_steps}",
         f"--fit_steps={args.fit_steps}"]
  load = os.getloadavg()
  out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=code_root, env=env)
  result = json.loads(out.stdout.strip().splitlines()[-1])
  result["loadavg_before"] = load
  return result


def analyse(run, gflops):
  """Adds FLOP-time figures to a child's result (in place) and returns it."""
  for key, r in run.items():
    if not isinstance(r, dict):
      continue
    flops = r["steps"] * r["step_flops"] + r.get("num_evals", 0) * r.get("eval_flops", 0.0)
    r["flop_s"] = flops / (gflops * 1e9)
    r["ms_per_step"] = 1e3 * r["seconds"] / r["steps"]
    r["times_flop_time"] = r["seconds"] / r["flop_s"]
  return run


def table(result):
  lines = [f"# Frozen-path fits vs the float32 matmul rate "
           f"({result['matmul_gflops']:.0f} GFLOP/s measured)", "",
           f"`{result['command']}`", "",
           "| fit | code | ms / step | seconds | FLOP time s | × FLOP time | speed-up |",
           "|---|---|---:|---:|---:|---:|---:|"]
  labels = [("probe", "linear probes, 9,216 scenes, D=384")] + [
      (label, f"{label} f={FIT_FRACTION}, 576 scenes, D=512") for label, _, _ in FIT_MODELS]
  for key, label in labels:
    before = result.get("before", {}).get(key)
    for name, r in (("before", before), ("after", result["after"][key])):
      if r is None:
        continue
      speedup = f"{before['seconds'] / r['seconds']:.1f}×" if before else "–"
      lines.append(f"| {label} | {name} | {r['ms_per_step']:.2f} | {r['seconds']:.2f} | "
                   f"{r['flop_s']:.2f} | {r['times_flop_time']:.1f} | {speedup} |")
  lines += ["", "Approximator seconds include their evaluations (every 100 steps, all scenes). "
            f"Machine: {result['machine']['cpus']} CPUs; load averages before each part: "
            f"{result['loadavg']}.", ""]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--probe_steps", type=int, default=1000)
  parser.add_argument("--fit_steps", type=int, default=1000)
  parser.add_argument("--baseline", default=None, help="git commit to measure as 'before'")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args)
    return
  sys.path.insert(0, REPO)
  loads = {"start": os.getloadavg()}
  gflops = matmul_gflops()
  result = {"matmul_gflops": gflops, "after": analyse(run_child(args, REPO), gflops)}
  loads["after_run"] = result["after"]["loadavg_before"]
  if args.baseline:
    with tempfile.TemporaryDirectory() as root:
      archive = subprocess.run(["git", "archive", args.baseline], check=True, cwd=REPO,
                               capture_output=True).stdout
      subprocess.run(["tar", "-x", "-C", root], input=archive, check=True)
      result["before"] = analyse(run_child(args, root), gflops)
      result["baseline"] = args.baseline
    loads["before_run"] = result["before"]["loadavg_before"]
  loads["end"] = os.getloadavg()
  result["loadavg"] = loads
  result["machine"] = {"cpus": os.cpu_count()}
  result["command"] = " ".join(["python", "experiments/benchmarks/frozen_fits.py"] + sys.argv[1:])
  from bindjax.base import files  # pylint: disable=g-import-not-at-top
  files.write_json(os.path.join(RESULTS, "frozen_fits.json"), files.to_jsonable(result), indent=1)
  files.write_atomic(os.path.join(RESULTS, "frozen_fits.md"), table(result))
  print(table(result))


if __name__ == "__main__":
  main()
