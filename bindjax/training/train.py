"""Training one dual encoder from scratch (docs/training.md): pure per-replica functions.

The functions are written for ONE replica and are pure, so the sweep vmaps them over a leading
replica axis:

  spec = RunSpec.from_config(config)          # the run's settings; spec.program sets the shapes
  inputs, split = inputs_from_config(config, spec)  # per-replica arrays (stack them to vmap)
  program = spec.program                      # hashable: one compile per program
  state = init(inputs.key, program, inputs)
  state, metrics = train_step(state, inputs, program)  # samples its batch from fold_in(data, step)
  metrics = eval_step(state.params, eval_key(inputs.key, step), inputs, program)

The schedule's length (num_steps and its warm-up) rides in `ReplicaInputs` as data, so runs that
differ only in their loop settings (steps, evaluation and logging cadence) share one compiled
program.

Randomness: a replica's root key (from its seed) splits into three streams by fold_in: 0 model
init, 1 training data (fold_in(·, step) per step), 2 evaluation (fold_in(·, step) per evaluation).

There is one training loop, `bindjax.training.sweep.run_sweep`; `bindjax train` runs a config without a
grid as a sweep of one replica (`grid.single_run_config`).
"""
import dataclasses
import math

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bindjax.core import models
from bindjax.core import objectives
from bindjax.core import scenes
from bindjax.core import world
from bindjax.runtime import parallel
from bindjax.workdir import results

INIT_STREAM, DATA_STREAM, EVAL_STREAM = 0, 1, 2


def default_config():
  """The published run's settings (docs/training.md); experiments/train.py derives its presets from it."""
  c = ml_collections.ConfigDict()
  c.space = ml_collections.ConfigDict(dict(num_concepts=2, num_values=20, max_objects=2))
  c.coverage = 0.8
  c.seed = 0
  # Seed of the coverage split's RandomState permutation (docs/world.md); -1 means "use `seed`".
  c.split_seed = -1
  # The model's and the sampler's defaults are those of their dataclasses. scan_layers, a
  # parameter layout that computes the same function, is no setting of a run.
  c.model = ml_collections.ConfigDict(
      _field_defaults(models.ModelConfig, leave_out=("scan_layers",)))
  c.sampler = ml_collections.ConfigDict(
      dict(batch_size=512, **_field_defaults(scenes.SamplerConfig)))
  c.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=3e-5, weight_decay=0.1, b1=0.9, b2=0.999, eps=1e-8, warmup_fraction=0.1))
  c.num_steps = 50_000
  c.eval = ml_collections.ConfigDict(dict(every=1000, batches=10, batch_size=512))
  c.log_every = 100
  # keep_best: also keep each replica's parameters at its best held-out object accuracy.
  c.checkpoint = ml_collections.ConfigDict(dict(every=1000, keep=3, keep_best=True))
  # How the loop runs (bindjax.training.sweep): chunk_size "auto", "none" (all replicas at once) or n at
  # a time; num_data devices per replica; fast_compile cheaper XLA compiles of slower code (tiny
  # models); cpu_devices -1 one single-threaded device per CPU core, 0 JAX's default CPU device;
  # packing "auto" buckets packed onto lanes of the devices when that keeps more of them busy,
  # "none" buckets one after another over all devices (bindjax.training.packing).
  c.sweep = ml_collections.ConfigDict(dict(
      chunk_size=parallel.AUTO, num_data=1, memory_fraction=parallel.DEFAULT_MEMORY_FRACTION,
      fast_compile=False, cpu_devices=0, packing="auto"))
  return c


def _field_defaults(cls, leave_out=()):
  """{name: default} of the fields of dataclass `cls` that have a default."""
  return {f.name: f.default for f in dataclasses.fields(cls)
          if f.default is not dataclasses.MISSING and f.name not in leave_out}


# --------------------------------------------------------------------------------------------
# Static settings and per-replica hyperparameters


def _field(config, path):
  node = config
  for part in path.split("."):
    try:
      node = node[part]
    except (KeyError, AttributeError, TypeError):
      raise ValueError(f"config.{path} is missing (see bindjax.training.train.default_config())") from None
  return node


