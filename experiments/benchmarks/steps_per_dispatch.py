"""Steps per dispatch: a small-model sweep trained one step per dispatch and k steps per
dispatch, side by side.

  git worktree add /tmp/bindjax_baseline ebad923   # the last commit with one step per dispatch
  .venv/bin/python experiments/benchmarks/steps_per_dispatch.py --baseline=/tmp/bindjax_baseline

The sweep loop of this tree runs every step up to the next one whose rows are written in one
dispatch (`bindjax.training.sweep.dispatch_ends`); the loop it replaced dispatched each step. The
one-step loop is gone from this tree, so the baseline is that code checked out at --baseline. Each
side runs the same sweep with `bindjax.training.sweep.run_sweep` (the same call in both trees) in a
worker process that imports bindjax from its own tree, over one CPU device per core as `bindjax
sweep` sets up: R = 16 replicas of one bucket (4 coverages x 4 seeds, |O| = 36) with the smoke
preset's towers and batch (--model=tiny: experiments/train.py:tiny's), rows every 100 steps,
evaluations every 500 and a checkpoint at the end, as in the CPU presets. Optimised code, as a long
sweep compiles it (--fast_compile: the smoke preset's cheaper compiles of slower code). Each of
--repeats rounds runs both sides back to back, alternating which goes first, so the drift of a
shared machine hits both alike; a round's speedup is its k-step rate over its one-step rate. A
run is timed from the end of its compile (the bucket's "compiled in" line) to the end of
`run_sweep`: training, rows, the evaluations and the checkpoint; each worker first makes one
untimed run, which compiles (its seconds are recorded). Every run of both sides should write the
same results.jsonl (its SHA-256 is in sweep_done.json); `identical_results` says whether they did.

Writes experiments/benchmarks/results/steps_per_dispatch.{json,md} (--out to change the stem).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time


from bindjax.base import files
from bindjax.commands import flags
from bindjax.runtime import parallel
import repeats  # experiments/benchmarks/repeats.py, beside this script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "experiments", "benchmarks", "results")
SWEEP_PRESETS = os.path.join(REPO, "experiments", "coverage_sweep.py")
TRAIN_PRESETS = os.path.join(REPO, "experiments", "train.py")
LOG_EVERY, EVAL_EVERY, CHECKPOINT_EVERY = 100, 500, 1000
ONE_STEP, K_STEPS = "one step per dispatch", "k steps per dispatch"


def config_for(model, steps, fast_compile):
  """The benchmark's sweep: 16 replicas of one bucket with `model`'s towers and batch."""
  c = flags.load_config(f"{SWEEP_PRESETS}:smoke")
  c.grid.spaces = ((2, 6),)
  c.grid.coverages = (0.3, 0.5, 0.7, 0.9)
  c.grid.seeds = (0, 1, 2, 3)
  if model == "tiny":
    tiny = flags.load_config(f"{TRAIN_PRESETS}:tiny")
    c.model, c.sampler = tiny.model, tiny.sampler
  c.num_steps = steps
  c.log_every = LOG_EVERY
  c.eval.every = EVAL_EVERY
  c.checkpoint.every = CHECKPOINT_EVERY
  c.sweep.fast_compile = fast_compile
  return c


def serve(args):
  """Worker: answers each line (a fresh workdir) on stdin with one timed run as JSON."""
  parallel.use_cpu_cores_as_devices(-1)   # before JAX starts, as `bindjax sweep` does
  from bindjax.training import sweep
  config = config_for(args.model, args.steps, args.fast_compile)
  print(json.dumps({"bindjax": os.path.dirname(os.path.dirname(os.path.dirname(sweep.__file__)))}),
        flush=True)
  for line in sys.stdin:
    compiled = []

    def log(message):
      if "compiled in" in message:
        compiled.append(time.perf_counter())

    done = sweep.run_sweep(config, line.strip(), progress=False, log=log)
    print(json.dumps({"train_s": time.perf_counter() - compiled[0],
                      "compile_s": done["compile_seconds"],
                      "results_sha256": done["results_sha256"]}), flush=True)


class Worker:
  """A worker process importing bindjax from `tree`, warmed up by one untimed run in
  `workdir` (its compile included)."""

  def __init__(self, args, tree, workdir):
    command = [sys.executable, os.path.abspath(__file__), "--part=worker",
               f"--model={args.model}", f"--steps={args.steps}"]
    command += ["--fast_compile"] if args.fast_compile else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [tree] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
    imported = self.reply()["bindjax"]
    if not os.path.samefile(imported, tree):
      raise RuntimeError(f"the worker for {tree} imported bindjax from {imported}")
    self.commit = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip()
    self.warm_up = self.run(workdir)

  def reply(self):
    line = self.process.stdout.readline()
    if not line:
      raise RuntimeError(f"benchmark worker exited with {self.process.wait()}")
    return json.loads(line)

  def run(self, workdir):
    self.process.stdin.write(workdir + "\n")
    self.process.stdin.flush()
    return self.reply()

  def close(self):
    self.process.stdin.close()
    self.process.wait()


def compare(args):
  """Rounds of one run per side; returns the result dict and the Markdown table."""
  from bindjax.training import grid
  from bindjax.training import sweep
  config = config_for(args.model, args.steps, args.fast_compile)
  _, (bucket,) = grid.expand_grid(config)
  replicas = len(bucket.replicas)
  sides = {ONE_STEP: (args.baseline, args.steps),
           K_STEPS: (REPO, len(sweep.dispatch_ends(bucket.spec, config.log_every,
                                                   config.checkpoint.every)))}
  workers = {}
  runs = {name: [] for name in sides}
  load = [os.getloadavg()]
  try:
    with tempfile.TemporaryDirectory() as scratch:
      for name, (tree, _) in sides.items():
        workers[name] = Worker(args, tree, os.path.join(scratch, f"warm_up_{name[0]}"))
      for round_index in range(args.repeats):
        order = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
        for name in order:
          workdir = os.path.join(scratch, f"{round_index}_{len(runs[name])}_{name[0]}")
          runs[name].append(workers[name].run(workdir))
        load.append(os.getloadavg())
  finally:
    for worker in workers.values():
      worker.close()
  rates = {name: [replicas * args.steps / r["train_s"] for r in runs[name]] for name in sides}
  speedups = [k / one for k, one in zip(rates[K_STEPS], rates[ONE_STEP])]
  digests = {r["results_sha256"] for name in sides
             for r in runs[name] + [workers[name].warm_up]}
  result = {
      "model": args.model, "replicas": replicas, "steps": args.steps,
      "cadence": {"log_every": LOG_EVERY, "eval_every": EVAL_EVERY,
                  "checkpoint_every": CHECKPOINT_EVERY},
      "fast_compile": args.fast_compile, "repeats": args.repeats,
      "sides": {name: {"commit": workers[name].commit, "dispatches": dispatches,
                       "replica_steps_per_s": repeats.stats(rates[name]),
                       "compile_s": workers[name].warm_up["compile_s"], "runs": runs[name]}
                for name, (_, dispatches) in sides.items()},
      "speedup": repeats.stats(speedups), "identical_results": len(digests) == 1,
      "load_average": {"start": load[0], "after_each_round": load[1:]},
  }
  table = ["| set-up | code | dispatches per run | replica-steps/s | speedup |",
           "|---|---|---:|---:|---:|"]
  for name, side in result["sides"].items():
    speedup = repeats.fmt(result["speedup"], 2) if name == K_STEPS else ""
    table.append(f"| {name} | {side['commit']} | {side['dispatches']} | "
                 f"{repeats.fmt(side['replica_steps_per_s'])} | {speedup} |")
  return result, table


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--baseline", help="a checkout of the one-step-per-dispatch code")
  parser.add_argument("--model", choices=["smoke", "tiny"], default="smoke")
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--fast_compile", action="store_true")
  parser.add_argument("--out", default=None, help="output stem (default results/<name>)")
  parser.add_argument("--part", choices=["all", "worker"], default="all",
                      help="internal: a worker that runs the sweep once per line on stdin")
  args = parser.parse_args(argv)
  if args.part == "worker":
    serve(args)
    return 0
  if not args.baseline:
    parser.error("--baseline is required: a checkout of the code to compare against")
  result, table = compare(args)
  result["machine"] = {"cpus": os.cpu_count(), "platform": platform.platform()}
  result["command"] = " ".join([os.path.relpath(sys.argv[0], REPO)] + (argv or sys.argv[1:]))
  stem = args.out or os.path.join(RESULTS, "steps_per_dispatch")
  os.makedirs(os.path.dirname(stem), exist_ok=True)
  files.write_atomic(stem + ".json", json.dumps(result, indent=2))
  loads = [result["load_average"]["start"]] + result["load_average"]["after_each_round"]
  text = "\n".join([
      "# steps_per_dispatch", "", f"`{result['command']}`", "", *table, "",
      f"{args.model} model, R = {result['replicas']}, {args.steps} steps, rows every "
      f"{LOG_EVERY}; identical results.jsonl on both sides: "
      f"{'yes' if result['identical_results'] else 'NO'}.",
      "1-minute load average at the start and after each round: "
      f"{', '.join(f'{x[0]:.2f}' for x in loads)} ({result['machine']['cpus']} CPUs).", ""])
  files.write_atomic(stem + ".md", text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
