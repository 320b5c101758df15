r"""Benchmark: the sweep-wide binding fits (`bindjax binding`) vs the same fits one replica at a
time.

  python experiments/benchmarks/binding_fits.py                      # cpu preset, 2,000 steps
  python experiments/benchmarks/binding_fits.py --steps=200 --replicas=1,8,20

Synthetic replicas shaped like the cpu sweep's |O| = 100 bucket: all 10,000 ordered pairs of
C = 2, V = 10 objects, D = 32; replica r's embeddings are a random per-object sum plus a
product term plus noise, its probes random, and its coverage split the sweep's own
(`coverage_splits.coverage_split`) at the cpu preset's coverages 0.3-0.9 and seeds 0, 1, .... The
fitting does not depend on where the embeddings came from, so this times exactly what the command
runs after encoding. Two ways, side by side, for every R:

  batched     `replicas.fit_replicas` on all R replicas: per family one compiled batch per
              group of training counts within a factor pad_ratio (each of `--pad_ratios`; inf:
              one batch per family), as `bindjax binding` runs it
  one by one  the same call with one replica at a time, as `bindjax complexity` on each
              replica's extracted set runs it (timed once for the largest R; the first R of
              those fits give every smaller R)

JAX's caches are cleared before every timed call, so each way pays its own compiles, as
separate runs would. Devices as `bindjax binding` makes them (`cpu_devices` of the config).
Reports wall seconds, process CPU seconds (all threads; meaningful on a shared machine) and
replicas per second of each, with compile and run time, and the run time per family. Writes
experiments/benchmarks/results/binding_fits.{json,md}.

  python experiments/benchmarks/binding_fits.py --project=OUT/results.json --out=PROJECTION

projects instead, from the results.json of a finished `bindjax binding` run, what its fits
would cost for --target replicas (default 500) on the same devices: the measured compile
seconds once, plus the measured fitting seconds per replica without compiles (a batch of R
replicas fitted in one program: larger batches fill an accelerator better, so this is an upper
bound there) times the target. The experiments/benchmarks/device_sweep.sh script runs it on the
accelerator's own sweep.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")
COVERAGES = (0.3, 0.5, 0.7, 0.8, 0.9)
VALUES = (10, 10)
DIM = 32


def synthetic_sets(num, seed=0):
  """`num` embedding sets of all pairs of the VALUES objects, each with its own coverage split."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bindjax.core import coverage_splits  # pylint: disable=g-import-not-at-top
  from bindjax.core import world  # pylint: disable=g-import-not-at-top
  from bindjax.frozen import extract  # pylint: disable=g-import-not-at-top
  space = world.ObjectSpace(VALUES, 2)
  ids_U = np.arange(space.num_objects, dtype=np.int32)
  objects, num_objects = extract.pair_scenes(space, ids_U)
  first, second = coverage_splits.ordered_pairs(space.num_objects)
  sets = []
  for r in range(num):
    rng = np.random.default_rng(seed + r)
    vectors = rng.normal(size=(space.num_objects, DIM))
    z = vectors[first] + vectors[second] + 0.5 * vectors[first] * vectors[second]
    z = (z + 0.1 * rng.normal(size=z.shape)).astype(np.float32)
    split = coverage_splits.coverage_split(space, COVERAGES[r % len(COVERAGES)],
                                           r // len(COVERAGES))
    probes = {f"concept_{c}": rng.normal(size=(v, DIM)) for c, v in enumerate(VALUES)}
    probes["object"] = vectors
    trained = extract.TrainedModel(params=None, model=_Similarity(), space=space, split=split,
                                   step=0, source={"source": "benchmark", "replica": r})
    sets.append(extract.embedding_set(trained, "all", ids_U, objects, num_objects, z, probes))
  return sets


class _Similarity:
  similarity = "dot"


def timed(fn):
  wall, cpu = time.perf_counter(), time.process_time()
  out = fn()
  return out, time.perf_counter() - wall, time.process_time() - cpu


def projection(summary, target):
  """The projected cost of `bindjax binding` on `target` replicas from one run's summary."""
  timings = summary["timings"]
  fitted = sum(t["replicas"] for t in timings)
  if not fitted:
    raise ValueError("no fitted replicas in the binding run: nothing to project from")
  compile_s = sum(t["compile_s"] for t in timings)
  run_s = sum(t["fit_s"] for t in timings) - compile_s
  encode_s = sum(t["load_s"] + t["encode_s"] for t in timings)
  per_replica = (run_s + encode_s) / fitted
  return {"replicas": fitted, "target": target, "families": summary["config"]["models"],
          "fit_steps": summary["fit_config"]["steps"],
          "num_scenes": sorted({t["num_scenes"] for t in timings}),
          "compile_s": compile_s, "run_s": run_s, "load_and_encode_s": encode_s,
          "seconds_per_replica": per_replica,
          "projected_s": compile_s + per_replica * target}


def project(args):
  """Prints and writes the projection of the binding run's results.json in args.project."""
  sys.path.insert(0, REPO)
  import jax  # pylint: disable=g-import-not-at-top
  from bindjax.base import files  # pylint: disable=g-import-not-at-top
  p = projection(files.read_json(args.project), args.target)
  p["devices"] = f"{jax.device_count()} × {jax.devices()[0].device_kind}"
  p["source"] = args.project
  text = "\n".join([
      f"# Binding fits: {p['target']} replicas projected from {p['replicas']} measured", "",
      f"{p['devices']}; families {p['families']}, {p['fit_steps']} fit steps, "
      f"{p['num_scenes']} scenes per replica", "",
      "| compile s | fit s without compiles | load + encode s | s per replica | "
      f"projected s for {p['target']} |", "|---:|---:|---:|---:|---:|",
      f"| {p['compile_s']:.1f} | {p['run_s']:.1f} | {p['load_and_encode_s']:.1f} | "
      f"{p['seconds_per_replica']:.2f} | {p['projected_s']:.0f} |", ""])
  print(text)
  files.write_atomic(args.out + ".md", text)
  files.write_json(args.out + ".json", p)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", default=os.path.join(REPO, "experiments", "binding.py") +
                      ":cpu")
  parser.add_argument("--steps", type=int, default=0, help="fit steps (0: the config's)")
  parser.add_argument("--replicas", default="1,8,20")
  parser.add_argument("--pad_ratios", default="1.25,inf", help="batched ways to time")
  parser.add_argument("--out", default=os.path.join(RESULTS, "binding_fits"))
  parser.add_argument("--project", default=None, metavar="RESULTS_JSON",
                      help="only project the cost of --target replicas from a finished "
                      "`bindjax binding` run's results.json")
  parser.add_argument("--target", type=int, default=500)
  args = parser.parse_args(argv)
  if args.project:
    project(args)
    return
  sys.path.insert(0, REPO)
  from bindjax.commands import flags  # pylint: disable=g-import-not-at-top
  from bindjax.runtime import parallel  # pylint: disable=g-import-not-at-top
  config = flags.load_config(args.config)
  if args.steps:
    config.fit.steps = args.steps
    config.fit.eval_every = min(int(config.fit.eval_every), args.steps)
  from bindjax.complexity import replicas  # pylint: disable=g-import-not-at-top
  settings = replicas.settings_from(config)
  parallel.use_cpu_cores_as_devices(settings.cpu_devices)   # as the command, before JAX
  import jax  # pylint: disable=g-import-not-at-top
  from bindjax.base import files  # pylint: disable=g-import-not-at-top
  from bindjax.complexity import families  # pylint: disable=g-import-not-at-top

  fit_config = settings.fit
  counts = sorted(int(r) for r in args.replicas.split(","))
  sets = synthetic_sets(counts[-1])
  models = families.parse_models(settings.models, VALUES, 2, DIM, settings.embed_dim)

  def fit(subset, pad_ratio):
    jax.clear_caches()
    _, infos = replicas.fit_replicas(subset, models, fit_config, settings.learning_rate,
                                     settings.fit_seed, None, settings.chunks, settings.memory,
                                     None, pad_ratio)
    by_family = {m.name: sum(i["run_s"] for i in infos if i["model"] == m.name) for m in models}
    return {"compile_s": sum(i["compile_s"] for i in infos),
            "run_s": sum(i["run_s"] for i in infos), "batches": len(infos),
            "run_s_by_family": by_family}

  load = os.getloadavg()
  singles = []
  for s in sets:
    info, wall, cpu = timed(lambda s=s: fit([s], 1.0))
    singles.append(dict(info, wall_s=wall, cpu_s=cpu))
    print(f"one replica (coverage {s.provenance['coverage']}): {wall:.1f} s wall, "
          f"{cpu:.1f} s CPU", flush=True)
  ratios = [float(p) for p in args.pad_ratios.split(",")]
  rows = []
  for r in counts:
    alone = {k: sum(x[k] for x in singles[:r]) for k in ("wall_s", "cpu_s", "compile_s",
                                                         "run_s", "batches")}
    alone["run_s_by_family"] = {m.name: sum(x["run_s_by_family"][m.name] for x in singles[:r])
                                for m in models}
    ways = {"one by one": alone}
    for ratio in ratios:
      info, wall, cpu = timed(lambda r=r, ratio=ratio: fit(sets[:r], ratio))
      ways[f"batched, pad_ratio {ratio:g}"] = dict(info, wall_s=wall, cpu_s=cpu)
    rows.append({"replicas": r, "ways": ways})
    print(", ".join(f"R={r} {way}: {t['wall_s']:.1f} s wall, {t['cpu_s']:.1f} s CPU"
                    for way, t in ways.items()), flush=True)
  lines = [f"# Binding fits: {', '.join(m.name for m in models)} × {fit_config.steps} steps, "
           f"{sets[0].num_scenes:,} scenes, D={DIM}", "",
           "| R | way | wall s | replicas/s (wall) | CPU s | replicas/s (CPU) | compile s | "
           "run s | batches |", "|---|---|---|---|---|---|---|---|---|"]
  for row in rows:
    for way, t in row["ways"].items():
      lines.append(f"| {row['replicas']} | {way} | {t['wall_s']:.1f} | "
                   f"{row['replicas'] / t['wall_s']:.3f} | {t['cpu_s']:.1f} | "
                   f"{row['replicas'] / t['cpu_s']:.3f} | {t['compile_s']:.1f} | "
                   f"{t['run_s']:.1f} | {t['batches']} |")
  largest = rows[-1]
  lines += ["", f"Run seconds (training and evaluation) per replica at R={largest['replicas']}, "
            "by family:", "", "| way | " + " | ".join(m.name for m in models) + " |",
            "|---|" + "---|" * len(models)]
  for way, t in largest["ways"].items():
    lines.append(f"| {way} | " + " | ".join(
        f"{t['run_s_by_family'][m.name] / largest['replicas']:.2f}" for m in models) + " |")
  command = " ".join(["python experiments/benchmarks/binding_fits.py"] + list(
      argv if argv is not None else sys.argv[1:]))
  lines += ["", f"Machine: {os.cpu_count()} CPUs, {jax.device_count()} JAX devices "
            f"({jax.devices()[0].platform}); load average before {load}, after "
            f"{os.getloadavg()} (shared machines: compare the ways, not the seconds).",
            f"Command: `{command}`"]
  table = "\n".join(lines) + "\n"
  print(table)
  files.write_atomic(args.out + ".md", table)
  files.write_json(args.out + ".json", {
      "config": config.to_dict(), "models": [m.name for m in models],
      "steps": fit_config.steps, "num_scenes": sets[0].num_scenes, "dim": DIM,
      "devices": jax.device_count(), "platform": jax.devices()[0].platform,
      "load_before": load, "load_after": os.getloadavg(), "singles": singles, "rows": rows})


if __name__ == "__main__":
  main()
