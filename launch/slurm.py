"""Launch a coverage sweep on a SLURM GPU cluster: writes an sbatch script and submits it.

  python launch/slurm.py --nodes=2 --gpus_per_node=8 --partition=gpu --time=24:00:00 \
      --config=experiments/coverage_sweep.py:paper --workdir_root=/shared/bindjax [--dry-run]

One task per node sees all of its GPUs; `srun` starts `bindjax sweep` on every node and
jax.distributed finds the others from SLURM's environment. The workdir (dated) must be on a
filesystem shared by the nodes. --dry-run prints the script and the sbatch command.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def sbatch_script(args, extra, workdir):
  """Text of the sbatch script."""
  lines = ["#!/bin/bash",
           f"#SBATCH --job-name={args.job_name}",
           f"#SBATCH --nodes={args.nodes}",
           "#SBATCH --ntasks-per-node=1",
           f"#SBATCH --gpus-per-node={args.gpus_per_node}",
           f"#SBATCH --cpus-per-task={args.cpus_per_task}",
           f"#SBATCH --time={args.time}",
           f"#SBATCH --output={workdir}/slurm-%j.out"]
  if args.partition:
    lines.append(f"#SBATCH --partition={args.partition}")
  if args.account:
    lines.append(f"#SBATCH --account={args.account}")
  sweep = common.sweep_command(f"{args.venv}/bin/bindjax", args.config, workdir, extra)
  lines += ["set -euo pipefail", f"cd {common.quote([args.repo])}",
            f"mkdir -p {common.quote([workdir])}",
            "srun --kill-on-bad-exit=1 " + common.quote(sweep), ""]
  return "\n".join(lines)


def parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--nodes", type=int, default=1)
  parser.add_argument("--gpus_per_node", type=int, default=8)
  parser.add_argument("--cpus_per_task", type=int, default=16)
  parser.add_argument("--time", default="24:00:00")
  parser.add_argument("--partition", default=None)
  parser.add_argument("--account", default=None)
  parser.add_argument("--job_name", default="bindjax-sweep")
  parser.add_argument("--config", default="experiments/coverage_sweep.py:paper")
  parser.add_argument("--workdir_root", default=os.path.join(common.REPO, "runs"))
  parser.add_argument("--workdir", default=None, help="exact workdir (e.g. to resume)")
  parser.add_argument("--repo", default=common.REPO, help="checkout on the shared filesystem")
  parser.add_argument("--venv", default=".venv", help="venv with bindjax and jax[cuda12]")
  parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true")
  return parser.parse_args(argv)


def main(argv=None):
  own, extra = common.split_extra(list(sys.argv[1:] if argv is None else argv))
  args = parse(own)
  if args.nodes < 1 or args.gpus_per_node < 1:
    raise SystemExit(f"--nodes={args.nodes}, --gpus_per_node={args.gpus_per_node}: expected "
                     "positive integers")
  workdir = args.workdir or common.dated_workdir(args.workdir_root, args.config)
  script = sbatch_script(args, extra, workdir)
  path = os.path.join(workdir, "sweep.sbatch")
  print(f"# workdir: {workdir}")
  if args.dry_run:
    print(f"# {path}:")
    print(script)
  else:
    os.makedirs(workdir, exist_ok=True)
    with open(path, "w") as f:
      f.write(script)
  return common.run([["sbatch", path]], args.dry_run)


if __name__ == "__main__":
  sys.exit(main())
