"""The coordinate solver, the default fit of the additive and product families
(docs/complexity.md, "The coordinate solver" and "Identifiability")."""
import dataclasses
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bindjax.complexity import coordinate
from bindjax.complexity import data as data_lib
from bindjax.complexity import families
from bindjax.complexity import fit_settings
from bindjax.complexity import grid_fits
from bindjax.frozen.probes import linear
from bindjax.runtime import engine

# Planted draws and split seeds of these tests: used by no default, study or other test.
DRAW = 8100
SEEDS = (8200, 8201)
# Few evaluations: the solver evaluates once whatever the steps. Cheap compiles: these fits are
# small, and compiling them is most of their time.
CONFIG = fit_settings.FitConfig(steps=10, eval_every=10, fast_compile=True)


def per_object_hadamard(values, out_dim, noise, draw):
  """All ordered 2-object scenes, embedded as f(o₁) + f(o₂) + noise with
  f(o) = a₀[v₀] + a₁[v₁] + 2·b₀[v₀] ⊙ b₁[v₁] (a, b ~ N(0, 1))."""
  objects, ids = data_lib.all_scenes(values, 2)
  rng = np.random.default_rng(draw)
  a, b = (rng.normal(size=(2, max(values), out_dim)) for _ in range(2))
  per_object = a[0][objects[..., 0]] + a[1][objects[..., 1]] + 2 * (
      b[0][objects[..., 0]] * b[1][objects[..., 1]])
  targets = per_object.sum(1) + noise * rng.normal(size=(len(ids), out_dim))
  return objects, ids, targets


def make_data(values, objects, ids, targets):
  data, _ = data_lib.prepare(targets, objects, np.full(len(ids), 2), values, ids,
                             int(np.prod(values)))
  probes = linear.init_weights(jax.random.PRNGKey(0), values, int(np.prod(values)),
                               targets.shape[-1], linear.ProbeConfig())
  return data, probes


def fit(model, data, probes, fraction=0.7, seeds=SEEDS, splits=None, config=CONFIG):
  entries = [grid_fits.GridEntry(model, fraction, s, fit_settings.LEARNING_RATE,
                                 None if splits is None else splits[i])
             for i, s in enumerate(seeds)]
  rows, infos = grid_fits.fit_grid(entries, data, probes, config)
  return rows, infos


LEVENBERG_MARQUARDT = {"solver_projection": False}


@pytest.mark.parametrize("settings", [{}, LEVENBERG_MARQUARDT,
                                      dict(LEVENBERG_MARQUARDT, solver_screen=10)])
def test_default_fit_recovers_a_planted_per_object_set_at_d64(settings):
  """The per-object Hadamard set at D = 64 (noise 0.05): at the default settings (variable
  projection, 10 steps) the per_object_sum_product fit reaches its training scenes and predicts
  scenes of objects it never saw, on splits that identify the structure; so does Levenberg–
  Marquardt on all of θ in 30 steps, and with its starts screened after 10 of them, the
  cheapest alone going on."""
  values = (8, 8)
  objects, ids, targets = per_object_hadamard(values, 64, 0.05, DRAW)
  data, probes = make_data(values, objects, ids, targets)
  model = families.make("per_object_sum_product", values, 2, 64)
  rows, infos = fit(model, data, probes, config=dataclasses.replace(CONFIG, **settings))
  assert infos[0]["solver"] == "coordinate"
  projection = settings.get("solver_projection", True)
  assert (infos[0]["solver_projection"], infos[0]["solver_iterations"]) == (
      projection, 10 if projection else 30)
  report = [(r["final_train_only_r2"], r["final_test_only_r2"], r["identified_share"])
            for r in rows]
  print("per-object Hadamard set, (train-only R², test-only R², identified share):", report)
  for row in rows:
    assert row["identified"], report
    assert row["final_train_only_r2"] >= 0.99, report
    assert row["final_test_only_r2"] >= 0.9, report


def own_form(family, values, out_dim, draw):
  """Targets of every 2-object scene planted from `family` at E = D with its read-out the
  identity: the coordinate form the solver fits."""
  model = families.make(family, values, 2, out_dim)
  params = model.init(jax.random.PRNGKey(draw))
  eye = jnp.eye(out_dim)
  params["out"] = {"kernel": jnp.concatenate([eye, eye]) if family == "sum_product" else eye,
                   "bias": jnp.zeros(out_dim)}
  objects, ids = data_lib.all_scenes(values, 2)
  return model, objects, ids, np.asarray(model.apply(params, objects))


@pytest.mark.parametrize("projection", [False, True])
@pytest.mark.parametrize("family", sorted(coordinate.LAYOUT))
def test_default_fit_reaches_the_training_scenes_of_its_own_form(family, projection):
  """Train-only R² ≥ 0.99 for every family the solver fits, on scenes planted from its own
  coordinate form, by Levenberg–Marquardt on all of θ and by variable projection."""
  values = (5, 5)
  model, objects, ids, targets = own_form(family, values, 16, DRAW + 1)
  data, probes = make_data(values, objects, ids, targets)
  rows, _ = fit(model, data, probes,
                config=dataclasses.replace(CONFIG, solver_projection=projection))
  r2 = [r["final_train_only_r2"] for r in rows]
  print(family, "train-only R²:", r2)
  assert min(r2) >= 0.99, r2