def _int(config, path, minimum):
  value = _field(config, path)
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"config.{path}={value!r}: expected an integer >= {minimum}")
  return int(value)


def _float(config, path, low, high, low_open=False, high_open=False):
  value = _field(config, path)
  if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
    raise ValueError(f"config.{path}={value!r}: expected a number")
  value = float(value)
  ok = (not math.isnan(value) and (value > low if low_open else value >= low) and
        (value < high if high_open else value <= high))
  if not ok:
    interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    raise ValueError(f"config.{path}={value!r}: expected a number in {interval}")
  return value


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
  """The settings that shape a replica's compiled programs (hashable; a static jit argument).

  Replicas that share a ProgramSpec share one compiled train_step/eval_step; what varies between
  them (coverage, seed, learning rate, weight decay, the schedule's length) lives in
  `ReplicaInputs`.
  """
  space: world.ObjectSpace
  sampler: scenes.SamplerConfig        # training batches
  eval_sampler: scenes.SamplerConfig   # evaluation batches (eval_batch_size scenes)
  model: models.ModelConfig
  eval_batches: int
  adam_b1: float
  adam_b2: float
  adam_eps: float

  @property
  def program(self):
    return self


@dataclasses.dataclass(frozen=True)
class RunSpec(ProgramSpec):
  """A run's settings shared by its replicas: its program's, and the loop's (how many steps,
  how often it evaluates), which are not part of any compiled program.

  Every field is required: default_config() holds the defaults, once.
  """
  num_steps: int
  warmup_fraction: float
  eval_every: int

  @property
  def warmup_steps(self):
    return int(self.warmup_fraction * self.num_steps)

  @property
  def program(self):
    """The ProgramSpec part: what the compiled programs depend on."""
    return ProgramSpec(**{f.name: getattr(self, f.name)
                          for f in dataclasses.fields(ProgramSpec)})

  @classmethod
  def from_config(cls, config):
    """Builds and validates the static settings; also checks the per-replica ones.

    Raises ValueError naming the field, its value and what was expected, before anything is
    compiled.
    """
    space_values = _field(config, "space.num_values")
    num_concepts = _int(config, "space.num_concepts", 1)
    max_objects = _int(config, "space.max_objects", 1)
    try:
      space = world.ObjectSpace.create(
          tuple(space_values) if isinstance(space_values, (list, tuple)) else space_values,
          max_objects, num_concepts=num_concepts)
      space.check_enumerable("training (a permutation of all object ids)")
      if space.num_objects < 2:
        # With one object there is nothing to tell apart: every accuracy would be 1.
        raise ValueError(f"values_per_concept={list(space.values_per_concept)} gives "
                         f"|O| = {space.num_objects} object; expected at least 2 objects")
    except ValueError as e:
      raise ValueError(f"config.space: {e}") from None
    try:
      model = models.ModelConfig.for_space(space, **dict(_field(config, "model")))
    except (ValueError, TypeError) as e:
      raise ValueError(f"config.model: {e}") from None
    try:
      sampler = scenes.SamplerConfig(**dict(_field(config, "sampler")))
      eval_sampler = dataclasses.replace(
          sampler, batch_size=_int(config, "eval.batch_size", 1))
    except (ValueError, TypeError) as e:
      raise ValueError(f"config.sampler: {e}") from None
    spec = cls(
        space=space, sampler=sampler, eval_sampler=eval_sampler, model=model,
        num_steps=_int(config, "num_steps", 1),
        warmup_fraction=_float(config, "optimizer.warmup_fraction", 0.0, 1.0, high_open=True),
        eval_every=_int(config, "eval.every", 1),
        eval_batches=_int(config, "eval.batches", 1),
        adam_b1=_float(config, "optimizer.b1", 0.0, 1.0, high_open=True),
        adam_b2=_float(config, "optimizer.b2", 0.0, 1.0, high_open=True),
        adam_eps=_float(config, "optimizer.eps", 0.0, math.inf, low_open=True, high_open=True))
    # Per-replica and loop settings: checked here so a bad run fails before compiling.
    coverage = _float(config, "coverage", 0.0, 1.0, low_open=True)
    if coverage < 1.0 and space.num_objects < 2:
      raise ValueError(f"config.coverage={coverage}: a held-out set needs |O| >= 2, "
                       f"the space has {space.num_objects} object")
    check_hyper(learning_rate=_field(config, "optimizer.learning_rate"),
                weight_decay=_field(config, "optimizer.weight_decay"))
    _int(config, "seed", 0)
    _int(config, "split_seed", -1)
    for path in ("log_every", "checkpoint.every", "checkpoint.keep"):
      _int(config, path, 1)
    if not isinstance(_field(config, "checkpoint.keep_best"), bool):
      raise ValueError(f"config.checkpoint.keep_best={_field(config, 'checkpoint.keep_best')!r}: "
                       "expected True or False")
    return spec


