"""How often does one complexity fit recover planted structure? Restarts per lever and family.

  python experiments/studies/complexity_stability.py \
      --levers=single,restarts32,restarts64,restarts32_holdout \
      --families=product,sum_product,per_object_product,per_object_sum_product
  python experiments/studies/complexity_stability.py --levers=restarts128 --draws=100 \
      --families=product,sum_product,per_object_sum_product        # and --draws=101
  python experiments/studies/complexity_stability.py --levers=restarts256 --draws=100 \
      --families=per_object_sum_product
  python experiments/studies/complexity_stability.py --levers=restarts32_long \
      --families=sum_product,per_object_sum_product
  python experiments/studies/complexity_stability.py --levers=single --families=additive
  python experiments/studies/complexity_stability.py --check=per_object_sum_product
  python experiments/studies/complexity_stability.py --check=wide_codes

Planted benchmark (docs/complexity.md, "Stability"): 2-object scenes over 10 × 10 concept values
(100 objects), 2,000 of the 10,000 ordered object pairs, embeddings planted from a family's own
form (random parameters of that family at E = 2, D = 16, key = the draw), fitted by the same
family on the train-only scenes of one object split (train fraction 0.5, seed 0; every value is
seen in training), 1,500 steps, lr 1e-2, cosine. Each of `--count` restarts is one fit with its
own initialisation key (0, 1, …; the planted keys are the draws, 100 and 101): one grid
entry as a user gets it. A restart succeeds when its test-only R² at the last evaluation is
≥ 0.9. LEVERS are FitConfig settings of that fit.

`--check=per_object_sum_product`: all 2-object scenes of 6 × 6 values planted as
Σ_objects (Σ_c a_c[v_c] + Π_c b_c[v_c]) M plus Gaussian noise of each `--noise` standard
deviation (a, b: E-wide tables, E = 2 and 16; M: E × 32), fitted by the per_object_sum_product
(8 restarts) and the additive families of width E at train fraction 0.8 (every value seen in
training); test-only R² and object accuracy by frozen probes fitted on all noisy scenes, beside
the probes' own object accuracy on those scenes.

`--check=wide_codes`: 2,000 of the 2-object scenes of 10 × 10 values planted the same way with
D = 64, noise 0.05 and code widths 4, 16 and 64, fitted by per_object_sum_product at its default
width (E = D) on 5 seeds' object splits (train fraction 0.5), 2,000 steps, with the original's fit
and the default fit.

Writes experiments/studies/results/complexity_stability/<levers or check>.json and prints a table.
Findings: docs/findings/complexity_stability.md.
"""
import argparse
import dataclasses
import json
import os
import time

import jax
import numpy as np

from bindjax.base import files
from bindjax.complexity import data as data_lib
from bindjax.complexity import families
from bindjax.complexity import fit_programs
from bindjax.complexity import fit_settings
from bindjax.complexity import fitting
from bindjax.frozen.probes import linear

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "complexity_stability")
VALUES = (10, 10)
FAMILIES = ("additive", "product", "sum_product", "per_object_product", "per_object_sum_product")
# The original code's fit (one unregularised start on raw targets) at the benchmark's length;
# its restart levers train 1,000-step candidates, as when they were measured.
BASE = fit_settings.FitConfig(steps=1500, eval_every=500, restart_steps=1000,
                              **fit_settings.ORIGINAL)
# The default fit (standardised targets, weight decay, 3 restarts) at the same length.
DEFAULT = fit_settings.FitConfig(steps=1500, eval_every=500)
LEVERS = {
    "single": BASE,
    "restarts16": dataclasses.replace(BASE, restarts=16),
    "restarts32": dataclasses.replace(BASE, restarts=32),
    "restarts32_holdout": dataclasses.replace(BASE, restarts=32, restart_holdout=0.2),
    "restarts64": dataclasses.replace(BASE, restarts=64),
    "restarts128": dataclasses.replace(BASE, restarts=128),
    "restarts256": dataclasses.replace(BASE, restarts=256),
    "restarts32_long": dataclasses.replace(BASE, restarts=32, restart_steps=2000),
    "default": DEFAULT,
    "default_single": dataclasses.replace(DEFAULT, restarts=1),
}
TEST = data_lib.MASKS.index("test_only")


def planted_scenes(num_scenes=2000, seed=0):
  """A random subset of all ordered 2-object scenes over VALUES: (objects, object ids)."""
  objects_NxKxC, ids_NxK = data_lib.all_scenes(VALUES, 2)
  rows = np.sort(np.random.default_rng(seed).permutation(len(ids_NxK))[:num_scenes])
  return objects_NxKxC[rows], ids_NxK[rows]


