"""Wall time of whole coverage-sweep presets on this machine, from a short run of each.

  .venv/bin/python experiments/benchmarks/preset_wall_time.py \
      --presets=cpu,cpu_c3,cpu_144,cpu_196 \
      --out=experiments/benchmarks/results/preset_wall_time

A preset's full sweep takes 45-100 minutes on 2 cores, too long to time every one on idle
cores. So each preset runs as `bindjax sweep` for --steps steps of its own bucket, in a fresh
process with an empty compilation cache (as a first run has), while the benchmark watches the
step of the newest row in the sweep's results.jsonl (rows are written as each logged step
ends). The run splits into three parts:

  before: start-up, compile and the steps up to the first logged step (log_every);
  window: the steps from there to the last logged step before the final one, at the rate
          that also pays for the evaluations and checkpoints in between;
  after:  the final step, its evaluation and checkpoint, the summary and the exit.

The first and last are paid once, so the full sweep's estimate is

    before + (num_steps - 2 x log_every) / window rate + after.

With the presets' cadence (rows every 100 steps, evaluation every 500, checkpoint every 1,000),
the default --steps=1100 makes the window steps 100-1,000: 900 steps with two evaluations and
one checkpoint, within one evaluation of the full run's share. The table puts each estimate
beside the preset's target, and beside a full run's measured wall time where --measured names
one (preset=seconds), so the method is checked on the same machine in the same table. The load
average before and after each run is recorded: the estimate holds for idle cores only if it was
low.

--baseline=TREE (a checkout of another commit) runs every preset with that tree's code and
presets too, right before this tree's run of it, so the two sides see the same machine:

  git worktree add /tmp/bindjax_baseline d9e1035   # the code of the cpu preset's timed idle run
  .venv/bin/python experiments/benchmarks/preset_wall_time.py --presets=cpu \
      --baseline=/tmp/bindjax_baseline --measured=cpu=2757 \
      --out=experiments/benchmarks/results/preset_wall_time_baseline
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import repeats  # experiments/benchmarks/repeats.py, beside this script

from bindjax.base import files
from bindjax.commands import flags
from bindjax.training import grid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESETS = os.path.join(REPO, "experiments", "coverage_sweep.py")
RESULTS = os.path.join(REPO, "experiments", "benchmarks", "results")
POLL_SECONDS = 0.25
TAIL_BYTES = 65536  # more than one row
# `bindjax` as the tree on PYTHONPATH has it (the installed command would be this tree's).
CLI = "import sys; from bindjax.commands import main as cli; sys.exit(cli.main())"


def newest_step(path):
  """The step of the last complete row of the results file at `path` (0 if none yet)."""
  try:
    with open(path, "rb") as f:
      f.seek(max(0, os.path.getsize(path) - TAIL_BYTES))
      tail = f.read().split(b"\n")
  except FileNotFoundError:
    return 0
  complete = [line for line in tail[:-1] if line.startswith(b"{")]
  return json.loads(complete[-1])["step"] if complete else 0


def watched_run(command, env, cwd, results_path, log_path):
  """Runs `command` (output to `log_path`); returns (wall seconds, {step: seconds since start
  when its first row appeared})."""
  seen = {}
  t0 = time.perf_counter()
  with open(log_path, "w") as log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                    env=env, cwd=cwd) as p:
    while p.poll() is None:
      step = newest_step(results_path)
      if step and step not in seen:
        seen[step] = time.perf_counter() - t0
      time.sleep(POLL_SECONDS)
  wall = time.perf_counter() - t0
  if p.returncode:
    with open(log_path) as f:
      raise RuntimeError(f"{' '.join(command)} exited {p.returncode}:\n{f.read()[-3000:]}")
  return wall, seen


def split_run(seen, wall, first, last):
  """(seconds before step `first`'s rows, seconds per step from `first` to `last`, seconds
  after step `last`'s rows) of a run of `wall` seconds whose rows of each step appeared at
  `seen[step]` seconds."""
  return seen[first], (seen[last] - seen[first]) / (last - first), wall - seen[last]


def full_run_estimate(before, per_step, after, steps_outside, num_steps):
  """Seconds of a `num_steps` run: the parts paid once (`before` and `after`, which hold
  `steps_outside` steps between them) and every other step at `per_step`."""
  return before + per_step * (num_steps - steps_outside) + after


def measure(preset, steps, workdir, tree=REPO):
  """Runs `steps` steps of the preset's sweep with the code and presets of `tree`; returns its
  timings and the full-run estimate."""
  presets = os.path.join(tree, "experiments", "coverage_sweep.py")
  config = flags.load_config(f"{presets}:{preset}")
  replicas, buckets = grid.expand_grid(config)
  if len(buckets) != 1:
    raise ValueError(f"--presets={preset}: expected a preset of one bucket, got {len(buckets)}")
  first, last = config.log_every, steps - config.log_every
  if last <= first:
    raise ValueError(f"--steps={steps}: expected more than 2 x log_every ({config.log_every})")
  os.makedirs(os.path.dirname(workdir), exist_ok=True)
  with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, XDG_CACHE_HOME=cache, PYTHONPATH=tree)
    command = [sys.executable, "-c", CLI, "sweep", f"--config={presets}:{preset}",
               f"--config.num_steps={steps}", f"--workdir={workdir}", "--noprogress",
               "--noreport"]
    load_before = os.getloadavg()
    wall, seen = watched_run(command, env, tree, os.path.join(workdir, "results.jsonl"),
                             workdir + ".log")
    load_after = os.getloadavg()
  if first not in seen or last not in seen:
    raise RuntimeError(f"{preset}: rows of steps {first} and {last} were not seen ({seen})")
  done = files.read_json(os.path.join(workdir, "sweep_done.json"))
  before, per_step, after = split_run(seen, wall, first, last)
  return {
      "preset": preset, "replicas": len(replicas), "space_size": buckets[0].spec.space.num_objects,
      "steps_run": steps, "num_steps": config.num_steps, "wall_s": wall,
      "compile_s": done["compile_seconds"], "before_s": before, "after_s": after,
      "window_steps": [first, last], "per_step_s": per_step,
      "replica_steps_per_s": len(replicas) / per_step,
      "estimated_full_s": full_run_estimate(before, per_step, after, steps - last + first,
                                            config.num_steps),
      "load_before": load_before, "load_after": load_after,
  }


def table(rows, targets, command):
  """The Markdown table of `measure` rows."""
  lines = ["# preset_wall_time", "", f"`{command}`", "",
           "| preset | code | \\|O\\| | replicas | steps | compile (s) | once (s) "
           "| replica-steps/s "
           "| estimated full sweep (min) | measured full sweep (min) | target (min) "
           "| load before, after |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
  for r in rows:
    full = r["measured_full_s"]
    lines.append(
        f"| {r['preset']} | {r['side']} | {r['space_size']} | {r['replicas']} "
        f"| {r['num_steps']:,} "
        f"| {r['compile_s']:.0f} | {r['before_s'] + r['after_s']:.0f} "
        f"| {r['replica_steps_per_s']:.1f} "
        f"| {r['estimated_full_s'] / 60:.1f} | {'' if full is None else f'{full / 60:.1f}'} "
        f"| {targets[r['preset']]:g} | {r['load_before'][0]:.1f}, {r['load_after'][0]:.1f} |")
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--presets", default="cpu,cpu_c3,cpu_144,cpu_196")
  parser.add_argument("--steps", type=int, default=1100, help="steps of each short run")
  parser.add_argument("--measured", default="",
                      help="preset=seconds of full runs timed on this machine, comma-separated, "
                      "with the baseline's code (this tree's without --baseline)")
  parser.add_argument("--target_minutes", default="cpu=60",
                      help="preset=minutes, comma-separated; other presets get --default_target")
  parser.add_argument("--default_target", type=float, default=90)
  parser.add_argument("--baseline", default=None,
                      help="a checkout of the commit to compare with, run side by side")
  parser.add_argument("--out", default=os.path.join(RESULTS, "preset_wall_time"))
  args = parser.parse_args()
  presets = [p for p in args.presets.split(",") if p]
  pairs = lambda text: dict((k, float(v)) for k, v in (p.split("=") for p in text.split(",") if p))
  measured = pairs(args.measured)
  targets = {p: pairs(args.target_minutes).get(p, args.default_target) for p in presets}
  rows = []
  with tempfile.TemporaryDirectory() as root:
    trees = ([("baseline", os.path.abspath(args.baseline))] if args.baseline else []) + [
        ("this tree", REPO)]
    for preset in presets:
      for side, tree in trees:
        rows.append(dict(measure(preset, args.steps, os.path.join(root, side, preset), tree),
                         side=side))
        print(f"{preset}, {side}: {rows[-1]['estimated_full_s'] / 60:.1f} min estimated",
              flush=True)
  for r in rows:
    r["target_min"] = targets[r["preset"]]
    timed_side = "baseline" if args.baseline else "this tree"
    r["measured_full_s"] = measured.get(r["preset"]) if r["side"] == timed_side else None
  # The baseline's path is this machine's; the table names the commit's checkout BASELINE.
  command = "python experiments/benchmarks/preset_wall_time.py " + " ".join(
      "--baseline=BASELINE" if a.startswith("--baseline") else a for a in sys.argv[1:])
  repeats.write_table(args.out, {"rows": rows, "command": command},
                      table(rows, targets, command))


if __name__ == "__main__":
  main()