def train_step_flops(spec):
  """Matmul FLOPs of one replica's train step (`models.tower_flops` of both towers, × 3 for the
  forward and backward passes)."""
  space, sampler, model = spec.space, spec.sampler, spec.model
  queries = sampler.num_concept_queries(space) + sampler.num_object_queries(space)
  forward = (models.tower_flops(model, sampler.batch_size, space.scene_length, tower="scene") +
             models.tower_flops(model, queries, space.query_length,
                                out_features=model.query_out_features, tower="query"))
  return 3 * forward


def check_hyper(*, learning_rate, weight_decay):
  """Raises ValueError unless learning_rate > 0 and weight_decay >= 0 (both finite)."""
  for name, value, low_open in (("optimizer.learning_rate", learning_rate, True),
                                ("optimizer.weight_decay", weight_decay, False)):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
      raise ValueError(f"config.{name}={value!r}: expected a number")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (low_open and value == 0):
      raise ValueError(f"config.{name}={value!r}: expected a finite number "
                       f"{'> 0' if low_open else '>= 0'}")


@flax.struct.dataclass
class ReplicaInputs:
  """What one replica's programs take besides their state, all arrays (stack along a leading
  axis to vmap replicas): its hyperparameters, its training objects and its root key."""
  learning_rate: jax.Array   # float32 [], peak learning rate
  weight_decay: jax.Array    # float32 []
  permutation_O: jax.Array   # int32 [|O|]; training objects are permutation_O[:num_train]
  num_train: jax.Array       # int32 []; == |O| means no held-out set (coverage 1)
  key: jax.Array             # uint32 [2], the replica's root PRNG key
  num_steps: jax.Array       # int32 [], the schedule's length (it decays to 0 there)
  warmup_steps: jax.Array    # int32 []


def make_inputs(split, *, seed, learning_rate, weight_decay, num_steps, warmup_steps):
  """ReplicaInputs of one replica from its coverage split, seed, optimiser settings and schedule
  length (numpy arrays)."""
  check_hyper(learning_rate=learning_rate, weight_decay=weight_decay)
  return ReplicaInputs(
      learning_rate=np.float32(learning_rate), weight_decay=np.float32(weight_decay),
      permutation_O=np.asarray(split.permutation, np.int32),
      num_train=np.int32(split.num_train),
      key=np.asarray(jax.random.key_data(jax.random.key(int(seed))), np.uint32),
      num_steps=np.int32(num_steps), warmup_steps=np.int32(warmup_steps))


def inputs_from_config(config, spec):
  """(ReplicaInputs, CoverageSplit) of the run described by `config` (docs/world.md coverage
  split)."""
  seed = _int(config, "seed", 0)
  split_seed = _int(config, "split_seed", -1)
  split = world.coverage_split(spec.space, _field(config, "coverage"),
                               seed if split_seed < 0 else split_seed)
  inputs = make_inputs(split, seed=seed,
                       learning_rate=_field(config, "optimizer.learning_rate"),
                       weight_decay=_field(config, "optimizer.weight_decay"),
                       num_steps=spec.num_steps, warmup_steps=spec.warmup_steps)
  return inputs, split