def complexity_data(values, objects_NxKxC, ids_NxK, targets_NxD):
  """ComplexityData of 2-object scenes."""
  data, _ = data_lib.prepare(targets_NxD, objects_NxKxC, np.full(len(ids_NxK), 2), values,
                             ids_NxK, int(np.prod(values)))
  return data


def restart_points(num_unique, count, fraction=0.5, lr=1e-2):
  """`count` fits on one object split (seed 0), initialisation keys 0..count-1."""
  points = data_lib.make_points(num_unique, [fraction] * count, [0] * count, [lr] * count)
  keys_Mx2 = np.stack([np.asarray(jax.random.PRNGKey(s)) for s in range(count)])
  return points.replace(key_Mx2=keys_Mx2.astype(np.uint32))


def run_levers(levers, draws, count, family_names, fit_embed_dim=2):
  """Rows (lever, draw, family, successes, test-only R² per restart, times); the fits have slot
  width fit_embed_dim (0: the embedding width D, the approximators' default)."""
  objects_NxKxC, ids_NxK = planted_scenes()
  probes = linear.init_weights(jax.random.PRNGKey(0), VALUES, 100, 16, linear.ProbeConfig())
  rows = []
  for lever in levers:
    for draw in draws:
      for family in family_names:
        model = families.make(family, VALUES, 2, out_dim=16, embed_dim=2)
        planted_NxD = np.asarray(model.apply(model.init(jax.random.PRNGKey(draw)),
                                             objects_NxKxC))
        data = complexity_data(VALUES, objects_NxKxC, ids_NxK, planted_NxD)
        start = time.perf_counter()
        fit_model = families.make(family, VALUES, 2, out_dim=16, embed_dim=fit_embed_dim)
        history, info = fitting.fit_models(fit_model, data, probes,
                                           restart_points(100, count), LEVERS[lever])
        r2_M = history["r2"][:, -1, TEST]
        rows.append({"lever": lever, "config": dataclasses.asdict(LEVERS[lever]), "draw": draw,
                     "family": family, "fit_embed_dim": fit_model.width,
                     "successes": int((r2_M >= 0.9).sum()), "restarts": count,
                     "test_r2": r2_M.tolist(),
                     "final_train_loss": history["train_loss"][:, -1].tolist(),
                     "wall_s": time.perf_counter() - start, "select_s": info["select_s"]})
        print(f"{lever:>20} draw {draw} {family:>24}: {rows[-1]['successes']:2d}/{count} "
              f"({rows[-1]['wall_s']:.0f}s)", flush=True)
  return rows


def planted_per_object(noise, seed=1, values=(6, 6), width=2, out_dim=32, num_scenes=0):
  """Scenes Σ_objects (Σ_c a_c[v_c] + Π_c b_c[v_c]) M + noise over `num_scenes` (0: all) of the
  ordered 2-object scenes of `values` (a, b: N(0,1) tables of `width`, shared by the objects;
  M: N(0,1)/√width, width × out_dim). Returns ComplexityData."""
  objects_NxKxC, ids_NxK = data_lib.all_scenes(values, 2)
  rng = np.random.default_rng(seed)
  if num_scenes:
    rows = np.sort(rng.permutation(len(ids_NxK))[:num_scenes])
    objects_NxKxC, ids_NxK = objects_NxKxC[rows], ids_NxK[rows]
  a, b = rng.normal(size=(2, len(values), max(values), width))
  mix_ExD = rng.normal(size=(width, out_dim)) / np.sqrt(width)
  per_object_NxKxE = sum(a[c][objects_NxKxC[..., c]] for c in range(len(values))) + np.prod(
      [b[c][objects_NxKxC[..., c]] for c in range(len(values))], axis=0)
  targets_NxD = (per_object_NxKxE.sum(1) @ mix_ExD
                 + noise * rng.normal(size=(len(ids_NxK), out_dim)))
  return complexity_data(values, objects_NxKxC, ids_NxK, targets_NxD.astype(np.float32))


def per_object_check(data, config, embed_dim, fraction, probe_steps=500):
  """{probe object acc on the planted scenes, then per family: test-only R², test-only and
  train-only object acc, train-only R²} for per_object_sum_product and additive fits of width
  embed_dim (seed 0, train fraction `fraction`)."""
  everything_3xN = np.ones((3, data.num_scenes), bool)
  probes, _ = linear.fit_probes(data.targets_NxD, data.labels, everything_3xN[0],
                                linear.ProbeConfig(steps=probe_steps))
  on_planted = fit_programs.evaluate_predictions(data.targets_NxD, data, probes, everything_3xN)
  report = {"probe_object_acc": float(on_planted["object_acc"][0])}
  points = data_lib.make_points(data.num_unique, [fraction], [0], [1e-2])
  train = data_lib.MASKS.index("train_only")
  for family in ("per_object_sum_product", "additive"):
    model = families.make(family, data.labels.values_per_concept, 2,
                          out_dim=data.targets_NxD.shape[1], embed_dim=embed_dim)
    history, _ = fitting.fit_models(model, data, probes, points, config)
    report[family] = {"test_r2": float(history["r2"][0, -1, TEST]),
                      "test_object_acc": float(history["object_acc"][0, -1, TEST]),
                      "train_object_acc": float(history["object_acc"][0, -1, train]),
                      "train_r2": float(history["r2"][0, -1, train])}
  return report


