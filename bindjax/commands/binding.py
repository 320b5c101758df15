"""`bindjax binding --workdir=SWEEP --config=experiments/binding.py:ARG [--step=best|final]
[--out=DIR]`.

Every replica's binding function (docs/binding.md): for each replica of the sweep in SWEEP, the
scene tower's embeddings of every two-object scene and the query tower's concept and object
probes (its best or final parameters; one vmapped forward pass per bucket), then every
approximator family fitted to those embeddings on the scenes of the replica's own training
objects and scored by its own probes on train-only, test-only (objects it never saw) and mixed
scenes. Replicas that diverged, or have no evaluation at that step, are reported and not
fitted. Writes DIR (default SWEEP/binding): results.csv (one row per replica and family, beside
the replica's held-out accuracy, binding figure, coverage, |O| and seed), results.json (all of
it, timings, correlations), correlations.md (Spearman's ρ of held-out two-object accuracy
against each family's test-only fit R², bootstrap interval over replicas) and the figure
binding_fits.png/.pdf. A non-empty DIR is refused unless --overwrite.

Config fields (--config.FIELD=VALUE): models (comma list, as in `bindjax complexity`),
embed_dim, learning_rate, fit_seed, fit.* (every FitConfig field: steps, eval_every, schedule,
eval_cadence, restarts, ...), chunk_size, pad_ratio (fits whose training counts are within
this factor share a compiled batch; inf: one batch per family and bucket), memory_bytes,
encode_batch, cpu_devices, bootstrap, save_embeddings (also write each fitted replica's
embedding set to DIR/embeddings/).
"""
import os

from absl import flags
from etils import epath

from bindjax.commands import flags as flags_lib
from bindjax.runtime import compilation_cache
from bindjax.runtime import parallel
from bindjax.workdir import results


def _default_config():
  from bindjax.complexity import replicas  # pylint: disable=g-import-not-at-top
  return replicas.default_config()


def main(argv):
  """Runs the command; returns 0 (errors exit with the statuses of bindjax.commands.flags)."""
  fv = flags_lib.new_flag_values(with_workdir=False,
                                 config_help="binding config (experiments/binding.py:ARG)")
  flags.DEFINE_string("workdir", None, "the `bindjax sweep` (or `bindjax train`) workdir to "
                      "read", flag_values=fv)
  flags.DEFINE_enum("step", results.DEFAULT_STEP, list(results.STEPS), "parameters and "
                    "evaluation of each replica: the last, or at its best held-out object "
                    "accuracy (selected on held-out objects)", flag_values=fv)
  flags.DEFINE_string("out", None, "output directory (default WORKDIR/binding)", flag_values=fv)
  flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
  flags_lib.define_overwrite(fv)
  flags_lib.parse(fv, argv, required=("workdir", "config"), description=__doc__,
                  default_config=_default_config)
  prog, workdir = argv[0], fv["workdir"].value
  out = fv["out"].value or os.fspath(epath.Path(workdir) / "binding")
  flags_lib.check_output_dir(prog, "out", out, fv["overwrite"].value)
  from bindjax.complexity import replicas  # pylint: disable=g-import-not-at-top
  with flags_lib.usage_errors(prog):
    settings = replicas.settings_from(fv["config"].value)
    parallel.use_cpu_cores_as_devices(settings.cpu_devices)   # before JAX starts
  compilation_cache.enable()
  with flags_lib.run_errors(prog):
    summary = replicas.run(settings, workdir, out, fv["step"].value,
                           progress=fv["progress"].value)
  for row in summary["correlations"]:
    c = row["test_only"]
    rho = "–" if c["rho"] is None else f"{c['rho']:.2f}"
    interval = "" if not c["interval"] else f" [{c['interval'][0]:.2f}, {c['interval'][1]:.2f}]"
    print(f"{row['name']:>24}: rho(held-out accuracy, test-only R²) = {rho}{interval} "
          f"({c['num_points']} replicas)")
  print(f"wrote {out}/results.csv, results.json, correlations.md and binding_fits.png/.pdf")
  return 0
