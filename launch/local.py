"""Launch a coverage sweep on this machine, then write its report.

  python launch/local.py --config=experiments/coverage_sweep.py:cpu --workdir_root=runs [--dry-run]
  python launch/local.py --num_processes=2 ...   # several local processes via jax.distributed

With several processes, each is pinned to its own share of this machine's cores (--no-pin to
leave them unpinned; Linux only) and so makes one CPU device per core of its share. Inside one
process, XLA:CPU runs every device's ops on one shared thread pool, so each device's work hops
between cores; pinned processes keep it on one (bindjax.runtime.parallel.split_cores, measured by
experiments/benchmarks/sweep_throughput.py --processes).

The workdir is dated (ROOT/YYYYmmdd-HHMMSS-coverage_sweep-cpu) unless --workdir is given (to
resume a killed sweep, pass its workdir).
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from bindjax.runtime import parallel  # noqa: E402


def build_commands(args, extra, workdir):
  """argv lists: one per process of the sweep, then the report."""
  bindjax = args.bindjax
  sweep = common.sweep_command(bindjax, args.config, workdir, extra)
  if args.num_processes == 1:
    return [sweep], [bindjax, "report", f"--workdir={workdir}"]
  processes = [sweep + [f"--coordinator_address=127.0.0.1:{args.port}",
                        f"--num_processes={args.num_processes}", f"--process_id={i}",
                        "--noreport"] + (["--noprogress"] if i else [])
               for i in range(args.num_processes)]
  return processes, [bindjax, "report", f"--workdir={workdir}"]


def parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="experiments/coverage_sweep.py:smoke")
  parser.add_argument("--workdir_root", default=os.path.join(common.REPO, "runs"))
  parser.add_argument("--workdir", default=None)
  parser.add_argument("--bindjax", default=os.path.join(os.path.dirname(sys.executable), "bindjax"),
                      help="the bindjax command to run (default: the one beside this Python)")
  parser.add_argument("--num_processes", type=int, default=1)
  parser.add_argument("--port", type=int, default=12355)
  parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                      help="pin each of several processes to its own cores")
  parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true")
  return parser.parse_args(argv)


def main(argv=None):
  own, extra = common.split_extra(list(sys.argv[1:] if argv is None else argv))
  args = parse(own)
  if args.num_processes < 1:
    raise SystemExit(f"--num_processes={args.num_processes}: expected >= 1")
  workdir = args.workdir or common.dated_workdir(args.workdir_root, args.config)
  processes, report = build_commands(args, extra, workdir)
  print(f"# workdir: {workdir}")
  groups = None
  if args.pin and len(processes) > 1 and hasattr(os, "sched_setaffinity"):
    groups = parallel.split_cores(len(processes))
    if groups is None:
      print(f"# not pinned: more processes ({len(processes)}) than cores")
  for i, cores in enumerate(groups or []):
    print(f"# process {i} pinned to cores {','.join(map(str, cores))}")
  if args.dry_run or len(processes) == 1:
    return common.run(processes + [report], args.dry_run)
  for command in processes:
    print("+ " + common.quote(command), flush=True)
  running = [_start(command, cores)
             for command, cores in zip(processes, groups or [None] * len(processes))]
  codes = [p.wait() for p in running]
  if any(codes):
    print(f"sweep processes exited with {codes}", file=sys.stderr)
    return max(codes)
  return common.run([report], False)


def _start(command, cores):
  """Starts `command`, pinned to `cores` when given. A child inherits the affinity of the thread
  that starts it, so this thread takes `cores` for the start and then gets its own back; a
  preexec_fn would make Python fork a process that may hold JAX's threads."""
  if not cores:
    return subprocess.Popen(command)
  own = os.sched_getaffinity(0)
  os.sched_setaffinity(0, cores)
  try:
    return subprocess.Popen(command)
  finally:
    os.sched_setaffinity(0, own)


if __name__ == "__main__":
  sys.exit(main())
