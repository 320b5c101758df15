"""Launch a coverage sweep on a Cloud TPU pod slice (all workers run the same command).

  python launch/tpu_pod.py --name=bindjax-v4-32 --zone=us-central2-b --accelerator_type=v4-32 \
      --config=experiments/coverage_sweep.py:paper --workdir_root=/mnt/gcs/bindjax [--dry-run] \
      [-- --config.grid.seeds=0]

Steps: create the TPU VM unless one of that name exists (reuse), pack this checkout (no .venv,
no .git), copy it to every worker, install bindjax with jax[tpu] in a venv on every worker
(optionally mounting a GCS bucket with gcsfuse so all workers share the workdir), then start
`bindjax sweep` on --worker=all in a dated workdir, detached from the ssh session (nohup setsid)
so that it outlives the terminal: each worker logs to WORKDIR/logs/<its hostname>.log and
records its pid beside it. The launcher prints how to follow the logs, stop the sweep (SIGINT:
it stops as Ctrl-C stops it) and resume it (the same launch with --workdir=WORKDIR).
jax.distributed starts by itself on TPU pods; process 0 writes the results; checkpoints are
written collectively by orbax, so the workdir must be shared by the workers (gcsfuse mount,
NFS, or a gs:// URI; docs/accelerators.md says what each guarantees). With a gs:// workdir the
logs stay on each worker, in ~/bindjax/logs.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

ARCHIVE = "/tmp/bindjax-code.tar.gz"
REMOTE_DIR = "~/bindjax"
RENAME_DIR_LIMIT = 100000


def build_commands(args, extra, now=None):
  """Shell commands of the launch, in order."""
  workdir = args.workdir or common.dated_workdir(args.workdir_root, args.config, now)
  where = [f"--zone={args.zone}"] + ([f"--project={args.project}"] if args.project else [])
  tpu = ["gcloud", "compute", "tpus", "tpu-vm"]
  create = tpu + ["create", args.name, *where, f"--accelerator-type={args.accelerator_type}",
                  f"--version={args.version}"] + (["--spot"] if args.spot else [])
  describe = tpu + ["describe", args.name, *where]
  install = [f"mkdir -p {REMOTE_DIR}", f"tar xzf ~/bindjax.tar.gz -C {REMOTE_DIR}",
             f"cd {REMOTE_DIR}", "python3 -m venv .venv", ".venv/bin/pip install -q -U pip",
             f".venv/bin/pip install -q -e . {common.quote([args.jax_spec])}"]
  if args.gcs_bucket:
    install = [f"mkdir -p {args.mount_point}",
               # orbax renames each checkpoint's temporary folder into place, which gcsfuse
               # refuses on a flat bucket unless the folder's objects are within this limit.
               f"(mountpoint -q {args.mount_point} || gcsfuse --implicit-dirs "
               f"--rename-dir-limit={RENAME_DIR_LIMIT} {args.gcs_bucket} {args.mount_point})"
               ] + install
  sweep = common.sweep_command(".venv/bin/bindjax", args.config, workdir,
                               ["--noprogress", *extra])
  logs = log_dir(workdir)
  log = f"{logs}/$(hostname)"
  # setsid: a session of its own, so closing the ssh connection sends it no SIGHUP; every
  # stream redirected, so ssh returns at once.
  run = (f"cd {REMOTE_DIR} && mkdir -p {logs} && (nohup setsid {common.quote(sweep)} "
         f"> {log}.log 2>&1 < /dev/null & echo $! > {log}.pid)")
  ssh = tpu + ["ssh", args.name, *where, "--worker=all"]
  return [
      f"{common.quote(describe)} >/dev/null 2>&1 || {common.quote(create)}",
      common.quote(["tar", "czf", ARCHIVE, "--exclude=.venv", "--exclude=.git",
                    "--exclude=__pycache__", "-C", args.repo, "."]),
      common.quote(tpu + ["scp", ARCHIVE, f"{args.name}:~/bindjax.tar.gz", *where,
                          "--worker=all"]),
      common.quote(ssh + [f"--command={' && '.join(install)}"]),
      common.quote(ssh + [f"--command={run}"]),
  ], workdir


def log_dir(workdir):
  """Where the workers write their logs: WORKDIR/logs, or ~/bindjax/logs for a gs:// workdir."""
  return f"{REMOTE_DIR}/logs" if "://" in workdir else f"{workdir}/logs"


def next_steps(args, own_argv, extra, workdir):
  """The lines printed after a launch: how to follow, stop and resume the detached sweep."""
  where = [f"--zone={args.zone}"] + ([f"--project={args.project}"] if args.project else [])
  ssh = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", args.name, *where]
  logs = log_dir(workdir)
  kept = [a for a in own_argv if not a.startswith(("--workdir=", "--workdir_root=", "--dry"))]
  resume = ["python", "launch/tpu_pod.py", *kept, f"--workdir={workdir}"] + (
      ["--", *extra] if extra else [])
  return [
      "# the sweep runs detached on every worker; follow worker 0 (process 0 writes the rows):",
      common.quote(ssh + ["--worker=0", f"--command=tail -f {logs}/*.log"]),
      "# stop it: SIGINT on every worker, as Ctrl-C (the checkpoints are kept however it stops):",
      common.quote(ssh + ["--worker=all", f"--command=kill -INT $(cat {logs}/$(hostname).pid)"]),
      "# resume it (after a stop, a preemption or a crash): the same launch into its workdir",
      common.quote(resume),
  ]


def parse(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--name", required=True, help="TPU VM name (reused if it exists)")
  parser.add_argument("--zone", required=True)
  parser.add_argument("--project", default=None)
  parser.add_argument("--accelerator_type", default="v4-32")
  parser.add_argument("--version", default="tpu-ubuntu2204-base", help="TPU VM runtime")
  parser.add_argument("--spot", action="store_true", help="spot (preemptible) capacity")
  parser.add_argument("--config", default="experiments/coverage_sweep.py:paper")
  parser.add_argument("--workdir_root", default="/mnt/gcs/bindjax",
                      help="parent of the dated workdir; must be shared by all workers")
  parser.add_argument("--workdir", default=None, help="exact workdir (e.g. to resume)")
  parser.add_argument("--gcs_bucket", default=None, help="bucket to gcsfuse-mount on workers")
  parser.add_argument("--mount_point", default="/mnt/gcs")
  parser.add_argument("--jax_spec", default="jax[tpu]>=0.10.2,<0.11")
  parser.add_argument("--repo", default=common.REPO, help="checkout to copy")
  parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                      help="print the commands instead of running them")
  return parser.parse_args(argv)


def main(argv=None):
  own, extra = common.split_extra(list(sys.argv[1:] if argv is None else argv))
  args = parse(own)
  commands, workdir = build_commands(args, extra)
  print(f"# workdir: {workdir}")
  status = common.run(commands, args.dry_run)
  if not status:
    print("\n".join(next_steps(args, own, extra, workdir)))
  return status


if __name__ == "__main__":
  sys.exit(main())
