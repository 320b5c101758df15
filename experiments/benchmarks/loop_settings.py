"""Loop settings and compiles: the same bucket run with other step counts and cadences, in this
tree and in a baseline tree whose programs held the schedule's length, side by side.

  git worktree add /tmp/bindjax_baseline 5b2fab6   # the last commit with the length in the program
  .venv/bin/python experiments/benchmarks/loop_settings.py --baseline=/tmp/bindjax_baseline

Each side runs the `cpu` preset's model and batch on 4 replicas (coverage 0.5 and 0.9, seeds 0
and 1, |O| = 100) with `bindjax.training.sweep.run_sweep` in worker processes that import bindjax
from their own tree, over one CPU device per core as `bindjax sweep` sets up, with JAX's persistent
compilation cache on in a fresh folder per side (as the commands turn it on):

  worker 1   run A: 200 steps, evaluations every 100, rows every 20
  worker 2   run B: 300 steps, evaluations every 150, rows every 50, warm-up 0.2 (a new process:
             its programs can come only from the persistent cache), then run C: 200 steps,
             evaluations every 50, rows every 10 (the same process: from its in-memory cache)

and records each run's compile seconds (`sweep_done.json`'s compile_seconds: compiling or
loading the bucket's programs). Run A compiles on both sides; B and C differ only in loop
settings, which this tree keeps out of the programs.

Writes experiments/benchmarks/results/loop_settings.{json,md} (--out to change the stem).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "experiments", "benchmarks", "results")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repeats  # noqa: E402  pylint: disable=g-import-not-at-top
RUNS = {"A": dict(num_steps=200, every=100, log_every=20, warmup=0.1),
        "B": dict(num_steps=300, every=150, log_every=50, warmup=0.2),
        "C": dict(num_steps=200, every=50, log_every=10, warmup=0.1)}
WORKERS = (("A",), ("B", "C"))

WORKER = r"""
import json, os, sys
from bindjax.commands import flags
from bindjax.runtime import compilation_cache, parallel
runs, out = json.loads(sys.argv[1]), sys.argv[2]
config = flags.load_config(os.path.join("experiments", "coverage_sweep.py") + ":cpu")
parallel.use_cpu_cores_as_devices(int(config.sweep.cpu_devices))
compilation_cache.enable()
from bindjax.training import sweep
result = {}
for name, run in runs:
  c = flags.load_config(os.path.join("experiments", "coverage_sweep.py") + ":cpu")
  c.grid.coverages, c.grid.seeds = (0.5, 0.9), (0, 1)
  c.num_steps, c.eval.every, c.log_every = run["num_steps"], run["every"], run["log_every"]
  c.checkpoint.every, c.optimizer.warmup_fraction = run["num_steps"], run["warmup"]
  done = sweep.run_sweep(c, os.path.join(out, name), progress=False, log=lambda *_: None)
  result[name] = done["compile_seconds"]
print(json.dumps(result))
"""


def run_side(tree, work):
  """Compile seconds of runs A, B and C with bindjax imported from `tree`."""
  env = dict(os.environ, PYTHONPATH=tree, XDG_CACHE_HOME=os.path.join(work, "cache"))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env.pop("BINDJAX_COMPILATION_CACHE", None)
  seconds = {}
  for names in WORKERS:
    runs = json.dumps([(name, RUNS[name]) for name in names])
    out = subprocess.run([sys.executable, "-c", WORKER, runs, work], cwd=tree, env=env,
                         check=True, capture_output=True, text=True).stdout
    seconds.update(json.loads(out.strip().splitlines()[-1]))
  return seconds


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--baseline", required=True, help="a checkout of the baseline commit")
  parser.add_argument("--out", default=os.path.join(RESULTS, "loop_settings"))
  args = parser.parse_args()
  load = os.getloadavg()
  sides = {}
  for side, tree in (("baseline", os.path.abspath(args.baseline)), ("this tree", REPO)):
    with tempfile.TemporaryDirectory() as work:
      sides[side] = run_side(tree, work)
    print(side, sides[side], flush=True)
  result = {"command": "python experiments/benchmarks/loop_settings.py --baseline=BASELINE",
            "machine": f"{os.cpu_count()} CPU cores ({platform.node()})",
            "load_before": [round(x, 2) for x in load],
            "load_after": [round(x, 2) for x in os.getloadavg()], "runs": RUNS,
            "compile_seconds": sides}
  lines = ["# Compile seconds of one bucket under three loop settings", "",
           f"{result['machine']}; load average {result['load_before']} before, "
           f"{result['load_after']} after.", "",
           "| run | steps | eval every | rows every | warm-up | process | "
           + " | ".join(sides) + " |", "|---|---|---|---|---|---|" + "---|" * len(sides)]
  process = {"A": "1st (fresh cache)", "B": "2nd", "C": "2nd, after B"}
  for name, run in RUNS.items():
    lines.append(f"| {name} | {run['num_steps']} | {run['every']} | {run['log_every']} | "
                 f"{run['warmup']} | {process[name]} | "
                 + " | ".join(f"{sides[s][name]:.1f}" for s in sides) + " |")
  repeats.write_table(args.out, result, "\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