def test_a_split_that_does_not_identify_the_structure_is_reported():
  """A split in which one value of concept 0 belongs to a single training object leaves that
  value's product entry free: the row says the fit is not identified, while a split seeing
  every value in several training objects is."""
  values = (6, 6)
  objects, ids, targets = per_object_hadamard(values, 16, 0.05, DRAW + 2)
  data, probes = make_data(values, objects, ids, targets)
  # Object id = v₀ + 6·v₁ (data_lib.all_scenes): train on every object but those with v₀ = 0,
  # except (0, 0).
  alone = [u for u in range(36) if u % 6 == 0 and u != 0]
  permutation = np.array([u for u in range(36) if u not in alone] + alone)
  rng = np.random.default_rng(DRAW + 3)
  full = rng.permutation(36)
  splits = [(permutation, 36 - len(alone)), (full, 30)]
  model = families.make("per_object_sum_product", values, 2, 16)
  rows, _ = fit(model, data, probes, splits=splits)
  assert rows[0]["identified"] is False and rows[0]["identified_share"] < 1.0
  assert rows[1]["identified"] is True
  assert rows[1]["final_test_only_r2"] >= 0.9


def test_the_global_product_starts_more_often_unless_told():
  assert fit_settings.FitConfig().for_family("product").solver_starts == 16
  assert fit_settings.FitConfig().for_family("sum_product").solver_starts == 8
  assert fit_settings.FitConfig(solver_starts=4).for_family("product").solver_starts == 4


def test_solver_setting_is_validated_naming_the_field():
  with pytest.raises(ValueError, match="solver="):
    fit_settings.FitConfig(solver="newton").validate()
  with pytest.raises(ValueError, match="solver_starts="):
    fit_settings.FitConfig(solver_starts=-1).validate()
  with pytest.raises(ValueError, match="solver_projection="):
    fit_settings.FitConfig(solver_projection="yes").validate()
  with pytest.raises(ValueError, match="solver_iterations="):
    fit_settings.FitConfig(solver_iterations=-1).validate()
  # Typed on the command line, a boolean arrives as a string.
  assert fit_settings.FitConfig(solver_projection="False").validate().solver_projection is False
  for screen in (-1, 31):
    with pytest.raises(ValueError, match="solver_screen="):
      fit_settings.FitConfig(solver_screen=screen, solver_iterations=30).validate()
  mlp = families.make("mlp", (3, 3), 2, 8, widths=(4,))
  assert fit_settings.FitConfig().solver_for(mlp) == "adam"
  with pytest.raises(ValueError, match="solver='coordinate'"):
    fit_settings.FitConfig(solver="coordinate").solver_for(mlp)


def test_batched_fits_with_own_targets_equal_separate_fits():
  """Several sets fitted in one vmapped batch (fit_grid's `own`, each on its own split) give
  each set's rows as if it were fitted alone."""
  values = (4, 4)
  sets = [per_object_hadamard(values, 8, 0.05, DRAW + 10 + i) for i in range(3)]
  objects, ids = sets[0][:2]
  rng = np.random.default_rng(DRAW + 4)
  splits = [(rng.permutation(16), n) for n in (11, 12, 12)]
  model = families.make("per_object_sum_product", values, 2, 8)
  datas = [make_data(values, objects, ids, t)[0] for _, _, t in sets]
  probes = [linear.init_weights(jax.random.PRNGKey(k), values, 16, 8, linear.ProbeConfig())
            for k in range(3)]
  own = data_lib.own_targets(np.stack([t for _, _, t in sets]),
                             jax.tree_util.tree_map(lambda *x: np.stack(x), *probes))
  entries = [grid_fits.GridEntry(model, n / 16, 0, 1e-2, split=(p, n), own_index=i)
             for i, (p, n) in enumerate(splits)]
  together, infos = grid_fits.fit_grid(entries, datas[0], None, CONFIG,
                                       engine.auto_mesh(2, jax.devices()[:1]), None, own=own,
                                       pad_ratio=np.inf)
  assert [i["num_models"] for i in infos] == [3] and infos[0]["solver"] == "coordinate"
  for i, entry in enumerate(entries):
    (alone,), _ = grid_fits.fit_grid([grid_fits.GridEntry(model, entry.train_fraction, 0, 1e-2,
                                                          split=entry.split)],
                                   datas[i], probes[i], CONFIG)
    for key in ("final_train_loss", "identified_share", "final_test_only_r2",
                "final_train_only_r2"):
      np.testing.assert_allclose(together[i][key], alone[key], rtol=1e-3, atol=1e-4,
                                 err_msg=f"set {i} {key}")


def fit_many_objects(seeds=3):
  """Variable-projection fits of `per_object_product` on its own form at V = 20, D = 16."""
  values = (20, 20)
  model, objects, ids, targets = own_form("per_object_product", values, 16, DRAW + 1)
  data, probes = make_data(values, objects, ids, targets)
  # Compiled as a fit outside the tests is, where the hang was seen.
  rows, infos = fit(model, data, probes, fraction=0.5, seeds=range(SEEDS[0], SEEDS[0] + seeds),
                    config=dataclasses.replace(CONFIG, fast_compile=False))
  assert infos[0]["solver_projection"]
  return rows


@pytest.mark.slow
def test_projected_fits_of_many_objects_finish():
  """jaxlib 0.10's CPU LAPACK kernels block a thread of XLA's pool while their batch runs on the
  same pool, so two of them at once deadlock a 2-thread pool. The projection's one solve,
  independent of the starts' SVDs and steps, did that: this fit hung on 2 cores every time.
  Run in a child process, so that a deadlock fails the test instead of stalling the suite."""
  code = textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
      import test_coordinate_fits
      rows = test_coordinate_fits.fit_many_objects()
      print(min(r["final_train_only_r2"] for r in rows))
  """)
  # One CPU device, as a fit runs outside the tests (the hang was seen so).
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=600, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  assert float(done.stdout.split()[-1]) >= 0.99
