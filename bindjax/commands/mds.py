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
  from bindjax import embeddings  # pylint: disable=g-import-not-at-top
  from bindjax import files  # pylint: disable=g-import-not-at-top
  from bindjax.geometry import config as config_lib  # pylint: disable=g-import-not-at-top
  from bindjax.geometry import mds  # pylint: disable=g-import-not-at-top
  from bindjax.plots import mds as mds_plots  # pylint: disable=g-import-not-at-top
  with flags_lib.usage_errors(prog):
    cfg = config_lib.from_flags(fv).mds
    specs = fv["quadruple"].value or [q for q in cfg.quadruples if q.strip()]
    if not specs:
      raise ValueError("no quadruple given: pass --quadruple=attribute_a,attribute_b,shape_x,"
                       "shape_y (or set --config.mds.quadruples)")
    concepts = dict(attribute_concept=int(cfg.attribute_concept),
                    shape_concept=int(cfg.shape_concept))
  with flags_lib.input_errors(prog):
    embedding_set = embeddings.read_embeddings(fv["embeddings"].value)
  with flags_lib.usage_errors(prog):   # quadruples or bank the set cannot provide
    quadruples = [mds.parse_quadruple(embedding_set, s, **concepts) for s in specs]
    ctx = mds.context(embedding_set, str(cfg.bank), **concepts)
    results = [mds.run_mds(embedding_set, q, random_state=int(cfg.random_state),
                           n_init=int(cfg.n_init), ctx=ctx) for q in quadruples]
  grid_path = os.path.join(workdir, "mds_grid.png")
  for quadruple, result in zip(quadruples, results):
    stem = os.path.join(workdir, "mds_" + quadruple.label(embedding_set, **concepts))
    files.write_json(stem + ".json", files.to_jsonable(result), indent=1)
    mds_plots.plot_quadruple(result, stem + ".png")
    print(f"{stem}.json: stress {result['stress']:.4g} (stress-1 {result['stress_1']:.3f}); "
          "sum→composite cosine distances " +
          ", ".join(f"{d:.4f}" for d in result["sum_to_composite_cosine_distance"]))
  mds_plots.plot_grid(results, grid_path)
  print(f"wrote {grid_path}")
  return 0
