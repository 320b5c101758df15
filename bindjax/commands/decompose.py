"""`bindjax decompose --embeddings=DIR --workdir=OUT [--config=experiments/geometry.py:ARG]`.

Additive decomposition of 2-object scene embeddings: an object model (one vector per object and
slot) and a concept model (one per concept value and slot), fitted and in closed form; object
estimates from the banks (obj-avg = the original's position-independent bank, pos-avg = its
position-dependent bank, single-object); and the subtraction suite: linear probes fitted on the
embeddings, on the embeddings minus each model's reconstruction and minus permuted controls.
Writes OUT/decomposition.json; a non-empty OUT is refused unless --overwrite, and nothing is
written when a flag, the config or the input is rejected. The suite fits its
probes on the subtracted embeddings, so it cannot take a probes file.

Config fields: decomposition.steps, learning_rate, weight_decay, batch_size, train_fraction,
seed, banks, control_seed, tie_tolerance, subtract (least_squares | fit); obj_avg_counting
(occurrences as the original, or scenes); probe.* (the suite's probes).
"""
from bindjax.commands import flags as flags_lib
from bindjax.commands import geometry_flags


def main(argv):
  """Runs the command; returns 0 (errors exit with the statuses of bindjax.commands.flags)."""
  fv = geometry_flags.new_flag_values()
  geometry_flags.parse(fv, argv, __doc__)
  prog, workdir = argv[0], fv["workdir"].value
  flags_lib.check_output_dir(prog, "workdir", workdir, fv["overwrite"].value)
  from bindjax.frozen.geometry import analysis  # pylint: disable=g-import-not-at-top
  from bindjax.frozen.geometry import config as config_lib  # pylint: disable=g-import-not-at-top
  with flags_lib.usage_errors(prog):
    settings = config_lib.from_flags(fv)
  with flags_lib.run_errors(prog):
    results, path = analysis.decompose(settings, fv["embeddings"].value, workdir)
  fits = results["fits"]
  print(f"{path}: R² object model {fits['object']['r2_all']:.4f}, concept model "
        f"{fits['concept']['r2_all']:.4f}; " + ", ".join(
            f"{b} {results['reconstructions'][b]['r2']:.4f}" for b in results["banks"]))
  for name, run in results["subtraction"].items():
    print(f"  {name:24s} test concept acc {run['test']['concept_acc']:.3f}  "
          f"object acc {run['test']['object_acc']:.3f}")
  return 0
