"""`bindjax interventions --embeddings=DIR --workdir=OUT [--config=experiments/geometry.py:ARG]`.

Object-replacement interventions: in a 2-object scene, recolour one object by subtracting its
object vector and adding the vector of the recoloured object (times an edit strength k), then
check that the nearest scene is the scene that really holds the recoloured object. Object
vectors come from a bank: obj-avg (the mean of the scenes holding the object; the original's
position-independent bank, averaged over slot occurrences), pos-avg (the mean per slot; the
original's position-dependent bank) or single-object scenes. Writes
OUT/interventions_summary.json and OUT/interventions_cases.jsonl; a non-empty OUT is refused
unless --overwrite, and nothing is written when a flag, the config or the input is rejected.

Config fields: interventions.banks (a tuple of bank names; empty: every bank the set supports),
interventions.strengths (a tuple of k), interventions.attribute_concept / shape_concept,
interventions.seed, target_draws, pool, tie_tolerance, interventions.probes (auto | stored | fit |
none: probe vectors that also score the edited embeddings), interventions.probes_file (a probes.npz
of `bindjax probe`, instead of fitting), obj_avg_counting (occurrences as the original, or scenes),
probe.* (probe fitting).
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
    summary = analysis.intervene(settings, fv["embeddings"].value, workdir)
  print(f"{workdir}: {summary['num_cases']} cases from "
        f"{summary['num_scenes_with_different_shapes']} scenes with two different shapes")
  for bank, result in summary["results"].items():
    skipped = sum(result["skipped"].values())
    for k, metrics in result["by_strength"].items():
      m = metrics["all"]
      probe = "" if m.get("probe") is None else f", probing {m['probe']:.3f}"
      print(f"  {bank:13s} k={k}: retrieval {_fmt(m['retrieval'])} over {m['cases']} cases "
            f"(ties {m['ties']}, order-insensitive {_fmt(m['retrieval_order_insensitive'])})"
            f"{probe}; skipped {skipped}")
  return 0


def _fmt(value):
  return "n/a" if value is None else f"{value:.3f}"
