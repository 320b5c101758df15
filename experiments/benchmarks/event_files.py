"""The cost of a sweep's TensorBoard event files, against the rows' other host work and against
the `cpu` preset's wall time, in one run.

  .venv/bin/python experiments/benchmarks/event_files.py

`bindjax sweep` writes every row twice on the host: appended to results.jsonl (the baseline,
there before) and, with --tensorboard (the default), as one TensorBoard event per row
(`bindjax.workdir.event_files`). This replays the `cpu` preset's rows through both writers exactly
as the loop calls them (one call per bucket and logged step, with that step's 20 rows): 20 replicas,
10,000 steps, a row every 100 steps. Every row is a copy of a real evaluation row of that preset
(docs/findings/scaling_law/cpu/results.jsonl: 49 fields, the most a row holds), so the event
side is timed at its largest. Each of --repeats rounds times both writers into fresh folders,
alternating which goes first; the table gives the medians and the event files' seconds as a
share of the `cpu` preset's whole-sweep wall time on 2 idle cores
(experiments/benchmarks/results/preset_wall_time_baseline.json, "this tree").

Writes experiments/benchmarks/results/event_files.{json,md} (--out to change the stem).
"""
import argparse
import os
import platform
import statistics
import tempfile
import time

from bindjax.base import files
from bindjax.commands import flags
from bindjax.training import grid
from bindjax.training import sweep
from bindjax.workdir import event_files
from bindjax.workdir import layout
from bindjax.workdir import results

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "experiments", "benchmarks", "results")
ROWS = os.path.join(REPO, "docs", "findings", "scaling_law", "cpu")
WALL_TIME = os.path.join(RESULTS, "preset_wall_time_baseline.json")


def logged_batches():
  """The `cpu` preset's rows, one list per logged step (every replica), as the loop adds them."""
  config = flags.load_config(os.path.join(REPO, "experiments", "coverage_sweep.py") + ":cpu")
  template = {r[results.REPLICA]: r for r in layout.Workdir(ROWS).read_rows()}
  every = (int(config.log_every), int(config.checkpoint.every))
  _, (bucket,) = grid.expand_grid(config)
  steps = [s for s in range(1, bucket.spec.num_steps + 1)
           if sweep.is_logged_step(bucket.spec, *every, s)]
  return [[dict(template[r], **{results.STEP: s}) for r in sorted(template)] for s in steps]


def time_jsonl(batches, directory):
  start = time.perf_counter()
  with open(os.path.join(directory, layout.RESULTS_FILE), "a") as f:
    for rows in batches:
      files.append_jsonl(f, rows)
  return time.perf_counter() - start


def time_events(batches, directory):
  start = time.perf_counter()
  writer = event_files.EventWriter(directory)
  for rows in batches:
    writer.add(rows)
  writer.sync()
  return time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--out", default=os.path.join(RESULTS, "event_files"))
  args = parser.parse_args()
  batches = logged_batches()
  sides = {"results.jsonl (baseline)": time_jsonl, "event files": time_events}
  seconds = {name: [] for name in sides}
  load_before = os.getloadavg()
  for round_ in range(args.repeats):
    order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
    for name in order:
      with tempfile.TemporaryDirectory() as directory:
        seconds[name].append(sides[name](batches, directory))
  wall = next(r for r in files.read_json(WALL_TIME)["rows"]
              if r["preset"] == "cpu" and r["side"] == "this tree")["estimated_full_s"]
  num_rows = sum(len(b) for b in batches)
  table = [{"writer": name, "median_s": statistics.median(s), "runs_s": s,
            "per_row_ms": 1e3 * statistics.median(s) / num_rows,
            "share_of_cpu_sweep": statistics.median(s) / wall} for name, s in seconds.items()]
  out = {"rows": table, "num_rows": num_rows, "num_batches": len(batches),
         "cpu_sweep_wall_s": wall, "repeats": args.repeats, "load_before": load_before,
         "load_after": os.getloadavg(), "machine": platform.platform(),
         "cpus": os.cpu_count()}
  lines = [f"`python experiments/benchmarks/event_files.py --repeats={args.repeats}`: the `cpu` "
           f"preset's {num_rows:,} rows ({len(batches)} logged steps × 20 replicas) through each "
           f"writer; load average {load_before[0]:.1f} before, {out['load_after'][0]:.1f} after. "
           f"Share: of the `cpu` sweep's {wall / 60:.1f} min on 2 idle cores.", "",
           "| writer | median (s) | per row (ms) | share of the cpu sweep |",
           "|---|---:|---:|---:|"]
  lines += [f"| {r['writer']} | {r['median_s']:.3f} | {r['per_row_ms']:.3f} | "
            f"{100 * r['share_of_cpu_sweep']:.3f} % |" for r in table]
  text = "\n".join(lines) + "\n"
  print(text)
  files.write_json(args.out + ".json", out)
  files.write_atomic(args.out + ".md", text)


if __name__ == "__main__":
  main()