# --------------------------------------------------------------------------------------------
# Optimiser


def learning_rate_multiplier(step, num_steps, warmup_steps):
  """Schedule (docs/training.md): linear warm-up from 0 over `warmup_steps`, then linear decay to 0 at `num_steps`.

  The update at step t uses multiplier(t), so the very first update has learning rate 0. The
  lengths may be traced (per-replica data, so a new length needs no new program); optax's
  linear_schedule branches on its length in Python, so it cannot take a traced one. The two
  pieces are written out in the arithmetic XLA makes of optax's for a constant length (t / T
  becomes t · (1 / T)), so a sweep's updates are those of the constant-length program before.
  """
  step = jnp.asarray(step)
  warmup = jnp.asarray(warmup_steps, jnp.int32)
  decay = jnp.maximum(jnp.asarray(num_steps, jnp.int32) - warmup, 1)

  def fraction(count, length):   # clip(count, 0, length) / length
    return (jnp.clip(count, 0, length).astype(jnp.float32)
            * (1.0 / length.astype(jnp.float32)))

  # optax's (init - end) * (1 - fraction) + end: for 0 → 1 that is 1 - (1 - fraction), whose
  # rounding differs from the fraction's own.
  rising = 1 - (1 - fraction(step, jnp.maximum(warmup, 1)))
  falling = 1 - fraction(step - warmup, decay)
  return jnp.where(step < warmup, rising, falling)


def make_optimizer(spec, inputs):
  """AdamW (decoupled decay on every parameter, τ included) with the schedule of docs/training.md.

  Peak learning rate, weight decay and the schedule's length come from `inputs` and may be traced
  per-replica arrays: the optimiser state holds none of them, so its structure is the same for
  every replica. spec: the ProgramSpec (or RunSpec) giving Adam's b1, b2 and eps.
  """
  def schedule(count):
    return inputs.learning_rate * learning_rate_multiplier(count, inputs.num_steps,
                                                           inputs.warmup_steps)
  return optax.adamw(schedule, b1=spec.adam_b1, b2=spec.adam_b2, eps=spec.adam_eps,
                     weight_decay=inputs.weight_decay)


# --------------------------------------------------------------------------------------------
# Pure per-replica functions


@flax.struct.dataclass
class TrainState:
  step: jax.Array        # int32 [], number of updates done
  params: dict
  opt_state: optax.OptState
  key: jax.Array         # the replica's training-data stream


def _streams(key):
  return tuple(jax.random.fold_in(key, s) for s in (INIT_STREAM, DATA_STREAM, EVAL_STREAM))


def eval_key(key, step):
  """Key of the evaluation after `step` updates, from a replica's root key (vmappable)."""
  return jax.random.fold_in(_streams(key)[EVAL_STREAM], step)


def init(key, spec, inputs):
  """Fresh TrainState of one replica from its root key (usually inputs.key)."""
  init_key, data_key, _ = _streams(key)
  params = models.init_params(init_key, spec.model)
  opt_state = make_optimizer(spec, inputs).init(params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state,
                    key=data_key)


def _sample(key, permutation_O, num_train, spec, sampler, split, scene_sharding=None):
  batch = scenes.sample_batch(key, permutation_O, num_train, space=spec.space, sampler=sampler,
                              split=split)
  if scene_sharding is None:
    return batch
  return batch.map_per_scene(lambda x: jax.lax.with_sharding_constraint(x, scene_sharding))


