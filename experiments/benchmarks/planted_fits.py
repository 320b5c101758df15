r"""Benchmark: do the default fits find planted structure, and at what cost against additive?

  .venv/bin/python experiments/benchmarks/planted_fits.py            # small: minutes on 2 cores
  .venv/bin/python experiments/benchmarks/planted_fits.py --dims=16,64,512 --seeds=20 \
      --families=additive,product,sum_product,per_object_product,per_object_sum_product

Every family is fitted to scenes planted from its own coordinate form (every ordered pair of
objects of V × V values, embedding width D): per_object_sum_product to the per-object Hadamard
set f(o₁) + f(o₂), f(o) = a₀[v₀] + a₁[v₁] + 2·b₀[v₀] ⊙ b₁[v₁] with a, b ~ N(0, 1); the others to
their own form at E = D with the identity read-out, drawn from the family's initialisation.
Noise: `--noise` times the targets' RMS spread (0.05 on the Hadamard set is about 0.014).
Each (family, D, training fraction) is fitted on `--seeds` random object splits by the new
default (the coordinate solver) and by the previous default (Adam, 4,000 steps, 3 restarts,
weight decay), in one `fit_grid` call each (`--solvers` picks them). Per cell: seeds whose test-only
R² reaches 0.9, seeds the fit reports identified, median test-only and train-only R², and the
fit's wall time (compiling excluded) against the additive family's default fit on the same
set. Writes experiments/benchmarks/results/planted_fits{,_NAME}.{json,md}.
"""
import argparse
import dataclasses
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position

import repeats  # pylint: disable=g-import-not-at-top,wrong-import-position
from bindjax.complexity import data as data_lib  # pylint: disable=wrong-import-position
from bindjax.complexity import families  # pylint: disable=wrong-import-position
from bindjax.complexity import fit_settings  # pylint: disable=wrong-import-position
from bindjax.complexity import grid_fits  # pylint: disable=wrong-import-position
from bindjax.frozen.probes import linear  # pylint: disable=wrong-import-position

RESULTS = os.path.join(HERE, "results")
PASS_R2 = 0.9
# Planted draws: none of them is a key a fit starts from (split seeds give keys 0, 1, …).
DRAW = 9100
# The previous default fit: Adam with the families' restarts and weight decay.
OLD = fit_settings.FitConfig(solver="adam")
NEW = fit_settings.FitConfig()


def planted(family, values, out_dim, noise, draw):
  """(objects [N, 2, C], ids [N, 2], targets [N, D]) of every ordered pair of objects."""
  objects, ids = data_lib.all_scenes(values, 2)
  rng = np.random.default_rng(draw)
  if family == "per_object_sum_product":
    a, b = (rng.normal(size=(2, max(values), out_dim)) for _ in range(2))
    clean = (a[0][objects[..., 0]] + a[1][objects[..., 1]]
             + 2 * b[0][objects[..., 0]] * b[1][objects[..., 1]]).sum(1)
  else:
    model = families.make(family, values, 2, out_dim)
    params = model.init(jax.random.PRNGKey(draw))
    eye = jnp.eye(out_dim)
    params["out"] = {"kernel": jnp.concatenate([eye, eye]) if family == "sum_product" else eye,
                     "bias": jnp.zeros(out_dim)}
    clean = np.asarray(model.apply(params, objects), np.float64)
  spread = np.sqrt(((clean - clean.mean(0)) ** 2).mean())
  return objects, ids, clean + noise * spread * rng.normal(size=clean.shape)


def fit_cell(model, data, probes, fraction, seeds, config):
  """Rows and the summed solve/train and compile seconds of one fit_grid call."""
  entries = grid_fits.grid_entries([model], [fraction], seeds, [fit_settings.LEARNING_RATE])
  rows, infos = grid_fits.fit_grid(entries, data, probes, config)
  return rows, sum(i["run_s"] for i in infos), sum(i["compile_s"] for i in infos)


def summary(rows, run_s):
  test = np.array([r["final_test_only_r2"] for r in rows])
  train = np.array([r["final_train_only_r2"] for r in rows])
  identified = [r.get("identified") for r in rows]
  known = identified[0] is not None
  return {"seeds": len(rows), "passing": int((test >= PASS_R2).sum()),
          "identified": int(sum(identified)) if known else None,
          "identified_passing": int(sum(i and t >= PASS_R2 for i, t in zip(identified, test)))
                                if known else None,
          "median_test_r2": float(np.median(test)), "median_train_r2": float(np.median(train)),
          "min_train_r2": float(train.min()), "run_s": run_s,
          "test_r2": test.tolist(), "train_r2": train.tolist()}


