"""`bindjax sweep --config=experiments/coverage_sweep.py:ARG --workdir=DIR`: run a coverage sweep.

Resumes from each bucket's latest checkpoint when DIR holds this sweep (same config); a DIR
holding a different config, or files that are not a bindjax run, is refused unless --overwrite
(which removes only what bindjax recorded as its outputs). A finished DIR is reported and left
alone, its report included. The run holds DIR's lock while it runs: a second run on DIR is
refused. Multi-host: on TPU pods and SLURM jobs jax.distributed starts by itself; elsewhere pass
--coordinator_address, --num_processes and --process_id (the same command on every host).
"""
import functools
import logging

from absl import flags

from bindjax.commands import flags as bj_flags
from bindjax.runtime import compilation_cache
from bindjax.runtime import multihost
from bindjax.runtime import parallel
from bindjax.workdir import layout


def run(argv, *, single, description):
  """Parses the flags of `bindjax sweep` (single=False) or `bindjax train` (single=True) and
  runs the loop; returns (flag values, the run's result, whether the workdir was already
  finished and left alone)."""
  fv = bj_flags.new_flag_values(workdir_help="the run's directory: results, checkpoints"
                                + ("" if single else ", report") + "; a run there is resumed")
  bj_flags.define_overwrite(fv)
  flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
  flags.DEFINE_bool("tensorboard", True, "also write every replica's curves as TensorBoard "
                    "event files under WORKDIR/tensorboard (`tensorboard --logdir=...`)",
                    flag_values=fv)
  if not single:
    flags.DEFINE_bool("report", True, "write the phase-transition report when the sweep ends",
                      flag_values=fv)
  flags.DEFINE_string("coordinator_address", None, "multi-host: host:port of process 0",
                      flag_values=fv)
  flags.DEFINE_integer("num_processes", None, "multi-host: number of processes", flag_values=fv)
  flags.DEFINE_integer("process_id", None, "multi-host: this process's index", flag_values=fv)
  bj_flags.parse(fv, argv, required=("config", "workdir"), description=description,
                 default_config=functools.partial(_default_config, single))
  config = fv["config"].value
  prog = argv[0]
  from bindjax.training import run_spec  # pylint: disable=g-import-not-at-top
  with bj_flags.usage_errors(prog):
    settings = run_spec.LoopSpec.from_config(config)
    # Before anything touches the devices.
    parallel.use_cpu_cores_as_devices(settings.cpu_devices)
  compilation_cache.enable()
  multihost.maybe_initialize_distributed(fv["coordinator_address"].value,
                                         fv["num_processes"].value, fv["process_id"].value)
  from bindjax.training import sweep  # pylint: disable=g-import-not-at-top
  loop = sweep.run_single if single else sweep.run_sweep
  workdir, overwrite = fv["workdir"].value, fv["overwrite"].value
  finished = layout.Workdir(workdir).is_finished() and not overwrite
  # orbax logs every failed write many times over; the failure itself ends the run as one line.
  logging.getLogger("absl").setLevel(logging.CRITICAL)
  with bj_flags.run_errors(prog):
    result = loop(config, workdir, overwrite=overwrite, progress=fv["progress"].value,
                  tensorboard=fv["tensorboard"].value)
  return fv, result, finished


def _default_config(single):
  """The defaults every preset starts from, with a sweep's (empty) grid unless `single`."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from bindjax.training import run_spec  # pylint: disable=g-import-not-at-top
  config = run_spec.default_config()
  if not single:
    config.grid = ml_collections.ConfigDict({name: () for name in (
        "spaces", "coverages", "seeds", "learning_rates", "weight_decays", "models")})
  return config


def main(argv):
  """Runs or resumes the sweep, then writes its report. Returns 0."""
  fv, _, finished = run(argv, single=False, description=__doc__)
  if finished and fv["report"].value:
    print(f"report: left as it is (the sweep was already finished); `bindjax report "
          f"--workdir={fv['workdir'].value} --overwrite` redraws it")
  elif fv["report"].value and multihost.is_writer():
    from bindjax.reporting import report  # pylint: disable=g-import-not-at-top
    try:
      summary = report.make_report(fv["workdir"].value, num_draws=200)
      print("report:", ", ".join(summary["figures"]))
    except ValueError as e:
      print(f"report skipped: {e}")
  return 0
