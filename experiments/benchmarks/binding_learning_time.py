"""Learning time of binding: steps until a model binds the scenes it trains on, by |O| and model.

  .venv/bin/python experiments/benchmarks/binding_learning_time.py             # CPU default
  python experiments/benchmarks/binding_learning_time.py --sizes=4,6,10,20 \
      --models=cpu,cpu_product,paper --steps=10000 --eval_every=250          # accelerator

Every replica trains at coverage 1 (every object is a training object), so nothing is held out
and the question is only whether, and after how many steps, the towers learn to bind: the
binding figure (docs/objectives.md#binding) on training scenes, i.e. the fraction of two-object
scenes with objects that differ in every concept in which the scene scores both of its objects
above both cross objects. For each (|O|, configuration: model, learning rate, weight decay) the
table gives the first evaluation step at which the figure reaches --target (mean over seeds),
its final value, and the set-separation accuracy on two-object scenes. One sweep
(bindjax.training.sweep) runs the whole grid; models and sizes are buckets, seeds are replicas.

Writes experiments/benchmarks/results/binding_learning_time.{md,json,png} (or --out).
"""
import argparse
import collections
import os
import platform
import time

from bindjax.base import files
from bindjax.commands import flags as bj_flags
from bindjax.runtime import parallel
from bindjax.workdir import layout
from bindjax.workdir import results

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "experiments", "benchmarks", "results")
# Model settings by name: the cpu preset's towers, with and without the product read-out, a
# deeper variant, the cpu towers at the original code's feed-forward width (d_ff 2048), and the
# published towers (d_model 256, 6 layers) in bfloat16. Every entry names product_readout: a
# grid model sets only the fields it lists, and the cpu preset the grid starts from has the
# read-out in both towers.
CPU_TOWERS = dict(d_model=64, num_heads=4, num_layers=2, d_ff=256, d_out=32)
PAPER_TOWERS = dict(d_model=256, num_heads=4, num_layers=6, d_ff=2048, d_out=64,
                    compute_dtype="bfloat16")
MODELS = {
    "cpu": dict(CPU_TOWERS, product_readout="none"),
    "cpu_product": dict(CPU_TOWERS, product_readout="both"),
    "cpu_product_query": dict(CPU_TOWERS, product_readout="query"),
    "deep": dict(CPU_TOWERS, num_layers=4, product_readout="none"),
    "cpu_ff2048": dict(CPU_TOWERS, d_ff=2048, product_readout="none"),
    # Plain-tower levers of the learning-time search (docs/findings/learning_time.md): the
    # training cap on the similarity's scale, a wider output, a wider residual stream, a
    # middle feed-forward width, a third layer.
    "cpu_cap100": dict(CPU_TOWERS, train_logit_cap=100.0, product_readout="none"),
    "cpu_dout64": dict(CPU_TOWERS, d_out=64, product_readout="none"),
    "cpu_d128": dict(CPU_TOWERS, d_model=128, product_readout="none"),
    "cpu_ff1024": dict(CPU_TOWERS, d_ff=1024, product_readout="none"),
    "cpu_l3": dict(CPU_TOWERS, num_layers=3, product_readout="none"),
    "paper": dict(PAPER_TOWERS, product_readout="none"),
    "paper_product": dict(PAPER_TOWERS, product_readout="both"),
}


def make_config(args):
  """The sweep config of the benchmark's grid."""
  config = bj_flags.load_config(os.path.join(REPO, "experiments", "coverage_sweep.py") + ":cpu")
  config.grid.spaces = tuple((args.concepts, v) for v in args.sizes)
  config.grid.coverages = (1.0,)
  config.grid.seeds = tuple(range(args.seeds))
  config.grid.learning_rates = tuple(args.learning_rates)
  config.grid.weight_decays = tuple(args.weight_decays)
  config.sampler.swaps_per_scene = args.swaps_per_scene
  config.grid.models = tuple(dict(name=name, **MODELS[name]) for name in args.models)
  config.num_steps = args.steps
  config.eval.every = args.eval_every
  config.checkpoint.every = args.steps
  config.log_every = args.eval_every
  config.sweep.fast_compile = args.fast_compile
  return config


