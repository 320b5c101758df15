"""The compiled per-model programs of a batched fit (`bindjax.complexity.fitting`).

Each program maps one model's function (initialise, select among restart candidates, train,
solve by coordinates, evaluate) over the model axis of a batch (`parallel.chunked_vmap`, or
`lax.map` one model at a time on one CPU device). A model trains by full-batch MSE on its
train-only scenes, in target units standardised over them, and is scored on all scenes (three
masks) with frozen linear probes.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax

from bindjax.complexity import coordinate
from bindjax.complexity import data as data_lib
from bindjax.core import objectives
from bindjax.frozen.probes import linear
from bindjax.runtime import parallel


def evaluate_predictions(pred_NxD, data, probes, masks_3xN, similarity="dot"):
  """Concept/object accuracy (frozen probes), MSE and R² on each of the three masks.

  Returns a dict of [3] arrays: concept_acc, object_acc, mse, r2. Pure; vmappable over models.
  """
  labels = data.labels
  concept_CxNxV, object_NxU = linear.head_logits(probes, pred_NxD, similarity)
  concept_correct_CxN = jax.vmap(objectives.set_separation_correct)(
      concept_CxNxV, labels.concept_CxNxV, labels.concept_mask_CxV)
  object_correct_N = objectives.set_separation_correct(
      object_NxU, labels.object_NxU, jnp.ones(labels.object_NxU.shape[-1], bool))
  se_N = ((pred_NxD - data.targets_NxD) ** 2).sum(-1)
  masks_3xN = masks_3xN.astype(jnp.float32)
  count_3 = masks_3xN.sum(-1)
  safe_3 = jnp.maximum(count_3, 1.0)
  concept_acc_3 = (masks_3xN @ concept_correct_CxN.astype(jnp.float32).T).mean(-1) / safe_3
  object_acc_3 = masks_3xN @ object_correct_N.astype(jnp.float32) / safe_3
  sse_3 = masks_3xN @ se_N
  return {
      "concept_acc": concept_acc_3,
      "object_acc": object_acc_3,
      "mse": sse_3 / (safe_3 * pred_NxD.shape[-1]),
      "r2": 1.0 - sse_3 / jnp.maximum(masks_3xN @ data.sq_dev_N, 1e-12),
  }


def _lr_factor(step, config):
  if config.schedule == "constant":
    return 1.0
  return 0.5 * (1.0 + jnp.cos(jnp.pi * step / config.steps))


def _init_one(point, model):
  params = model.init(point.key_Mx2)
  return params, optax.scale_by_adam().init(params)


def _select_one(point, rows_T, valid_T, score_N, data, model, config):
  """Initial (params, Adam state) of one fit with config.restarts > 1: the candidate with the
  lowest masked error on score_N after config.candidate_steps steps on rows_T; also its index
  and that error."""
  keys_Rx2 = jax.vmap(lambda r: jax.random.fold_in(point.key_Mx2, r))(
      jnp.arange(config.restarts))
  explore = dataclasses.replace(config, schedule="constant")
  anneal_steps = max(1, config.candidate_steps // 4)
  anneal = dataclasses.replace(config, schedule="cosine", steps=anneal_steps)

  def candidate(key_2):
    state = _init_one(point.replace(key_Mx2=key_2), model)
    state, _ = _train_one(point, state, rows_T, valid_T, 0, config.candidate_steps, data,
                          model, explore)
    (params, _), _ = _train_one(point, state, rows_T, valid_T, 0, anneal_steps, data, model,
                                anneal)
    stats = _target_stats(data.targets_NxD[rows_T], valid_T, config)
    se_N = ((_predict(params, data.values_NxKxC, stats, model) - data.targets_NxD) ** 2).mean(-1)
    return params, objectives.masked_mean(se_N, score_N)

  params_R, error_R = jax.vmap(candidate)(keys_Rx2)
  best = jnp.argmin(jnp.where(jnp.isnan(error_R), jnp.inf, error_R))
  params = jax.tree_util.tree_map(lambda x: x[best], params_R)
  return (params, optax.scale_by_adam().init(params)), best, error_R[best]


def _target_stats(targets_NxD, mask_N, config):
  """(mean [D], RMS spread) of the masked targets: the units a fit trains in."""
  if not config.standardize:
    return jnp.zeros(targets_NxD.shape[-1], jnp.float32), jnp.ones((), jnp.float32)
  weight_N = mask_N.astype(jnp.float32) / jnp.maximum(mask_N.sum(), 1)
  mean_D = weight_N @ targets_NxD
  spread = jnp.sqrt(weight_N @ ((targets_NxD - mean_D) ** 2).mean(-1))
  return mean_D, jnp.maximum(spread, 1e-12)


def _predict(params, values_NxKxC, stats, model):
  mean_D, spread = stats
  return model.apply(params, values_NxKxC) * spread + mean_D


def _penalty(params):
  """Σ of squares of every table, W and kernel (biases are not penalised)."""
  leaves = jax.tree_util.tree_leaves_with_path(params)
  return sum((x ** 2).sum() for path, x in leaves if jax.tree_util.keystr(path[-1:]) != "['bias']")


def _train_one(point, state, rows_T, valid_T, first_step, num_steps, data, model, config):
  """num_steps Adam steps (a dynamic count) from step first_step; returns (state, last loss).

  The loss is the mean squared error in the fit's target units (see `_target_stats`) plus the
  decaying weight-decay penalty; the returned loss is the error alone."""
  values_TxKxC = data.values_NxKxC[rows_T]
  raw_TxD = data.targets_NxD[rows_T]
  mean_D, spread = _target_stats(raw_TxD, valid_T, config)
  targets_TxD = (raw_TxD - mean_D) / spread
  adam = optax.scale_by_adam()
  decay = config.decay_for(model.family)

  def loss_fn(p, t):
    se_T = ((model.apply(p, values_TxKxC) - targets_TxD) ** 2).mean(-1)
    error = objectives.masked_mean(se_T, valid_T)
    if not decay:
      return error, error
    strength = decay * jnp.maximum(0.0, 1.0 - t / config.steps)
    return error + strength * _penalty(p), error

  def step(t, carry):
    (p, opt_state), _ = carry
    (_, loss), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, t)
    updates, opt_state = adam.update(grads, opt_state, p)
    lr = point.learning_rate_M * _lr_factor(t, config)
    p = jax.tree_util.tree_map(lambda x, u: x - lr * u, p, updates)
    return (p, opt_state), loss

  return jax.lax.fori_loop(first_step, first_step + num_steps, step,
                           (state, jnp.zeros((), jnp.float32)))


def _evaluate_one(point, params, data, probes, model, config):
  masks_3xN = data_lib.scene_masks(data.object_ids_NxK, point.permutation_MxU,
                                   point.num_train_M)
  stats = _target_stats(data.targets_NxD, masks_3xN[0], config)
  pred_NxD = _predict(params, data.values_NxKxC, stats, model)
  return evaluate_predictions(pred_NxD, data, probes, masks_3xN, config.probe_similarity)


def _solve_one(point, rows_T, valid_T, data, model, config):
  """(parameters, training MSE in the fit's units, share of identified coordinates) of one
  coordinate-solver fit on its train-only scenes."""
  values_TxKxC = data.values_NxKxC[rows_T]
  raw_TxD = data.targets_NxD[rows_T]
  mean_D, spread = _target_stats(raw_TxD, valid_T, config)
  targets_TxD = (raw_TxD - mean_D) / spread
  weight_T = valid_T.astype(jnp.float32)
  steps = coordinate.Steps(config.solver_starts, config.solver_screen or config.solver_iterations,
                           config.solver_iterations, config.solver_projection)
  theta_DxP, share = coordinate.solve(
      point.key_Mx2, rows_T, weight_T, targets_TxD, data.values_NxKxC, data.object_ids_NxK,
      data.num_unique, model, steps, config.solver_ridge)
  params = coordinate.to_params(theta_DxP, model)
  se_T = ((model.apply(params, values_TxKxC) - targets_TxD) ** 2).mean(-1)
  return params, objectives.masked_mean(se_T, valid_T), share


def _map_models(fn, chunk_size, num_shards):
  """fn over the leading (model) axis: `parallel.chunked_vmap`, except that one model at a time
  on one device runs fn unbatched under lax.map, since XLA:CPU's batched dots (what vmap makes
  of a layer) run up to 2.5x slower than plain ones at these shapes."""
  if chunk_size == 1 and num_shards == 1:
    return lambda *args: jax.lax.map(lambda a: fn(*a), args)
  return parallel.chunked_vmap(fn, chunk_size, num_shards)


@functools.partial(jax.jit, static_argnames=("model", "chunk_size", "num_shards"))
def init_points(points, model, chunk_size, num_shards):
  """Initial (params, Adam state) of every model: one start from its seed."""
  return _map_models(lambda p: _init_one(p, model), chunk_size, num_shards)(points)


# `own`: the models' own targets and probes (data_lib.OwnTargets, leading axis M) or None.
@functools.partial(jax.jit, static_argnames=("model", "config", "chunk_size", "num_shards"))
def select_points(points, rows_MxT, valid_MxT, score_MxN, data, own, model, config, chunk_size,
                   num_shards):
  """(initial state, kept candidate, its error) of every model: the best of config.restarts
  candidates (`_select_one`)."""
  fn = _map_models(lambda p, r, v, s, o: _select_one(
      p, r, v, s, data_lib.with_own(data, None, o)[0], model, config), chunk_size, num_shards)
  return fn(points, rows_MxT, valid_MxT, score_MxN, own)


@functools.partial(jax.jit, static_argnames=("model", "config", "chunk_size", "num_shards"))
def solve_points(points, rows_MxT, valid_MxT, data, own, model, config, chunk_size, num_shards):
  """(params, training loss, identified share) of every model by the coordinate solver."""
  fn = _map_models(lambda p, r, v, o: _solve_one(
      p, r, v, data_lib.with_own(data, None, o)[0], model, config), chunk_size, num_shards)
  return fn(points, rows_MxT, valid_MxT, own)


@functools.partial(jax.jit, static_argnames=("model", "config", "chunk_size", "num_shards"),
                   donate_argnames=("state",))
def train_points(points, state, rows_MxT, valid_MxT, first_step, num_steps, data, own, model,
                  config, chunk_size, num_shards):
  """num_steps Adam steps of every model from first_step: (state, last training loss)."""
  fn = _map_models(lambda p, s, r, v, o: _train_one(
      p, s, r, v, first_step, num_steps, data_lib.with_own(data, None, o)[0], model, config),
      chunk_size, num_shards)
  return fn(points, state, rows_MxT, valid_MxT, own)


@functools.partial(jax.jit, static_argnames=("model", "config", "chunk_size", "num_shards"))
def evaluate_points(points, params, data, probes, own, model, config, chunk_size, num_shards):
  """`evaluate_predictions` of every model on its own split (dict of [M, 3] arrays)."""
  fn = _map_models(lambda p, w, o: _evaluate_one(p, w, *data_lib.with_own(data, probes, o),
                                                 model, config), chunk_size, num_shards)
  return fn(points, params, own)