def forward(params, batch, config, cap):
  """Losses, logits and per-row correctness of both query sets for one SceneBatch."""
  model = models.DualEncoder(config)
  variables = {"params": params}
  z_BxD = model.apply(variables, batch.scene_tokens_BxL, method=models.DualEncoder.encode_scenes)
  num_concept = batch.concept_query_tokens_QcxLq.shape[0]
  # One query-tower call for both query sets (towers treat sequences independently).
  queries_QxL = jnp.concatenate([batch.concept_query_tokens_QcxLq,
                                 batch.object_query_tokens_QoxLq])
  q_QxD = model.apply(variables, queries_QxL, method=models.DualEncoder.encode_queries)
  logits_BxQ = models.similarity_logits(config, params["tau"], z_BxD, q_QxD, cap)
  out = {}
  for name, logits, labels, query_mask, active in (
      ("concept", logits_BxQ[:, :num_concept], batch.concept_labels_BxQc,
       batch.concept_query_mask_Qc, batch.concept_active_B),
      ("object", logits_BxQ[:, num_concept:], batch.object_labels_BxQo,
       batch.object_query_mask_Qo, batch.object_active_B)):
    out[f"{name}_loss"] = objectives.soft_cross_entropy(logits, labels, active, query_mask)
    out[f"{name}_logits_BxQ"] = logits
    out[f"{name}_correct_B"] = objectives.set_separation_correct(logits, labels, query_mask)
    out[f"{name}_active_B"] = active
  out[results.LOSS] = out["concept_loss"] + out["object_loss"]
  out["z_BxD"] = z_BxD
  return out


def binding(params, batch, z_BxD, config, space, cap):
  """Per scene: (binding scene, bound) bools [B] (docs/objectives.md#binding).

  A binding scene holds two objects that differ in every concept; it is bound when the scene
  scores both of its objects strictly above every cross object (an object mixing the two
  objects' values: 2 for C = 2). The cross objects are encoded here, whether or not the batch's
  query set holds them.
  """
  if space.max_objects < 2:
    false_B = jnp.zeros(batch.num_objects_B.shape, bool)
    return false_B, false_B
  a_BxC, b_BxC = batch.objects_BxKxC[:, 0], batch.objects_BxKxC[:, 1]
  candidates_BxNxC = jnp.concatenate(
      [a_BxC[:, None], b_BxC[:, None], objectives.cross_objects(a_BxC, b_BxC)], axis=1)
  b, n = candidates_BxNxC.shape[:2]
  tokens_BNxLq = space.object_query_tokens(
      space.object_ids(jnp.maximum(candidates_BxNxC, 0)).reshape(-1))
  q_BNxD = models.DualEncoder(config).apply(
      {"params": params}, tokens_BNxLq, method=models.DualEncoder.encode_queries)
  logits_BxN = models.paired_logits(config, params["tau"], z_BxD,
                                    q_BNxD.reshape(b, n, -1), cap)
  scenes_B = objectives.binding_scenes(batch.objects_BxKxC, batch.num_objects_B)
  return scenes_B, scenes_B & objectives.binding_correct(logits_BxN[:, :2], logits_BxN[:, 2:])