def wide_codes_check(width, config, seeds=5):
  """Test-only R² and object accuracy (frozen probes fitted on all scenes) of per_object_sum_product
  fits at E = D on `seeds` object splits of planted per-object scenes with codes `width` wide."""
  data = planted_per_object(0.05, seed=width, values=VALUES, width=width, out_dim=64,
                            num_scenes=2000)
  probes, _ = linear.fit_probes(data.targets_NxD, data.labels, np.ones(data.num_scenes, bool),
                                linear.ProbeConfig(steps=300))
  points = data_lib.make_points(data.num_unique, [0.5] * seeds, list(range(seeds)),
                                [1e-2] * seeds)
  model = families.make("per_object_sum_product", VALUES, 2, out_dim=64)
  start = time.perf_counter()
  history, _ = fitting.fit_models(model, data, probes, points, config)
  return {"test_r2": history["r2"][:, -1, TEST].tolist(),
          "test_object_acc": history["object_acc"][:, -1, TEST].tolist(),
          "wall_s": time.perf_counter() - start}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--levers", default="single,restarts32,restarts64,restarts32_holdout")
  # Planted keys outside the fits' initialisation keys 0..count-1: a fit whose key equals the
  # planted key starts at the planted parameters.
  parser.add_argument("--draws", default="100,101")
  parser.add_argument("--count", type=int, default=20)
  parser.add_argument("--families", default=",".join(FAMILIES))
  parser.add_argument("--fit_embed_dim", type=int, default=2,
                      help="slot width of the fits (the planted width is 2; 0: D = 16)")
  parser.add_argument("--check", default="",
                      help="per_object_sum_product: the noise table; wide_codes: D = 64 codes")
  parser.add_argument("--noise", default="0,0.1,0.3,1,3")
  args = parser.parse_args()
  os.makedirs(RESULTS, exist_ok=True)
  if args.check == "wide_codes":
    rows = []
    for width in (4, 16, 64):
      for lever in ("single", "default"):
        config = dataclasses.replace(LEVERS[lever], steps=2000, eval_every=1000)
        rows.append({"width": width, "lever": lever, **wide_codes_check(width, config)})
        print(json.dumps(rows[-1]), flush=True)
    path = os.path.join(RESULTS, "check_wide_codes.json")
  elif args.check:
    if args.check != "per_object_sum_product":
      raise SystemExit(f"--check={args.check!r}: expected per_object_sum_product or wide_codes")
    config = dataclasses.replace(
        fit_settings.FitConfig(steps=600, eval_every=300, **fit_settings.ORIGINAL),
        restarts=8, restart_steps=300)
    rows = []
    for width in (2, 16):
      for noise in [float(x) for x in args.noise.split(",")]:
        data = planted_per_object(noise, width=width)
        rows.append({"width": width, "noise": noise,
                     **per_object_check(data, config, width, fraction=0.8)})
        print(json.dumps(rows[-1]), flush=True)
    path = os.path.join(RESULTS, f"check_{args.check}.json")
  else:
    levers = args.levers.split(",")
    unknown = set(levers) - set(LEVERS)
    if unknown:
      raise SystemExit(f"--levers: unknown {sorted(unknown)}; expected some of {list(LEVERS)}")
    rows = run_levers(levers, [int(d) for d in args.draws.split(",")], args.count,
                      args.families.split(","), args.fit_embed_dim)
    print("| lever | " + " | ".join(args.families.split(",")) + " |")
    for lever in levers:
      cells = [", ".join(str(r["successes"]) for r in rows
                         if r["lever"] == lever and r["family"] == f)
               for f in args.families.split(",")]
      print(f"| {lever} | " + " | ".join(cells) + " |")
    draws = "" if args.draws == "100,101" else "_draws" + args.draws.replace(",", "_")
    width = "" if args.fit_embed_dim == 2 else f"_fitE{args.fit_embed_dim}"
    path = os.path.join(RESULTS, "levers_" + "_".join(levers) + draws + width + ".json")
  files.write_json(path, files.to_jsonable({"args": vars(args), "rows": rows}), indent=1)
  print("wrote", path)


if __name__ == "__main__":
  main()