def run(args):
  values = (args.values, args.values)
  seeds = list(range(args.seeds))
  configs = {"old": dataclasses.replace(OLD, steps=args.old_steps),
             "new": dataclasses.replace(NEW, solver_ridge=args.solver_ridge,
                                        solver_starts=args.solver_starts,
                                        solver_iterations=args.solver_iterations,
                                        solver_screen=args.solver_screen,
                                        solver_projection=args.solver_projection)}
  configs = {name: configs[name] for name in args.solvers}
  cells = []
  for out_dim in args.dims:
    for family in args.families:
      objects, ids, targets = planted(family, values, out_dim, args.noise, DRAW + out_dim)
      data, _ = data_lib.prepare(targets, objects, np.full(len(ids), 2), values, ids,
                                 args.values ** 2)
      probes = linear.init_weights(jax.random.PRNGKey(0), values, args.values ** 2, out_dim,
                                   linear.ProbeConfig())
      for fraction in args.fractions:
        cell = {"family": family, "dim": out_dim, "fraction": fraction}
        for name, config in configs.items():
          for fitted in dict.fromkeys([family, "additive"]):
            model = families.make(fitted, values, 2, out_dim)
            start = time.perf_counter()
            rows, run_s, compile_s = fit_cell(model, data, probes, fraction, seeds, config)
            key = name if fitted == family else f"{name}_additive"
            cell[key] = {**summary(rows, run_s), "compile_s": compile_s,
                         "wall_s": time.perf_counter() - start}
          cell[name]["times_additive"] = cell[name]["run_s"] / cell.get(
              f"{name}_additive", cell[name])["run_s"]
        cells.append(cell)
        print(line(cell), flush=True)
  return cells


def line(cell):
  parts = [f"| {cell['family']} | {cell['dim']} | {cell['fraction']} |"]
  for name in ("old", "new"):
    s = cell.get(name)
    if s is None:
      parts.append(" – | – | – | – | – |")
      continue
    identified = ("–" if s["identified"] is None
                  else f"{s['identified']} ({s.get('identified_passing', '?')})")
    parts.append(f" {s['passing']}/{s['seeds']} | {identified} | {s['median_test_r2']:.3f} | "
                 f"{s['median_train_r2']:.4f} | {s['run_s']:.1f} ({s['times_additive']:.2f}×) |")
  return "".join(parts)


def table(result):
  header = ("| family | D | f | old: R² ≥ 0.9 | old: identified | old: median test R² | "
            "old: median train R² | old: s (× additive) | new: R² ≥ 0.9 | new: identified (of "
            "them R² ≥ 0.9) | "
            "new: median test R² | new: median train R² | new: s (× additive) |")
  lines = ["# Planted recovery: previous default (Adam) vs the coordinate solver", "",
           f"`{result['command']}`", "", header, "|" + "---|" * 3 + "---:|" * 10]
  lines += [line(c) for c in result["cells"]]
  lines += ["", f"Scenes: every ordered pair of {result['values']}² objects; noise "
            f"{result['noise']} × RMS; test-only R² ≥ {PASS_R2} passes. Seconds: solve or "
            "training plus evaluation, compiling excluded, all seeds of the cell; × additive: "
            "against the additive family's fit by the same default on the same set. "
            f"Machine: {os.cpu_count()} CPUs, load averages {result['loadavg']}.", ""]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ints = lambda s: [int(x) for x in s.split(",")]
  parser.add_argument("--families", default="per_object_sum_product,sum_product",
                      type=lambda s: s.split(","))
  parser.add_argument("--dims", default=[64], type=ints)
  parser.add_argument("--fractions", default=[0.5, 0.7],
                      type=lambda s: [float(x) for x in s.split(",")])
  parser.add_argument("--values", default=10, type=int)
  parser.add_argument("--seeds", default=4, type=int)
  parser.add_argument("--noise", default=0.05, type=float)
  parser.add_argument("--solvers", default=["old", "new"], type=lambda s: s.split(","),
                      help="old: the previous default (Adam); new: the default")
  parser.add_argument("--old_steps", default=4000, type=int)
  parser.add_argument("--solver_ridge", default=NEW.solver_ridge, type=float,
                      help="the new default's coordinate-solver ridge (FitConfig.solver_ridge)")
  parser.add_argument("--solver_starts", default=NEW.solver_starts, type=int,
                      help="starts per coordinate; 0: the family's (fit_settings.SOLVER_STARTS)")
  parser.add_argument("--solver_iterations", default=NEW.solver_iterations, type=int,
                      help="FitConfig.solver_iterations (0: the family's value)")
  parser.add_argument("--solver_screen", default=NEW.solver_screen, type=int)
  parser.add_argument("--solver_projection", default=NEW.solver_projection, nargs="?",
                      const="true", choices=("auto", "true", "false"),
                      help="FitConfig.solver_projection (auto: the family's value; the flag "
                           "alone: true)")
  parser.add_argument("--name", default="", help="suffix of the result files")
  args = parser.parse_args()
  start_load = os.getloadavg()
  cells = run(args)
  result = {"command": " ".join(["python", "experiments/benchmarks/planted_fits.py"]
                                + sys.argv[1:]),
            "values": args.values, "noise": args.noise, "cells": cells,
            "loadavg": [round(x, 1) for x in start_load + os.getloadavg()]}
  out = os.path.join(RESULTS, "planted_fits" + (f"_{args.name}" if args.name else ""))
  repeats.write_table(out, result, table(result))


if __name__ == "__main__":
  main()
