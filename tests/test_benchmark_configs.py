"""The benchmarks' grids build the models their names say."""
import argparse
import importlib.util
import os

from bindjax.training import grid

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
  args = argparse.Namespace(sizes=[4], concepts=2, models=sorted(bench.MODELS), seeds=1,
                            learning_rates=[1e-3], weight_decays=[0.1], swaps_per_scene=1,
                            steps=10, eval_every=5, fast_compile=False)
  _, buckets = grid.expand_grid(bench.make_config(args))
  readouts = {b.replicas[0].model: b.spec.model.product_readout for b in buckets}
  assert readouts == {name: ("none" if "product" not in name else
                             "query" if name.endswith("query") else "both")
                      for name in bench.MODELS}, readouts


def test_learning_time_law_recovers_a_planted_power_and_checks_the_sizes_left_out():
  """steps = 50·|O|^1.5 planted at three sizes comes back; a size not reached within fewer
  steps than the law predicts is consistent with it, one not reached within more contradicts."""
  bench = _benchmark("binding_learning_time")
  table = [{"model": "m", "space_size": n, "steps_to_target": 50 * n ** 1.5, "final_step": 1e6}
           for n in (16, 36, 64)]
  table += [{"model": "m", "space_size": 100, "steps_to_target": None, "final_step": 40000},
            {"model": "m", "space_size": 100, "steps_to_target": None, "final_step": 60000},
            {"model": "alone", "space_size": 16, "steps_to_target": 10, "final_step": 100}]
  laws = bench.fit_laws(table, extrapolate=(400,))
  assert list(laws) == ["m"]   # one size reached: no law
  law = laws["m"]
  assert abs(law["a"] - 50) < 1e-6 and abs(law["b"] - 1.5) < 1e-9
  assert abs(law["extrapolated"]["400"] - 50 * 400 ** 1.5) < 1e-3
  assert [round(m["predicted"]) for m in law["not_reached"]] == [50000, 50000]
  text = bench.markdown({"target": 0.9, "command": "c", "wall_seconds": None, "devices": "d",
                         "table": [], "laws": laws})
  assert "not reached by step 40,000, which is consistent with it" in text
  assert "not reached by step 60,000, which contradicts it" in text


def test_learning_time_runs_c_concepts_and_keeps_each_c_its_own_law():
  """--concepts=3 expands to C = 3 spaces; a law in |O| is fitted within one C, so |O| = 64 at
  C = 2 and C = 3 are two configurations."""
  bench = _benchmark("binding_learning_time")
  args = argparse.Namespace(sizes=[4, 5], concepts=3, models=["cpu"], seeds=1,
                            learning_rates=[3e-3], weight_decays=[0.03], swaps_per_scene=1,
                            steps=10, eval_every=5, fast_compile=False)
  _, buckets = grid.expand_grid(bench.make_config(args))
  assert sorted(b.replicas[0].space_size for b in buckets) == [64, 125]
  table = [{"model": "m", "concepts": c, "space_size": n, "steps_to_target": scale * n,
            "final_step": 1e6} for c, scale, sizes in ((2, 10, (16, 64)), (3, 5, (27, 64)))
           for n in sizes]
  laws = bench.fit_laws(table, extrapolate=(100,))
  assert sorted(laws) == ["m", "m, C = 3"]
  assert [round(law["extrapolated"]["100"]) for law in laws.values()] == [1000, 500]


def test_learning_time_laws_keep_optimiser_settings_apart():
  """Two learning rates of one model are two configurations, each with its own law."""
  bench = _benchmark("binding_learning_time")
  table = [{"model": "m", "learning_rate": lr, "weight_decay": 0.1, "space_size": n,
            "steps_to_target": scale * n, "final_step": 1e6}
           for lr, scale in ((1e-3, 10), (3e-3, 5)) for n in (16, 36)]
  laws = bench.fit_laws(table, extrapolate=(100,))
  assert sorted(laws) == ["m (lr 0.001, wd 0.1)", "m (lr 0.003, wd 0.1)"]
  assert [round(law["extrapolated"]["100"]) for law in laws.values()] == [1000, 500]


def test_preset_wall_time_pays_start_and_end_once_and_steps_at_the_window_rate(tmp_path,
                                                                              monkeypatch):
  """A planted run (40 s before the first rows, 0.25 s a step, 9 s after the last rows) splits
  back into its parts; the newest complete row is read past a half-written one."""
  monkeypatch.syspath_prepend(os.path.join(REPO, "experiments", "benchmarks"))  # its `repeats`
  bench = _benchmark("preset_wall_time")
  seen = {step: 40 + 0.25 * (step - 100) for step in range(100, 1100, 100)}
  wall = seen[1000] + 0.25 * 100 + 9
  before, per_step, after = bench.split_run(seen, wall, 100, 1000)
  assert (before, per_step, after) == (40, 0.25, 34)
  # The planted run of 1,100 steps, and one of 10,000 at the same rate and fixed costs.
  assert bench.full_run_estimate(before, per_step, after, 1100 - 1000 + 100, 1100) == wall
  assert bench.full_run_estimate(before, per_step, after, 200, 10000) == 40 + 0.25 * 9800 + 9 + 25
  results = tmp_path / "results.jsonl"
  results.write_text('{"step": 100}\n{"step": 200}\n{"step": 3')
  assert bench.newest_step(str(results)) == 200
  assert bench.newest_step(str(tmp_path / "missing.jsonl")) == 0
