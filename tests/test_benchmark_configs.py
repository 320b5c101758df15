"""The benchmarks' grids build the models their names say."""
import argparse
import importlib.util
import os

from bindjax import grid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _benchmark(name):
  path = os.path.join(REPO, "experiments", "benchmarks", f"{name}.py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_learning_time_models_have_the_read_out_their_names_say():
  """A grid model sets only the fields it lists, over the cpu preset's product read-out: a
  model without "product" in its name must have none."""
  bench = _benchmark("binding_learning_time")
  args = argparse.Namespace(sizes=[4], models=sorted(bench.MODELS), seeds=1, learning_rate=1e-3,
                            steps=10, eval_every=5)
  _, buckets = grid.expand_grid(bench.make_config(args))
  readouts = {b.replicas[0].model: b.spec.model.product_readout for b in buckets}
  assert readouts == {name: ("none" if "product" not in name else
                             "query" if name.endswith("query") else "both")
                      for name in bench.MODELS}, readouts