def learning_times(rows, target, run=0):
  """Per (|O|, model, learning rate, weight decay): steps to reach `target` train/binding (seed
  mean), final values. `run` labels the entries with the index of their rows' file when several
  runs are tabulated."""
  binding, accuracy = results.binding(results.TRAIN), results.object_accuracy(results.TRAIN, 2)
  curves = collections.defaultdict(lambda: collections.defaultdict(list))
  for row in rows:
    if row.get(results.KIND) == "eval" and row.get(binding) is not None:
      key = (row[results.SPACE_SIZE], row[results.NUM_CONCEPTS], row[results.MODEL],
             row[results.LEARNING_RATE], row[results.WEIGHT_DECAY])
      curves[key][row[results.STEP]].append(row)
  table = []
  for (size, concepts, model, lr, wd), by_step in sorted(curves.items()):
    steps = sorted(by_step)
    mean = {s: sum(r[binding] for r in by_step[s]) / len(by_step[s]) for s in steps}
    acc2 = {s: sum(r[accuracy] for r in by_step[s]) / len(by_step[s]) for s in steps}
    reached = [s for s in steps if mean[s] >= target]
    table.append({"space_size": size, "concepts": concepts, "model": model, "run": run,
                  "learning_rate": lr, "weight_decay": wd,
                  "seeds": len(by_step[steps[-1]]),
                  "steps_to_target": reached[0] if reached else None,
                  "final_step": steps[-1], "final_binding": mean[steps[-1]],
                  "final_object_accuracy_2obj": acc2[steps[-1]],
                  "curve": [[s, mean[s]] for s in steps]})
  return table


def configuration(entry):
  """The name of an entry's training configuration: its model, its learning rate and weight
  decay where the entry records them, and its number of concepts C where that is not 2 (a law
  in |O| is fitted within one C)."""
  name = entry["model"]
  if entry.get("concepts", 2) != 2:
    name += f", C = {entry['concepts']}"
  if "learning_rate" not in entry:
    return name
  return f"{name} (lr {entry['learning_rate']:g}, wd {entry['weight_decay']:g})"


