"""The geometry analyses as library runs: read a set, compute, write the results in a workdir.

Each run takes the typed geometry settings (`bindjax.frozen.geometry.config.GeometryConfig`, which a
command reads from its --config), the embedding set's path and the output directory. A setting
the set cannot serve by its nature (such as an unknown bank or quadruple) raises
errors.ConfigError, unreadable input ValueError; nothing is written before everything is
checked (docs/cli.md).
"""
import os

from bindjax.base import errors
from bindjax.base import files
from bindjax.frozen import embeddings
from bindjax.frozen.geometry import config as config_lib
from bindjax.frozen.geometry import decomposition
from bindjax.frozen.geometry import interventions
from bindjax.frozen.geometry import mds


def decompose(settings, embeddings_path, workdir):
  """Additive decomposition and subtraction suite; writes workdir/decomposition.json."""
  embedding_set = embeddings.read_embeddings(embeddings_path)
  results = decomposition.run_decomposition(embedding_set, settings.decomposition)
  results["dataset"], results["model"] = config_lib.run_labels(settings, embedding_set,
                                                               embeddings_path)
  path = decomposition.write_decomposition(workdir, results, overwrite=True)
  return results, path


def intervene(settings, embeddings_path, workdir):
  """Object-replacement interventions; writes the summary and the cases to workdir."""
  embedding_set = embeddings.read_embeddings(embeddings_path)
  summary, rows = interventions.run_interventions(embedding_set, settings.interventions)
  summary["dataset"], summary["model"] = config_lib.run_labels(settings, embedding_set,
                                                               embeddings_path)
  interventions.write_interventions(workdir, summary, rows, overwrite=True)
  return summary


def mds_quadruples(settings, embeddings_path, workdir, quadruples=()):
  """MDS of each quadruple (`quadruples`, else settings.mds.quadruples); writes per-quadruple
  JSON and figures and a grid figure. Returns [(json path, result)]."""
  from bindjax.reporting.plots import mds as mds_plots  # pylint: disable=g-import-not-at-top
  config = settings.mds
  specs = list(quadruples) or [q for q in config.quadruples if q.strip()]
  if not specs:
    raise errors.ConfigError("no quadruple given: pass --quadruple=attribute_a,attribute_b,"
                             "shape_x,shape_y (or set --config.mds.quadruples)")
  embedding_set = embeddings.read_embeddings(embeddings_path)
  with errors.config_errors():
    parsed = [mds.parse_quadruple(embedding_set, s, config) for s in specs]
    ctx = mds.context(embedding_set, config)
    results = [mds.run_mds(embedding_set, q, ctx=ctx) for q in parsed]
  written = []
  for quadruple, result in zip(parsed, results):
    stem = os.path.join(workdir, "mds_" + quadruple.label(
        embedding_set, config.attribute_concept, config.shape_concept))
    files.write_json(stem + ".json", result, indent=1)
    mds_plots.plot_quadruple(result, stem + ".png")
    written.append((stem + ".json", result))
  mds_plots.plot_grid(results, os.path.join(workdir, "mds_grid.png"))
  return written
