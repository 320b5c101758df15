"""`bindjax mds --embeddings=DIR --workdir=OUT --quadruple=red,blue,cube,sphere [...]`.

For each quadruple (two attributes, two shapes; value names or indices) writes
OUT/mds_<quadruple>.json (points, cosine distances, 3-D coordinates, stress) and .png, and
OUT/mds_grid.png over all of them (docs/geometry.md#mds). Nothing is written when a flag, the
config or the input is rejected.
"""
import os

from absl import flags

from bindjax.commands import flags as flags_lib
from bindjax.commands import geometry_flags


def main(argv):
  """Runs the command; returns 0 (errors exit with the statuses of bindjax.commands.flags)."""
  fv = geometry_flags.new_flag_values()
  flags.DEFINE_multi_string("quadruple", None, "attribute_a,attribute_b,shape_x,shape_y "
                            "(repeatable; default: the config's mds.quadruples tuple)",
                            flag_values=fv)
  geometry_flags.parse(fv, argv, __doc__)
  prog, workdir = argv[0], fv["workdir"].value
  flags_lib.check_output_dir(prog, "workdir", workdir, fv["overwrite"].value)
  from bindjax.frozen.geometry import analysis  # pylint: disable=g-import-not-at-top
  from bindjax.frozen.geometry import config as config_lib  # pylint: disable=g-import-not-at-top
  with flags_lib.usage_errors(prog):
    settings = config_lib.from_flags(fv)
  with flags_lib.run_errors(prog):
    written = analysis.mds_quadruples(settings, fv["embeddings"].value, workdir,
                                      fv["quadruple"].value or ())
  for path, result in written:
    print(f"{path}: stress {result['stress']:.4g} (stress-1 {result['stress_1']:.3f}); "
          "sum→composite cosine distances " +
          ", ".join(f"{d:.4f}" for d in result["sum_to_composite_cosine_distance"]))
  print(f"wrote {os.path.join(workdir, 'mds_grid.png')}")
  return 0
