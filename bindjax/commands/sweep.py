"""`bindjax sweep --config=experiments/coverage_sweep.py:ARG --workdir=DIR`: run a coverage sweep.

Multi-host: on TPU pods and SLURM jobs jax.distributed starts by itself; elsewhere pass
--coordinator_address, --num_processes and --process_id (the same command on every host).
"""
from absl import flags

from bindjax import parallel
from bindjax.commands import flags as bj_flags


def main(argv):
  """Runs or resumes the sweep; a finished workdir is reported and left alone. Returns 0."""
  fv = bj_flags.new_flag_values()
  flags.DEFINE_bool("overwrite", False, "delete a previous sweep's outputs in --workdir and run "
                    "again", flag_values=fv)
  flags.DEFINE_bool("force", False, "alias of --overwrite", flag_values=fv)
  flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
  flags.DEFINE_bool("report", True, "write the phase-transition report when the sweep ends",
                    flag_values=fv)
  flags.DEFINE_string("coordinator_address", None, "multi-host: host:port of process 0",
                      flag_values=fv)
  flags.DEFINE_integer("num_processes", None, "multi-host: number of processes", flag_values=fv)
  flags.DEFINE_integer("process_id", None, "multi-host: this process's index", flag_values=fv)
  bj_flags.parse(fv, argv, required=("config", "workdir"))
  # Before anything touches the devices.
  from bindjax import sweep
  parallel.use_cpu_cores_as_devices(
      int(sweep.sweep_setting(fv["config"].value, "cpu_devices", -1)))
  parallel.maybe_initialize_distributed(fv["coordinator_address"].value,
                                        fv["num_processes"].value, fv["process_id"].value)
  from bindjax import report
  try:
    sweep.run_sweep(fv["config"].value, fv["workdir"].value,
                    overwrite=fv["overwrite"].value or fv["force"].value,
                    progress=fv["progress"].value)
  except ValueError as e:
    raise bj_flags.UsageError(f"{argv[0]}: {e}") from None
  if fv["report"].value and parallel.is_writer():
    try:
      summary = report.make_report(fv["workdir"].value, num_bootstrap=200)
      print("report:", ", ".join(summary["figures"]))
    except ValueError as e:
      print(f"report skipped: {e}")
  return 0
