"""Training one dual encoder from scratch (docs/training.md): pure per-replica functions.

The functions are written for ONE replica and are pure, so the sweep vmaps them over a leading
replica axis:

  spec = run_spec.RunSpec.from_config(config)   # the run's settings; spec.program: the shapes
  inputs, split = run_spec.inputs_from_config(config, spec)  # per-replica arrays (stack to vmap)
  program = spec.program                        # hashable: one compile per program
  state = init(inputs.key, program, inputs)
  state, metrics = train_step(state, inputs, program)  # samples its batch from fold_in(data, step)
  metrics = eval_step(state.params, eval_key(inputs.key, step), inputs, program)

The settings, their defaults and validation are `bindjax.training.run_spec`'s. The schedule's
length (num_steps and its warm-up) rides in `run_spec.ReplicaInputs` as data, so runs that
differ only in their loop settings (steps, evaluation and logging cadence) share one compiled
program.

Randomness: a replica's root key (from its seed) splits into three streams by fold_in: 0 model
init, 1 training data (fold_in(·, step) per step), 2 evaluation (fold_in(·, step) per evaluation).

There is one training loop, `bindjax.training.sweep.run_sweep`; `bindjax train` runs a config
without a grid as a sweep of one replica (`grid.single_run_config`).
"""

import flax.struct
import jax
import jax.numpy as jnp
import optax

from bindjax.core import models
from bindjax.core import objectives
from bindjax.core import scenes
from bindjax.workdir import results

INIT_STREAM, DATA_STREAM, EVAL_STREAM = 0, 1, 2


def train_step_flops(spec):
  """Matmul FLOPs of one replica's train step (`models.tower_flops` of both towers, × 3 for the
  forward and backward passes)."""
  space, sampler, model = spec.space, spec.sampler, spec.model
  queries = sampler.num_concept_queries(space) + sampler.num_object_queries(space)
  forward = (models.tower_flops(model, sampler.batch_size, space.scene_length, tower="scene") +
             models.tower_flops(model, queries, space.query_length,
                                out_features=model.query_out_features, tower="query"))
  return 3 * forward


# --------------------------------------------------------------------------------------------
# Optimiser


def learning_rate_multiplier(step, num_steps, warmup_steps):
  """Schedule (docs/training.md): linear warm-up from 0 over `warmup_steps`, then linear decay
  to 0 at `num_steps`.

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