def train_step(state, inputs, spec, scene_sharding=None):
  """One AdamW step on a fresh training batch drawn from fold_in(state.key, state.step).

  scene_sharding: optional sharding of the per-scene axis B (e.g. split over a "data" mesh
  axis, under vmap with spmd_axis_name for the replica axis); the batch is the same either way.
  Returns (new_state, metrics) with scalar metrics of this batch (before the update).
  """
  batch = _sample(jax.random.fold_in(state.key, state.step), inputs.permutation_O,
                  inputs.num_train, spec, spec.sampler, "train", scene_sharding)

  def loss_fn(params):
    out = forward(params, batch, spec.model, spec.model.train_logit_cap)
    return out[results.LOSS], out

  (loss, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  tx = make_optimizer(spec, inputs)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {
      results.LOSS: loss,
      "concept_loss": out["concept_loss"],
      "object_loss": out["object_loss"],
      "batch_concept_accuracy": objectives.masked_mean(out["concept_correct_B"],
                                                       out["concept_active_B"]),
      "batch_object_accuracy": objectives.masked_mean(out["object_correct_B"],
                                                      out["object_active_B"]),
      "learning_rate": inputs.learning_rate * learning_rate_multiplier(
          state.step, inputs.num_steps, inputs.warmup_steps),
      "grad_norm": optax.tree.norm(grads),
      "tau": state.params["tau"],
  }
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, metrics


def _evaluate(params, key, permutation_O, num_train, spec, split, scene_sharding):
  """Metrics over spec.eval_batches fresh batches: mean of per-batch means (docs/training.md)."""
  k = spec.space.max_objects

  def one_batch(batch_key):
    batch = _sample(batch_key, permutation_O, num_train, spec, spec.eval_sampler, split,
                    scene_sharding)
    out = forward(params, batch, spec.model, spec.model.eval_logit_cap)
    result = {"concept_loss": out["concept_loss"], "object_loss": out["object_loss"]}
    for name in ("concept", "object"):
      overall, per_count_K, rows_K = objectives.accuracy_by_count(
          out[f"{name}_correct_B"], out[f"{name}_active_B"], batch.num_objects_B, k)
      result[results.accuracy_name(name)] = overall
      result[f"{name}_accuracy_K"] = per_count_K
      result[f"{name}_rows_K"] = rows_K
      result[f"{name}_active"] = out[f"{name}_active_B"].mean()
    scenes_B, bound_B = binding(params, batch, out["z_BxD"], spec.model, spec.space,
                                spec.model.eval_logit_cap)
    result[results.BINDING] = objectives.masked_mean(bound_B, scenes_B)
    result["binding_scenes"] = scenes_B.sum()
    return result

  per_batch = jax.lax.map(one_batch, jax.random.split(key, spec.eval_batches))
  metrics = {}
  for name in ("concept", "object"):
    metrics[results.accuracy_name(name)] = per_batch[results.accuracy_name(name)].mean()
    # By count: mean over the batches that hold scenes of that count.
    has_rows_NxK = (per_batch[f"{name}_rows_K"] > 0).astype(jnp.float32)
    per_count_K = ((per_batch[f"{name}_accuracy_K"] * has_rows_NxK).sum(0) /
                   jnp.maximum(has_rows_NxK.sum(0), 1.0))
    for count in range(k):
      metrics[results.accuracy_name(name, count + 1)] = per_count_K[count]
    metrics[f"{name}_loss"] = per_batch[f"{name}_loss"].mean()
    metrics[f"{name}_active_fraction"] = per_batch[f"{name}_active"].mean()
  # Binding: mean over the batches that hold binding scenes.
  has_scenes_N = (per_batch["binding_scenes"] > 0).astype(jnp.float32)
  metrics[results.BINDING] = ((per_batch[results.BINDING] * has_scenes_N).sum() /
                               jnp.maximum(has_scenes_N.sum(), 1.0))
  metrics["binding_scenes"] = per_batch["binding_scenes"].sum().astype(jnp.float32)
  metrics[results.LOSS] = metrics["concept_loss"] + metrics["object_loss"]
  return metrics


def eval_step(params, key, inputs, spec, scene_sharding=None):
  """Held-out and training-object evaluation of one replica (docs/training.md).

  "heldout/…": scenes of held-out objects, queries over all objects. At coverage 1 there is no
  held-out set: those metrics then come from training-object scenes and
  "heldout/uses_training_objects" is 1. "train/…": scenes of training objects, same schedule and
  batch count. scene_sharding: as in train_step. Returns a flat dict of float32 scalars.
  """
  has_heldout = inputs.num_train < spec.space.num_objects
  # With num_train = 0 the "test" pool is every object, i.e. the training objects at coverage 1.
  heldout_num_train = jnp.where(has_heldout, inputs.num_train, 0)
  heldout_key, train_key = jax.random.split(key)
  metrics = {}
  for prefix, k, num_train, split in ((results.HELDOUT, heldout_key, heldout_num_train, "test"),
                                      (results.TRAIN, train_key, inputs.num_train, "train")):
    for name, value in _evaluate(params, k, inputs.permutation_O, num_train, spec, split,
                                 scene_sharding).items():
      metrics[results.metric(prefix, name)] = value
  metrics[results.USES_TRAINING_OBJECTS] = 1.0 - has_heldout.astype(jnp.float32)
  return metrics

