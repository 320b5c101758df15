"""bindjax.training.train: config validation, schedule, per-replica optimiser, purity and
learning."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bindjax.base import errors
from bindjax.commands import flags
from bindjax.commands import main as cli
from bindjax.core import objectives
from bindjax.core import scenes
from bindjax.frozen import extract
from bindjax.runtime import xla_options
from bindjax.training import grid
from bindjax.training import run_spec
from bindjax.training import sweep
from bindjax.training import train
from bindjax.workdir import layout

PRESETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "experiments", "train.py")


def _tiny_config(**overrides):
  """experiments/train.py:tiny (loaded as --config loads it), with dotted-path overrides."""
  c = flags.load_config(f"{PRESETS}:tiny")
  c.unlock()
  c.update_from_flattened_dict(overrides)
  return c


def _leaf(tree, path):
  for entry in path:
    tree = tree[entry.key]
  return tree


def _compile(fn, *args):
  return jax.jit(fn).lower(*args).compile(
      xla_options.compiler_options(jax.default_backend(), fast_compile=True))


@pytest.mark.parametrize("path,value,match", [
    ("model.num_heads", 3, r"num_heads=3.*divisor of d_model=32"),
    ("model.d_out", 0, r"d_out=0"),
    ("model.variant", "post_ln", r"variant='post_ln'"),
    ("coverage", 0.0, r"config\.coverage=0\.0.*\(0\.0, 1\.0\]"),
    ("coverage", 1.5, r"config\.coverage=1\.5"),
    ("optimizer.learning_rate", -1e-3, r"config\.optimizer\.learning_rate=-0\.001"),
    ("optimizer.weight_decay", float("nan"), r"config\.optimizer\.weight_decay=nan"),
    ("optimizer.warmup_fraction", 1.0, r"warmup_fraction=1\.0"),
    ("num_steps", 0, r"config\.num_steps=0"),
    ("eval.batches", 0, r"config\.eval\.batches=0"),
    ("space.max_objects", 0, r"config\.space"),
    ("sampler.batch_size", 0, r"config\.sampler.*batch_size"),
])
def test_config_errors_name_field_and_value(path, value, match):
  with pytest.raises(ValueError, match=match):
    run_spec.RunSpec.from_config(_tiny_config(**{path: value}))


def test_missing_field_is_named():
  c = _tiny_config()
  del c.eval["batches"]
  with pytest.raises(ValueError, match=r"config\.eval\.batches is missing"):
    run_spec.RunSpec.from_config(c)


@pytest.mark.parametrize("path,value,match", [
    ("sweep.chunk_size", "half", r"config\.sweep\.chunk_size='half'"),
    ("sweep.num_data", 0, r"config\.sweep\.num_data=0"),
    ("sweep.memory_fraction", 0.0, r"config\.sweep\.memory_fraction=0\.0.*\(0\.0, 1\.0\]"),
    ("sweep.cpu_devices", -2, r"config\.sweep\.cpu_devices=-2"),
    ("sweep.packing", "tight", r"config\.sweep\.packing='tight'"),
    ("log_every", 0, r"config\.log_every=0"),
    ("checkpoint.every", 0, r"config\.checkpoint\.every=0"),
    ("checkpoint.keep", 0, r"config\.checkpoint\.keep=0"),
])
def test_loop_setting_errors_name_field_and_value(path, value, match):
  with pytest.raises(ValueError, match=match):
    run_spec.LoopSpec.from_config(_tiny_config(**{path: value}))


def test_loop_settings_are_parsed_into_their_types():
  settings = run_spec.LoopSpec.from_config(_tiny_config(**{"sweep.chunk_size": "none"}))
  assert settings.chunk_size is None and settings.keep_best is True
  settings = run_spec.LoopSpec.from_config(_tiny_config(**{"sweep.chunk_size": "3"}))
  assert settings.chunk_size == 3


def test_a_bad_loop_setting_is_refused_before_the_workdir_is_touched(tmp_path):
  workdir = tmp_path / "never_written"
  with pytest.raises(errors.ConfigError, match=r"config\.sweep\.memory_fraction=1\.5"):
    sweep.run_single(_tiny_config(**{"sweep.memory_fraction": 1.5}), workdir, progress=False)
  assert not workdir.exists()


def test_spec_is_hashable_and_static():
  a = run_spec.RunSpec.from_config(_tiny_config())
  b = run_spec.RunSpec.from_config(_tiny_config(coverage=0.5, seed=3))
  assert hash(a) == hash(b) and a == b   # coverage and seed are per-replica arrays, not static
  assert a.warmup_steps == 90                  # warm-up fraction 0.3 of 300 steps


def test_schedule_warmup_then_linear_decay():
  mult = lambda s: float(train.learning_rate_multiplier(s, 100, 10))
  assert mult(0) == 0.0                       # the first update uses learning rate 0
  np.testing.assert_allclose([mult(5), mult(10), mult(55), mult(99), mult(100), mult(120)],
                             [0.5, 1.0, 0.5, 1 / 90, 0.0, 0.0], rtol=1e-5)  # float32
  # No warm-up: starts at the peak.
  assert float(train.learning_rate_multiplier(0, 100, 0)) == 1.0


@pytest.mark.parametrize("num_steps,warmup", [(100, 10), (300, 90), (7, 0), (1, 0), (50, 49)])
def test_traced_schedule_is_the_rounded_exact_ratio(num_steps, warmup):
  """With the lengths as traced data, every value is the exact fraction and optax's warm-up +
  linear decay, both to within float32 rounding."""
  steps = np.arange(-1, num_steps + 3)
  traced = np.asarray(jax.jit(train.learning_rate_multiplier)(
      jnp.asarray(steps, jnp.int32), jnp.int32(num_steps), jnp.int32(warmup)))
  decay = max(num_steps - warmup, 1)
  exact = np.where(steps < warmup, np.clip(steps, 0, None) / max(warmup, 1),
                   (decay - np.clip(steps - warmup, 0, decay)) / decay)
  np.testing.assert_allclose(traced, exact, rtol=0, atol=1.2e-7)
  oracle = optax.join_schedules(
      [optax.linear_schedule(0.0, 1.0, warmup), optax.linear_schedule(1.0, 0.0, decay)],
      [warmup])
  np.testing.assert_allclose(traced, jax.jit(oracle)(jnp.asarray(steps, jnp.int32)),
                             rtol=0, atol=2e-7)


def _plain_adamw(lr, wd, num_steps, warmup):
  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup), optax.linear_schedule(lr, 0.0, num_steps - warmup)],
      [warmup])
  return optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=wd)


def test_per_replica_arrays_equal_plain_optimiser():
  """Per-replica lr/wd arrays (vmapped) give exactly what optax.adamw with constants gives."""
  spec = run_spec.RunSpec.from_config(_tiny_config(num_steps=20))
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "tau": jnp.float32(1.15)}
  grads = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
           for _ in range(6)]
  settings = [(1e-2, 0.1), (3e-3, 0.0)]

  inputs = run_spec.inputs_from_config(_tiny_config(num_steps=20), spec)[0]

  def run_arrays(lr_R, wd_R):
    def one(lr, wd):
      tx = train.make_optimizer(spec, inputs.replace(learning_rate=lr, weight_decay=wd))
      p, state = params, tx.init(params)
      for g in grads:
        updates, state = tx.update(g, state, p)
        p = optax.apply_updates(p, updates)
      return p
    return jax.vmap(one)(lr_R, wd_R)

  stacked = jax.jit(run_arrays)(jnp.array([s[0] for s in settings], jnp.float32),
                                jnp.array([s[1] for s in settings], jnp.float32))
  for r, (lr, wd) in enumerate(settings):
    tx = _plain_adamw(lr, wd, spec.num_steps, spec.warmup_steps)
    p, state = params, tx.init(params)
    for g in grads:
      updates, state = tx.update(g, state, p)
      p = optax.apply_updates(p, updates)
    for name in params:
      np.testing.assert_allclose(stacked[name][r], p[name], rtol=1e-6, atol=1e-7)
  # Weight decay reaches τ too: with zero gradients only decay moves it (after warm-up starts).
  tx = train.make_optimizer(spec, inputs.replace(learning_rate=jnp.float32(1e-2),
                                                 weight_decay=jnp.float32(0.1)))
  state = tx.init(params)
  zero = jax.tree.map(jnp.zeros_like, params)
  _, state = tx.update(zero, state, params)
  updates, _ = tx.update(zero, state, params)
  lr1 = 1e-2 * 1 / spec.warmup_steps
  np.testing.assert_allclose(updates["tau"], -lr1 * 0.1 * 1.15, rtol=1e-5)


def test_train_step_is_pure_and_vmaps_like_single_replicas():
  """Two replicas (different coverage, seed, lr) vmapped == each run alone; no hidden state."""
  config = _tiny_config(num_steps=10, coverage=0.75)
  spec = run_spec.RunSpec.from_config(config)
  replica_inputs = []
  for seed, coverage, lr in ((0, 0.75, 1e-2), (1, 0.5, 3e-3)):
    config.seed, config.coverage, config.optimizer.learning_rate = seed, coverage, lr
    replica_inputs.append(run_spec.inputs_from_config(config, spec)[0])
  stacked = jax.tree.map(lambda *x: np.stack(x), *replica_inputs)

  def one_step(inputs):
    # Three steps: the optimiser's schedule counts its own updates, and the first has learning
    # rate 0, so two of them move the weights.
    state = train.init(inputs.key, spec, inputs)
    for _ in range(3):
      state, metrics = train.train_step(state, inputs, spec)
    return state.params, metrics

  vmapped = _compile(jax.vmap(one_step), stacked)(stacked)
  single = _compile(one_step, replica_inputs[0])
  d = spec.model.d_model
  for r, inputs in enumerate(replica_inputs):
    params, metrics = single(inputs)
    for path, a in jax.tree_util.tree_leaves_with_path(params):
      b = _leaf(vmapped[0], path)[r]
      if "qkv" in jax.tree_util.keystr(path) and "bias" in jax.tree_util.keystr(path):
        # The key bias has a zero gradient in exact arithmetic (softmax is shift-invariant), so
        # its update is Adam-normalised rounding noise: compare only the query/value biases.
        a, b = np.concatenate([a[:d], a[2 * d:]]), np.concatenate([b[:d], b[2 * d:]])
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6, err_msg=jax.tree_util.keystr(path))
    np.testing.assert_allclose(metrics["loss"], vmapped[1]["loss"][r], rtol=2e-5)
  init = train.init(replica_inputs[0].key, spec, replica_inputs[0]).params
  trained = single(replica_inputs[0])[0]
  assert all(not np.array_equal(a, b)
             for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(trained)))
  again = single(replica_inputs[0])
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(again[0]),
                                                    jax.tree.leaves(single(replica_inputs[0])[0])))
  # Replicas with different seeds saw different data and init.
  assert not np.allclose(vmapped[1]["loss"][0], vmapped[1]["loss"][1])


def _two_object_accuracy_by_kind(params, spec, inputs, key, batch_size=1024):
  """Accuracy on 2-object training scenes (every object a query) by objectives.two_object_binding
  kind: "share" (value-sharing or equal objects: no binding needed), "ambiguous" (binding
  needed) and "ambiguous_bag" (ambiguous scenes right up to binding)."""
  space = spec.space
  sampler = scenes.SamplerConfig(batch_size=batch_size, max_positive_queries=space.num_objects)
  batch = scenes.sample_batch(key, inputs.permutation_O, inputs.num_train, space=space,
                              sampler=sampler, split="train")
  assert int(batch.object_query_mask_Qo.sum()) == space.num_objects   # every object a query
  out = train.forward(params, batch, spec.model, spec.model.eval_logit_cap)
  kinds = {k: np.asarray(v) for k, v in objectives.two_object_binding(
      out["object_logits_BxQ"], batch.object_labels_BxQo, batch.object_query_mask_Qo,
      batch.object_query_ids_Qo, batch.objects_BxKxC, batch.num_objects_B, space).items()}
  correct = np.asarray(out["object_correct_B"])
  return {"share": correct[kinds["share"] | kinds["same"]].mean(),
          "ambiguous": correct[kinds["ambiguous"]].mean(),
          "ambiguous_bag": kinds["bag"].sum() / kinds["ambiguous"].sum()}


def test_tiny_model_learns_and_coverage_one_reports_training_objects(tmp_path):
  """C=2, V=4, K=2, d_model 32, 1 layer, coverage 1: the run loop learns the training objects.

  Everything but binding, that is. In 2-object scenes whose objects differ in both concepts
  ({a0 a1, b0 b1}: 9/16 of them at V=4) the scene holds the same tokens as the cross pair
  {a0 b1, b0 a1}; telling them apart is binding, and this dual encoder does not learn it: over
  8 seeds it gets those scenes right 20-30% of the time (1/6 if the 2 positives and the 2 cross
  objects tied), so training object accuracy plateaus at ~0.8 (1-object scenes and value-sharing
  pairs 1.0). No setting within C=2, V=4, K=2, d_model 32, 1 layer fixes it: heads 1-8,
  lr 3e-3..3e-2, warm-up, batch 32-256, d_ff 64-512, d_out 32, dot/cosine, tau, "clip", 1,000
  or 10,000 steps: none gets above 0.84 (nor d_model 128, nor 2 layers at d_model 32). The
  blocker is the query tower: its object embeddings stay additive (R² 0.999 of a_{v0} + b_{v1}),
  and with additive queries q_a0a1 - q_a0b1 = -(q_b0b1 - q_b0a1), so no scene embedding can
  rank both positives of an ambiguous scene above both cross objects. The same scene tower with
  free per-object query vectors binds within 1,000 steps; the 2-layer d_model-64 preset
  (experiments/train.py:cpu) binds by 2,000 steps (query R² 0.55-0.86). Evidence, commands:
  experiments/studies/tiny_binding_{probe,readout}.py (results in
  experiments/studies/results/tiny_binding/).
  """
  config = _tiny_config()
  final = sweep.run_single(config, tmp_path, progress=False, log=lambda *a: None)
  assert final["step"] == 300 and not final["diverged"]
  assert final["heldout/uses_training_objects"] == 1.0      # no held-out set at coverage 1
  assert final["heldout/object_active_fraction"] > 0.9      # scenes of training objects
  assert final["train/concept_accuracy"] > 0.9
  assert final["train/object_accuracy_1obj"] > 0.9
  assert final["train/object_accuracy"] > 0.7               # ~0.8: see the docstring
  rows = layout.Workdir(tmp_path).read_rows()
  assert [r["step"] for r in rows] == [100, 200, 300]
  assert [r["kind"] for r in rows] == ["train", "train", "eval"]   # eval every 300
  assert dict(rows[-1], diverged=False) == final
  assert rows[-1]["loss"] < rows[0]["loss"]

  # The trained parameters: 2-object scenes are right whenever binding is not needed, and the
  # ambiguous ones are right up to binding (positives above every non-cross negative).
  trained = extract.load_workdir(tmp_path, "latest")
  assert trained.step == 300
  spec = run_spec.RunSpec.from_config(config)
  inputs, _ = run_spec.inputs_from_config(config, spec)
  by_kind = _two_object_accuracy_by_kind(trained.params, spec, inputs, jax.random.key(1))
  assert by_kind["share"] > 0.95, by_kind
  assert by_kind["ambiguous_bag"] > 0.95, by_kind


def test_finished_run_is_reported_and_left_alone(tmp_path):
  config = _tiny_config(num_steps=4, **{"eval.every": 2, "log_every": 2,
                                        "checkpoint.every": 2})
  first = sweep.run_single(config, tmp_path, progress=False, log=lambda *a: None)
  before = {p: os.path.getmtime(os.path.join(d, p)) for d, _, names in os.walk(tmp_path)
            for p in names}
  logged = []
  again = sweep.run_single(config, tmp_path, progress=False, log=logged.append)
  assert again == first and any("is finished" in line for line in logged)
  assert before == {p: os.path.getmtime(os.path.join(d, p)) for d, _, names in os.walk(tmp_path)
                    for p in names}


def test_non_finite_run_stops_and_the_command_exits_1(tmp_path, capsys):
  config = _tiny_config(num_steps=6, **{"optimizer.learning_rate": 1e38,
                                        "optimizer.warmup_fraction": 0.0, "eval.every": 3,
                                        "log_every": 1, "checkpoint.every": 3})
  final = sweep.run_single(config, tmp_path / "lib", progress=False, log=lambda *a: None)
  assert final["diverged"] and final["diverged_step"] == 1
  rows = layout.Workdir(tmp_path / "lib").read_rows()
  assert [r["kind"] for r in rows] == ["diverged"]   # stopped at once, not trained to the end
  assert extract.load_workdir(tmp_path / "lib", "latest").step == 0   # the last finite state
  with pytest.raises(SystemExit) as e:
    cli.main(["train", f"--config={PRESETS}:tiny", f"--workdir={tmp_path / 'cli'}",
              "--config.num_steps=6", "--config.optimizer.learning_rate=1e38",
              "--config.optimizer.warmup_fraction=0.0", "--config.eval.every=3",
              "--noprogress"])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 1 and err[-1].startswith("bindjax train: the run diverged")


def test_workdir_of_a_different_run_is_refused(tmp_path):
  sweep.run_single(_tiny_config(seed=1, num_steps=2, **{"eval.every": 2, "log_every": 2,
                                                        "checkpoint.every": 2}),
                   tmp_path, progress=False, log=lambda *a: None)
  with pytest.raises(ValueError, match=r"different config \(.*seed: 1 -> 0"):
    sweep.run_single(_tiny_config(num_steps=2, **{"eval.every": 2, "log_every": 2,
                                                  "checkpoint.every": 2}),
                     tmp_path, progress=False, log=lambda *a: None)


def test_single_run_config_is_a_one_replica_grid():
  config = _tiny_config(coverage=0.5, seed=3)
  replicas, buckets = grid.expand_grid(grid.single_run_config(config))
  (replica,) = replicas
  assert (replica.coverage, replica.seed, replica.space_size) == (0.5, 3, 16)
  inputs, split = run_spec.inputs_from_config(config, run_spec.RunSpec.from_config(config))
  np.testing.assert_array_equal(buckets[0].members[0].inputs.permutation_O, inputs.permutation_O)
  assert buckets[0].members[0].split.num_train == split.num_train
  with pytest.raises(ValueError, match="config.grid is set"):
    grid.single_run_config(grid.single_run_config(config))