def fit_laws(table, extrapolate=(400, 2500)):
  """Per configuration with two or more sizes that reached the target: steps = a·|O|^b by
  least squares in log-log, its values at the `extrapolate` sizes, and at every size of that
  configuration that did not reach the target within its final step (where the law is tested,
  not fitted)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  laws = {}
  for name in sorted({configuration(r) for r in table}):
    entries = [r for r in table if configuration(r) == name]
    first = {}
    for r in entries:
      if r["steps_to_target"] is not None:
        first[r["space_size"]] = min(first.get(r["space_size"], np.inf), r["steps_to_target"])
    if len(first) < 2:
      continue
    sizes = sorted(first)
    b, log_a = np.polyfit(np.log(sizes), np.log([first[n] for n in sizes]), 1)
    predict = lambda n, a=float(np.exp(log_a)), b=float(b): a * n ** b
    laws[name] = {
        "a": float(np.exp(log_a)), "b": float(b), "sizes": sizes,
        "extrapolated": {str(n): predict(n) for n in extrapolate},
        "not_reached": [{"space_size": r["space_size"], "final_step": r["final_step"],
                         "predicted": predict(r["space_size"])}
                        for r in entries if r["steps_to_target"] is None]}
  return laws


def markdown(result):
  lines = [f"# Binding learning time (coverage 1, target train/binding >= {result['target']})",
           "", f"`{result['command']}`", "",
           (f"{result['devices']}; {result['replica_steps']:,} replica-steps in "
            f"{result['wall_seconds']:.0f} s; load before: {result['load_before']}"
            if result["wall_seconds"] else result["devices"]), "",
           "| \\|O\\| | configuration | seeds | steps to target | final step | final binding | "
           "final 2-obj accuracy |", "|---:|---|---:|---:|---:|---:|---:|"]
  for r in result["table"]:
    reached = r["steps_to_target"] if r["steps_to_target"] is not None else "not reached"
    lines.append(f"| {r['space_size']} | {configuration(r)} | {r['seeds']} | {reached} | "
                 f"{r['final_step']} | {r['final_binding']:.3f} | "
                 f"{r['final_object_accuracy_2obj']:.3f} |")
  for name, law in result.get("laws", {}).items():
    lines += ["", f"Law for {name} over |O| = {', '.join(map(str, law['sizes']))}: steps ≈ "
              f"{law['a']:.3g}·|O|^{law['b']:.2f}"
              + (" (exact through two sizes: no residual, no interval)"
                 if len(law["sizes"]) == 2 else "") + "; extrapolated: " + ", ".join(
                  f"{v:,.0f} at |O| = {n}" for n, v in law["extrapolated"].items())]
    for miss in law["not_reached"]:
      verdict = ("contradicts it" if miss["predicted"] <= miss["final_step"]
                 else "is consistent with it")
      lines.append(f"- |O| = {miss['space_size']}: the law predicts {miss['predicted']:,.0f} "
                   f"steps; not reached by step {miss['final_step']:,}, which {verdict}")
  return "\n".join(lines) + "\n"


def plot(table, target, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = sorted({configuration(r) for r in table})
  if not names:   # a run cut before its first evaluation: the table says so, nothing to draw
    return
  columns = min(len(names), 4)
  rows = -(-len(names) // columns)
  fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False,
                           sharey=True)
  for ax, name in zip(axes.flat, names):
    for r in (r for r in table if configuration(r) == name):
      steps, values = zip(*r["curve"])
      ax.plot(steps, values, marker=".",
              label=f"|O|={r['space_size']} ({r['final_step']:,} steps)")
    ax.axhline(target, color="grey", lw=0.8, ls="--")
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
  for ax in axes.flat[len(names):]:
    ax.set_visible(False)
  for ax in axes[:, 0]:
    ax.set_ylabel("binding on training scenes")
  fig.tight_layout()
  files.save_figure(fig, path, dpi=120)
  plt.close(fig)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="4,6,10,20",
                      help="comma list of V, so |O| = V^C")
  parser.add_argument("--concepts", type=int, default=2, help="C, concepts per object")
  parser.add_argument("--models", default="cpu,cpu_product", help=f"of {sorted(MODELS)}")
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--eval_every", type=int, default=250)
  parser.add_argument("--seeds", type=int, default=1)
  parser.add_argument("--learning_rates", default="1e-3", help="comma list (a grid axis)")
  parser.add_argument("--weight_decays", default="0.1",
                      help="comma list (a grid axis; 0.1 is the cpu preset's)")
  parser.add_argument("--swaps_per_scene", type=int, default=1,
                      help="swap negatives per scene: the only negatives that need binding")
  parser.add_argument("--target", type=float, default=0.9)
  parser.add_argument("--fast_compile", action="store_true",
                      help="as config.sweep.fast_compile: cheaper XLA:CPU compiles of slower "
                           "code, for runs that check the script, not the learning time")
  parser.add_argument("--workdir", default=os.path.join(REPO, "runs", "binding_learning_time"))
  parser.add_argument("--out", default=os.path.join(RESULTS, "binding_learning_time"))
  parser.add_argument("--tabulate", default=None, metavar="RESULTS_JSONL[,...]",
                      help="only tabulate the rows of earlier (possibly killed) runs' "
                      "results.jsonl (a comma list: one table and law over all of them), with "
                      "their devices and timing given as --note")
  parser.add_argument("--note", default="", help="with --tabulate: where and how it ran")
  args = parser.parse_args()
  args.sizes = [int(v) for v in args.sizes.split(",")]
  args.models = args.models.split(",")
  args.learning_rates = [float(v) for v in args.learning_rates.split(",")]
  args.weight_decays = [float(v) for v in args.weight_decays.split(",")]
  unknown = [m for m in args.models if m not in MODELS]
  if unknown:
    parser.error(f"--models: unknown {unknown}; expected names from {sorted(MODELS)}")
  if args.tabulate:
    paths = args.tabulate.split(",")
    table = [entry for run, path in enumerate(paths)
             for entry in learning_times(files.read_jsonl(path), args.target, run)]
    table.sort(key=lambda r: (configuration(r), r["space_size"], r["final_step"]))
    runs = ", ".join(os.path.basename(os.path.dirname(p)) for p in paths)
    write(args, {"command": f"rows of {runs}", "devices": args.note, "load_before": None,
                 "wall_seconds": None, "replica_steps": None, "target": args.target,
                 "table": table, "laws": fit_laws(table)})
    return
  config = make_config(args)
  parallel.use_cpu_cores_as_devices(int(config.sweep.cpu_devices))
  import jax
  from bindjax.training import sweep

  load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
  t0 = time.perf_counter()
  done = sweep.run_sweep(config, args.workdir, overwrite=True, progress=True)
  wall = time.perf_counter() - t0
  table = learning_times(files.read_jsonl(os.path.join(args.workdir, layout.RESULTS_FILE)),
                         args.target)
  devices = jax.devices()
  result = {
      "command": "python experiments/benchmarks/binding_learning_time.py " + " ".join(
          f"--{k}" if v is True else
          f"--{k}={','.join(map(str, v)) if isinstance(v, list) else v}"
          for k, v in vars(args).items()
          if k not in ("workdir", "out") and v is not None and v is not False),
      "devices": f"{len(devices)} × {devices[0].device_kind} ({platform.node()})",
      "load_before": [round(x, 2) for x in load_before] if load_before else None,
      "wall_seconds": wall, "compile_seconds": done["compile_seconds"],
      "replica_steps": done["replica_steps"], "target": args.target, "table": table,
      "laws": fit_laws(table)}
  write(args, result)


def write(args, result):
  """Prints the table and writes it as Markdown, JSON and a figure under args.out."""
  text = markdown(result)
  print(text)
  files.write_json(args.out + ".json", files.to_jsonable(result))
  files.write_atomic(args.out + ".md", text)
  plot(result["table"], args.target, args.out + ".png")


if __name__ == "__main__":
  main()
