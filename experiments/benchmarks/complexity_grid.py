r"""Benchmark: the paper's complexity grid as one batch vs one fit at a time vs one process per fit.

  .venv/bin/python experiments/benchmarks/complexity_grid.py            # full: 4,000 steps
  .venv/bin/python experiments/benchmarks/complexity_grid.py --steps=20 --process_samples=3

The grid: train fractions 0.1..0.9 × {MLP 1024, product, sum+product}, lr 1e-2 (27 fits) on a
CLEVR-sized synthetic embedding set (24 objects, all 576 ordered pairs, D=512). Three ways:
  batch       `grid_fits.fit_grid`: compiled programs per approximator shape and training count
  sequential  the same code one model at a time (`fit_models` with M=1; compiled once per shape)
  processes   a separate `bindjax complexity` process per fit (how the original code runs them);
              with --process_samples=S < 27 only S processes run (one per family first) and the
              total is estimated as mean time per family × 9 per family.
Each way runs in its own child process so its peak resident memory (ru_maxrss) is its own.
Writes experiments/benchmarks/results/complexity_grid.{json,md}.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
FRACTIONS = tuple(round(0.1 * i, 1) for i in range(1, 10))
MODELS = "mlp:1024,product,sum_product"
VALUES = (8, 3)


def synthetic_set(dim, seed=0):
  """CLEVR-sized set: per-object vectors, their sum per scene plus a product term and noise."""
  from bindjax.complexity import data as data_lib  # pylint: disable=g-import-not-at-top
  from bindjax.frozen import embeddings  # pylint: disable=g-import-not-at-top
  objects, ids = data_lib.all_scenes(VALUES, 2)
  rng = np.random.default_rng(seed)
  vectors = rng.normal(size=(24, dim))
  emb = vectors[ids].sum(1) + 0.5 * vectors[ids[:, 0]] * vectors[ids[:, 1]]
  emb = (emb + 0.1 * rng.normal(size=emb.shape)).astype(np.float32)
  probes = {"concept_0": rng.normal(size=(8, dim)), "concept_1": rng.normal(size=(3, dim)),
            "object": vectors}  # fixed probes: the benchmark times fitting, not probing
  return embeddings.EmbeddingSet(emb, objects, np.full(576, 2, np.int32), VALUES,
                                 provenance={"source": "benchmark"}, probes=probes)


PAPER = os.path.join(REPO, "experiments", "complexity.py") + ":paper"


def config_for(args, models, fractions, embeddings_dir):
  from bindjax.commands import flags  # pylint: disable=g-import-not-at-top
  config = flags.load_config(PAPER)
  config.embeddings = embeddings_dir
  config.models = models
  config.train_fractions = tuple(fractions)
  config.steps = args.steps
  config.eval_every = min(100, args.steps)
  config.schedule = "constant"
  return config


def child(args):
  """Runs one way in this process; prints a JSON line with seconds and peak memory."""
  from bindjax.complexity import data as data_lib  # pylint: disable=g-import-not-at-top
  from bindjax.complexity import families  # pylint: disable=g-import-not-at-top
  from bindjax.complexity import fit_settings  # pylint: disable=g-import-not-at-top
  from bindjax.complexity import fitting  # pylint: disable=g-import-not-at-top
  from bindjax.complexity import grid_fits  # pylint: disable=g-import-not-at-top
  from bindjax.frozen.probes import linear  # pylint: disable=g-import-not-at-top
  eset = synthetic_set(args.dim)
  data, _ = data_lib.from_set(eset)
  probes = linear.probes_to_weights(eset.probes, VALUES)
  fit_config = fit_settings.FitConfig(steps=args.steps, eval_every=min(100, args.steps),
                                      schedule="constant")
  models = families.parse_models(MODELS, VALUES, 2, args.dim)
  entries = grid_fits.grid_entries(models, FRACTIONS, [0], [1e-2])
  start = time.perf_counter()
  infos = []
  if args.child == "batch":
    rows, infos = grid_fits.fit_grid(entries, data, probes, fit_config)
  else:
    rows = []
    for entry in entries:
      points = data_lib.make_points(data.num_unique, [entry.train_fraction], [entry.seed],
                                      [entry.learning_rate])
      history, info = fitting.fit_models(entry.model, data, probes, points, fit_config)
      infos.append(info)
      rows += grid_fits.summarize(history, fit_config)
  seconds = time.perf_counter() - start
  print(json.dumps({
      "seconds": seconds, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      * 1024, "compile_s": sum(i["compile_s"] for i in infos),
      "run_s": sum(i["run_s"] for i in infos),
      "train_s": sum(i.get("train_s", 0.0) for i in infos),
      "eval_s": sum(i.get("eval_s", 0.0) for i in infos), "programs": len(infos),
      "compiled_temp_bytes": max((i["compiled_temp_bytes"] or 0) for i in infos),
      "fits": len(rows), "best_test_object_acc": [r["best_test_object_acc"] for r in rows]}))


def run_child(args, way):
  cmd = [sys.executable, os.path.abspath(__file__), f"--child={way}", f"--steps={args.steps}",
         f"--dim={args.dim}"]
  out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
  return json.loads(out.stdout.strip().splitlines()[-1])


def run_processes(args, workdir):
  """Separate CLI processes, one per fit; returns (total or estimate, samples, peak RSS)."""
  eset_dir = synthetic_set(args.dim).save(os.path.join(workdir, "set"))
  models = MODELS.split(",")
  order = [(m, f) for f in FRACTIONS for m in models]  # one of each family first
  samples = []
  for i, (model, fraction) in enumerate(order[:args.process_samples]):
    # The config file and overrides exactly as a researcher would type them.
    cmd = [sys.executable, "-m", "bindjax.commands.main", "complexity", f"--config={PAPER}",
           f"--config.embeddings={eset_dir}", f"--config.models={model}",
           f"--config.train_fractions=({fraction},)", f"--config.steps={args.steps}",
           f"--config.eval_every={min(100, args.steps)}",
           f"--workdir={os.path.join(workdir, f'run_{i}')}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
    samples.append({"model": model, "fraction": fraction,
                    "seconds": time.perf_counter() - start})
    del proc
  per_family = {m: np.mean([s["seconds"] for s in samples if s["model"] == m]) for m in models
                if any(s["model"] == m for s in samples)}
  measured_all = len(samples) == len(order)
  total = (sum(s["seconds"] for s in samples) if measured_all else
           sum(per_family.get(m, np.mean(list(per_family.values()))) * len(FRACTIONS)
               for m in models))
  peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
  return total, measured_all, samples, peak


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=4000)
  parser.add_argument("--dim", type=int, default=512)
  parser.add_argument("--process_samples", type=int, default=27,
                      help="separate processes actually run (27 = all; fewer: estimate)")
  parser.add_argument("--ways", default="processes,batch,sequential",
                      help="comma list of the ways to time (processes, batch, sequential)")
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args)
    return
  ways = [w.strip() for w in args.ways.split(",") if w.strip()]
  load_before = os.getloadavg()
  result = {"grid": {"fractions": FRACTIONS, "models": MODELS, "fits": 27, "steps": args.steps,
                     "scenes": 576, "dim": args.dim, "learning_rate": 1e-2}}
  if "processes" in ways:  # First: RUSAGE_CHILDREN then holds only their peak.
    with tempfile.TemporaryDirectory() as workdir:
      processes_s, measured_all, samples, processes_peak = run_processes(args, workdir)
    result["processes"] = {"seconds": processes_s, "measured_all": measured_all,
                           "samples": samples, "peak_rss_bytes_largest_child": processes_peak}
  for way in ("batch", "sequential"):
    if way in ways:
      result[way] = run_child(args, way)
  if "batch" in result:
    batch = result["batch"]
    # Compiling does not grow with the steps; training and evaluating do, linearly.
    batch["projected_4000_steps_s"] = (batch["seconds"] - batch["train_s"] - batch["eval_s"]
                                       + (batch["train_s"] + batch["eval_s"]) * 4000 / args.steps)
    for way in ("sequential", "processes"):
      if way in result:
        result[f"speedup_vs_{way}"] = result[way]["seconds"] / batch["seconds"]
  result["machine"] = {"cpus": os.cpu_count(), "loadavg_before": load_before,
                       "loadavg_after": os.getloadavg(), "devices": _devices()}
  result["command"] = " ".join(["python", "experiments/benchmarks/complexity_grid.py"] +
                               sys.argv[1:])
  os.makedirs(RESULTS, exist_ok=True)
  from bindjax.base import files  # pylint: disable=g-import-not-at-top
  files.write_json(os.path.join(RESULTS, "complexity_grid.json"), files.to_jsonable(result),
                   indent=1)
  files.write_atomic(os.path.join(RESULTS, "complexity_grid.md"), table(result))
  print(table(result))


def _devices():
  import jax  # pylint: disable=g-import-not-at-top
  return [str(d) for d in jax.devices()]


def table(r):
  gib = 1 << 30
  lines = [f"# Complexity grid: 27 fits × {r['grid']['steps']} steps, 576 scenes, "
           f"D={r['grid']['dim']}", "",
           "| way | seconds | speed-up of batch | peak RSS (GiB) | compile s | train s | "
           "evaluate s |", "|---|---|---|---|---|---|---|"]
  for way, label in (("batch", "one batch per shape and training count"),
                     ("sequential", "one fit after another, same code")):
    if way in r:
      w = r[way]
      speedup = "1.0×" if way == "batch" else (
          f"{r['speedup_vs_sequential']:.1f}×" if "speedup_vs_sequential" in r else "–")
      lines.append(f"| {label} | {w['seconds']:.1f} | {speedup} | "
                   f"{w['peak_rss_bytes'] / gib:.2f} | {w['compile_s']:.1f} | "
                   f"{w['train_s']:.1f} | {w['eval_s']:.1f} |")
  if "processes" in r:
    p = r["processes"]
    note = "" if p["measured_all"] else (
        f" (estimated from {len(p['samples'])} processes × 9 per family)")
    speedup = f"{r['speedup_vs_processes']:.1f}×" if "speedup_vs_processes" in r else "–"
    lines.append(f"| 27 separate CLI processes{note} | {p['seconds']:.1f} | {speedup} | "
                 f"{p['peak_rss_bytes_largest_child'] / gib:.2f} | – | – | – |")
  lines.append("")
  if "batch" in r and r["grid"]["steps"] != 4000:
    lines.append(f"Projected to 4,000 steps (compile as measured, training and evaluation × "
                 f"{4000 / r['grid']['steps']:g}): {r['batch']['projected_4000_steps_s']:.0f} s.")
  lines += [f"Machine: {r['machine']['cpus']} CPUs, load average before "
            f"{r['machine']['loadavg_before']} after {r['machine']['loadavg_after']} (shared "
            f"with other jobs: expect noise).", f"Command: `{r['command']}`", ""]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
