"""Replica slots kept busy by a sweep's plan: buckets in turn against buckets packed onto lanes.

  python experiments/benchmarks/packing_plan.py                          # the paper grid
  python experiments/benchmarks/packing_plan.py --preset=cpu --devices=2,8 --devices_per_host=8

For the preset's grid and each device count (hosts of --devices_per_host devices, one process
each) and each number of devices per replica (`sweep.num_data`, dividing the batch), the plan
`bindjax.training.packing` makes when the buckets run one after another over every device (today's
sweep with packing "none") and the plan it packs (packing "auto"): lanes, parts, makespan in
units of the preset's costliest replica, and the share of replica slots that train a replica
(the rest is padding, or devices waiting for the longest lane). Nothing runs on a device: the
plan is arithmetic on the grid's bucket sizes and train FLOPs. The lanes of a plan on several
hosts take an equal share of every host's devices.

Writes experiments/benchmarks/results/packing_plan[_TAG].{json,md}.
"""
import argparse
import json
import os
import sys

from bindjax.base import files
from bindjax.commands import flags
from bindjax.training import grid
from bindjax.training import packing
from bindjax.training import train

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
PRESETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "coverage_sweep.py")


def _ints(text):
  return [int(x) for x in text.split(",")]


def rows_for(preset, device_counts, devices_per_host, data_counts):
  """One row per (devices, devices per replica): the plan in turn and the plan packed."""
  _, buckets = grid.expand_grid(flags.load_config(f"{PRESETS}:{preset}"))
  sizes = [len(b.replicas) for b in buckets]
  costs = [train.train_step_flops(b.spec) * b.spec.num_steps for b in buckets]
  unit = max(costs)
  batch = buckets[0].spec.sampler.batch_size
  rows = []
  for num_devices in device_counts:
    hosts = max(1, num_devices // devices_per_host)
    processes = [d * hosts // num_devices for d in range(num_devices)]
    for num_data in data_counts:
      if num_devices % num_data or batch % num_data:
        continue
      turn = packing.in_turn(sizes, costs, num_devices, num_data, hosts)
      plan = packing.choose(sizes, costs, num_devices, num_data, processes)
      rows.append({
          "preset": preset, "bucket_sizes": sizes, "devices": num_devices, "hosts": hosts,
          "num_data": num_data, "batch_per_device": batch // num_data,
          "in_turn_slot_use": turn.slot_use, "in_turn_makespan": turn.makespan / unit,
          "packed_slot_use": plan.slot_use, "packed_makespan": plan.makespan / unit,
          "lanes": len(plan.lanes), "lane_devices": len(plan.lanes[0].devices),
          "parts": len(plan.parts), "plan": plan.describe()})
  return rows


def table(rows):
  lines = ["| devices | hosts | devices per replica | batch per device | in turn: slots busy | "
           "packed: slots busy | lanes × devices | parts | makespan, in turn → packed |",
           "|---:|---:|---:|---:|---:|---:|---|---:|---|"]
  for r in rows:
    lines.append(
        f"| {r['devices']} | {r['hosts']} | {r['num_data']} | {r['batch_per_device']} | "
        f"{r['in_turn_slot_use']:.1%} | {r['packed_slot_use']:.1%} | "
        f"{r['lanes']} × {r['lane_devices']} | {r['parts']} | "
        f"{r['in_turn_makespan']:.2f} → {r['packed_makespan']:.2f} |")
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--preset", default="paper")
  parser.add_argument("--devices", type=_ints, default=[8, 16, 64, 256])
  parser.add_argument("--devices_per_host", type=int, default=4,
                      help="devices per host once a slice needs several (a v4/v5 TPU host: 4)")
  parser.add_argument("--num_data", type=_ints, default=[1, 2, 4, 8, 16, 32])
  parser.add_argument("--tag", default="")
  parser.add_argument("--out", default=None, help="path stem (default results/packing_plan[_TAG])")
  args = parser.parse_args(argv)
  rows = rows_for(args.preset, args.devices, args.devices_per_host, args.num_data)
  lines = table(rows)
  print("\n".join(lines))
  stem = args.out or os.path.join(RESULTS, "packing_plan" + (f"_{args.tag}" if args.tag else ""))
  files.write_atomic(stem + ".json", json.dumps({"args": vars(args), "rows": rows}, indent=1))
  command = "python experiments/benchmarks/packing_plan.py " + " ".join(
      sys.argv[1:] if argv is None else argv)
  files.write_atomic(stem + ".md", f"`{command.strip()}`\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
