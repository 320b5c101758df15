"""Batched fitting of binding approximators (docs/complexity.md, "Fitting").

Every (train fraction, seed, learning rate) of one approximator shape is a row of one
`jit(vmap)`, whose model axis is split over the devices of a `bindjax.runtime.parallel` mesh and chunked
(`lax.map`) when the models do not fit in memory at once. Each model trains by full-batch MSE on
its train-only scenes alone: the scenes are gathered once per fit and padded to the largest
count of the batch, and `fit_grid` batches together only splits of similar training counts, so
little padding is computed. After the steps listed by `eval_steps`, a separate compiled program
scores every model on all scenes (three masks) with frozen linear probes. The host drives the
loop between compiled chunks of steps, which lets callers show progress. Models may also bring
their own targets and probes over the same scenes (`own`, data.OwnTargets: e.g. every replica
of a sweep) and their own object split (GridEntry.split).
"""
import dataclasses
import functools
import logging
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bindjax.complexity import coordinate
from bindjax.complexity import data as data_lib
from bindjax.complexity import families
from bindjax.core import objectives
from bindjax.frozen.probes import linear
from bindjax.runtime import engine
from bindjax.runtime import parallel

SCHEDULES = ("cosine", "constant")
SOLVERS = ("auto", "coordinate", "adam")
CADENCES = ("end", "original")
# fit_grid puts splits in one batch while the largest training count is at most this many times
# the smallest: padding then costs at most a quarter of a batch's training arithmetic.
PAD_RATIO = 1.25
# Default weight decay per family (standardised targets), measured on planted structure
# (docs/findings/complexity_stability.md): a product of all K·C slots needs less than one of
# each object's C slots; additive and MLP fits are not regularised by default.
WEIGHT_DECAY = {"mlp": 0.0, "additive": 0.0, "product": 3e-4, "sum_product": 3e-4,
                "per_object_product": 3e-3, "per_object_sum_product": 3e-3}
# Default initialisations per fit (restarts = 0), by family. The product families' landscapes
# have poor minima that restarts escape (docs/complexity.md, "Why single fits failed"); an
# additive fit is a factored linear regression, whose minima are all global; MLP fits, as the
# original's, start once: three starts cost 2.9x and moved no correlation
# (docs/findings/binding_fits.md).
RESTARTS = {"mlp": 1, "additive": 1, "product": 3, "sum_product": 3, "per_object_product": 3,
            "per_object_sum_product": 3}
# The original's learning rate: the complexity grid's default and that of every binding fit.
LEARNING_RATE = 1e-2


@dataclasses.dataclass(frozen=True)
class FitConfig:
  """Static training settings shared by a batch of models."""
  steps: int = 4000
  eval_every: int = 100
  # "constant" is the original code's behaviour (it builds a cosine schedule but never steps it).
  schedule: str = "cosine"
  probe_similarity: str = "dot"
  # "end": evaluate after eval_every, 2·eval_every, …, steps; "original": after 1, 1+eval_every,
  # …, as the original code does (it then trains eval_every − 1 unevaluated steps; we stop).
  eval_cadence: str = "end"
  # Initialisations tried per fit (docs/complexity.md, "Restarts"). 0: the family's value in
  # RESTARTS. 1: the single initialisation from the fit's seed, as the original runs it. R > 1:
  # R candidates train restart_steps steps at the fit's constant learning rate; the best one by
  # `restart_holdout` is trained as usual.
  restarts: int = 0
  restart_steps: int = 0      # 0: half of `steps`
  # 0: candidates train on all the fit's training scenes and the lowest training loss wins.
  # h in (0, 1): they train on the scenes of the first 1 − h of the training objects and the
  # lowest error on the remaining train-only scenes (those holding a held-out object) wins.
  restart_holdout: float = 0.0
  # Fit in units of the training targets (their mean removed, divided by their RMS spread), so
  # that weight_decay means the same on every embedding set. False: raw targets, as the original.
  standardize: bool = True
  # L2 penalty on every table, W and kernel, decayed linearly to 0 by the last step: it picks,
  # among the many wide products that fit the training scenes, a low-rank one, which is what
  # predicts unseen objects (docs/complexity.md, "Why single fits failed"). "auto": the
  # family's value in WEIGHT_DECAY; 0: none, as the original.
  weight_decay: float | str = "auto"
  # "coordinate": the additive and product families at E = D with W = I are solved per
  # embedding coordinate by Levenberg–Marquardt (bindjax.complexity.coordinate; docs/
  # complexity.md, "The coordinate solver"); "adam": gradient training as above; "auto": the
  # coordinate solver where it applies, Adam elsewhere (MLPs, E < D, learned W).
  solver: str = "auto"
  solver_starts: int = 8        # coordinate solver: starts per coordinate, the cheapest kept
  solver_iterations: int = 30   # coordinate solver: Levenberg–Marquardt steps per start

  def __post_init__(self):
    # A number typed on the command line into the "auto" field arrives as a string.
    if isinstance(self.weight_decay, str) and self.weight_decay != "auto":
      try:
        object.__setattr__(self, "weight_decay", float(self.weight_decay))
      except ValueError:
        pass  # validate() names it

  def validate(self):
    """Returns self; ValueError naming the bad field."""
    if self.schedule not in SCHEDULES:
      raise ValueError(f"schedule={self.schedule!r}: expected one of {SCHEDULES}")
    if self.eval_cadence not in CADENCES:
      raise ValueError(f"eval_cadence={self.eval_cadence!r}: expected one of {CADENCES}")
    if self.steps < 1 or self.eval_every < 1 or self.steps % self.eval_every:
      raise ValueError(f"steps={self.steps}, eval_every={self.eval_every}: expected positive "
                       f"integers with eval_every dividing steps")
    if self.probe_similarity not in linear.SIMILARITIES:
      raise ValueError(f"probe_similarity={self.probe_similarity!r}: expected one of "
                       f"{linear.SIMILARITIES}")
    if self.restarts < 0:
      raise ValueError(f"restarts={self.restarts}: expected ≥ 0 (0: the family's default; 1: a "
                       f"single initialisation)")
    if self.restart_steps < 0:
      raise ValueError(f"restart_steps={self.restart_steps}: expected ≥ 0 (0: half of steps)")
    if not 0 <= self.restart_holdout < 1:
      raise ValueError(f"restart_holdout={self.restart_holdout}: expected 0 ≤ h < 1")
    if self.solver not in SOLVERS:
      raise ValueError(f"solver={self.solver!r}: expected one of {SOLVERS}")
    if self.solver_starts < 1 or self.solver_iterations < 1:
      raise ValueError(f"solver_starts={self.solver_starts}, solver_iterations="
                       f"{self.solver_iterations}: expected positive integers")
    if self.weight_decay != "auto" and not (isinstance(self.weight_decay, (int, float))
                                            and self.weight_decay >= 0):
      raise ValueError(f"weight_decay={self.weight_decay!r}: expected 'auto' or a number ≥ 0")
    return self

  @property
  def candidate_steps(self):
    """Steps each restart candidate trains at a constant learning rate."""
    return self.restart_steps or max(1, self.steps // 2)

  def decay_for(self, family):
    """The weight decay a fit of `family` uses."""
    if self.weight_decay == "auto":
      return WEIGHT_DECAY[family]
    return float(self.weight_decay)

  def restarts_for(self, family):
    """The initialisations a fit of `family` tries."""
    return self.restarts or RESTARTS[family]

  def solver_for(self, model):
    """"coordinate" or "adam": how a fit of `model` is made."""
    if self.solver == "coordinate" and not coordinate.supports(model):
      raise ValueError(f"solver='coordinate': {model.name} at E = {model.width}, D = "
                       f"{model.out_dim}; expected an additive or product family at E = D "
                       f"without a learned W")
    if self.solver == "auto":
      return "coordinate" if coordinate.supports(model) else "adam"
    return self.solver

  def for_family(self, family):
    """This config with the family's defaults filled in (restarts, weight decay)."""
    return dataclasses.replace(self, restarts=self.restarts_for(family),
                               weight_decay=self.decay_for(family))


# The ORIGINAL settings reproduce the original code's single unregularised fit.
ORIGINAL = dict(standardize=False, weight_decay="0", restarts=1, solver="adam")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """What a command that fits approximators sets besides their FitConfig: the approximators'
  slot width and how their fits are chunked on the devices."""
  embed_dim: int = families.EMBED_DIM
  chunk_size: str = parallel.AUTO   # auto | none | n models at once (parallel.chunk_setting)
  memory_bytes: int = 0             # the memory "auto" chunks for; 0: the device's

  def validate(self):
    """Returns self; ValueError naming the bad field."""
    parallel.chunk_setting(self.chunk_size)
    if self.embed_dim < 0 or self.memory_bytes < 0:
      raise ValueError(f"embed_dim={self.embed_dim}, memory_bytes={self.memory_bytes}: expected "
                       "≥ 0")
    return self

  @property
  def chunks(self):
    """The chunk_size argument of `fit_grid` and `fit_models`."""
    return parallel.chunk_setting(self.chunk_size)

  @property
  def memory(self):
    """The memory_bytes argument of `fit_grid` and `fit_models` (None: the device's)."""
    return int(self.memory_bytes) or None


def eval_steps(config):
  """The training steps after which models are evaluated (1-based counts of updates)."""
  first = 1 if config.eval_cadence == "original" else config.eval_every
  return list(range(first, config.steps + 1, config.eval_every))


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
  theta_DxP, share = coordinate.solve(
      point.key_Mx2, rows_T, weight_T, targets_TxD, data.values_NxKxC, data.object_ids_NxK,
      data.num_unique, model, config.solver_starts, config.solver_iterations)
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
def _init_points(points, model, chunk_size, num_shards):
  return _map_models(lambda p: _init_one(p, model), chunk_size, num_shards)(points)


# `own`: the models' own targets and probes (data_lib.OwnTargets, leading axis M) or None.
@functools.partial(jax.jit, static_argnames=("model", "config", "chunk_size", "num_shards"))
def _select_points(points, rows_MxT, valid_MxT, score_MxN, data, own, model, config, chunk_size,
                   num_shards):
  fn = _map_models(lambda p, r, v, s, o: _select_one(
      p, r, v, s, data_lib.with_own(data, None, o)[0], model, config), chunk_size, num_shards)
  return fn(points, rows_MxT, valid_MxT, score_MxN, own)


@functools.partial(jax.jit, static_argnames=("model", "config", "chunk_size", "num_shards"))
def _solve_points(points, rows_MxT, valid_MxT, data, own, model, config, chunk_size, num_shards):
  fn = _map_models(lambda p, r, v, o: _solve_one(
      p, r, v, data_lib.with_own(data, None, o)[0], model, config), chunk_size, num_shards)
  return fn(points, rows_MxT, valid_MxT, own)


@functools.partial(jax.jit, static_argnames=("model", "config", "chunk_size", "num_shards"),
                   donate_argnames=("state",))
def _train_points(points, state, rows_MxT, valid_MxT, first_step, num_steps, data, own, model,
                  config, chunk_size, num_shards):
  fn = _map_models(lambda p, s, r, v, o: _train_one(
      p, s, r, v, first_step, num_steps, data_lib.with_own(data, None, o)[0], model, config),
      chunk_size, num_shards)
  return fn(points, state, rows_MxT, valid_MxT, own)


@functools.partial(jax.jit, static_argnames=("model", "config", "chunk_size", "num_shards"))
def _evaluate_points(points, params, data, probes, own, model, config, chunk_size, num_shards):
  fn = _map_models(lambda p, w, o: _evaluate_one(p, w, *data_lib.with_own(data, probes, o),
                                                 model, config), chunk_size, num_shards)
  return fn(points, params, own)


def bytes_per_model(model, num_train_scenes, num_scenes, num_unique):
  """Rough memory of one model's fit: parameters ×5 (grads, Adam moments, update) plus the larger
  of a training step's activations (its train scenes) and an evaluation's (all scenes, scores)."""
  hidden = sum(model.widths) + model._head_in()  # pylint: disable=protected-access
  per_scene = model.num_slots * model.width + hidden + model.out_dim
  train = num_train_scenes * per_scene * 3
  evaluate = num_scenes * (per_scene + num_unique + sum(model.values_per_concept)) * 2
  return 4 * (5 * model.num_parameters() + max(train, evaluate))


def restart_masks(data, points, config):
  """What the candidates of config.restarts > 1 train on and are scored on (host numpy).

  Returns (rows [M, T] int32, valid [M, T] bool) as `data_lib.training_rows` gives them for the
  candidates' training objects, and score [M, N] bool: the scenes whose mean squared error
  selects a candidate (see FitConfig.restart_holdout).
  """
  num_train_M = np.asarray(points.num_train_M)
  candidate_M = num_train_M
  if config.restart_holdout:
    try:
      candidate_M = np.array([linear.split_count(int(n), 1 - config.restart_holdout)
                              for n in num_train_M], np.int32)
    except ValueError:
      raise ValueError(f"restart_holdout={config.restart_holdout}: a fit has fewer than 2 "
                       f"training objects to split") from None
  rows_MxT, valid_MxT = data_lib.training_rows(data, points.replace(num_train_M=candidate_M))
  train_only = jax.vmap(lambda p, n: data_lib.scene_masks(data.object_ids_NxK, p, n)[0])
  permutation_MxU = jnp.asarray(points.permutation_MxU)
  score_MxN = np.array(train_only(permutation_MxU, jnp.asarray(num_train_M)))
  if config.restart_holdout:
    score_MxN &= ~np.asarray(train_only(permutation_MxU, jnp.asarray(candidate_M)))
  return rows_MxT, valid_MxT, score_MxN


def auto_mesh(num_models, devices=None):
  """Replica mesh over the fewest devices that still give the fewest models per device.

  E.g. 3 models on 8 devices use 3 devices (no padded copies); 9 models use 5 (2 per device).
  """
  devices = list(jax.devices() if devices is None else devices)
  per_device = -(-num_models // len(devices))
  used = min(len(devices), -(-num_models // per_device))
  return parallel.make_mesh(devices=devices[:used])


def fit_models(model, data, probes, points, config, mesh=None, chunk_size=parallel.AUTO,
               memory_bytes=None, on_eval=None, keep_params=False, own=None):
  """Fits M models of one shape (M = len of points) as one compiled batch over the mesh.

  chunk_size: "auto", None (all at once) or an int. "auto" is 1 on a single CPU device (see
  `_map_models`), else `engine.auto_chunk` of `bytes_per_model` against the device memory.
  Compiled programs are kept in the engine's bounded cache (`engine.compile_ahead`).
  on_eval: called after every evaluation as on_eval(steps_done_in_this_eval, train_loss_M).
  keep_params: also return the trained parameters (host numpy, leading axis M) as info["params"].
  own: data_lib.OwnTargets with one row per model: each model trains on and is scored by its own
  targets and probes (data's targets and `probes` are then unused).
  Returns (history dict of numpy [M, num_evals, ...], info dict with timings and chunking).
  """
  config = config.validate().for_family(model.family)
  num_models = int(np.shape(points.learning_rate_M)[0])
  mesh = mesh or auto_mesh(num_models)
  rows_MxT, valid_MxT = data_lib.training_rows(data, points)
  adam = config.solver_for(model) == "adam"
  selection = restart_masks(data, points, config) if adam and config.restarts > 1 else ()
  (points_s, rows_s, valid_s, selection_s, own_s), valid = engine.place(
      (points, rows_MxT, valid_MxT, selection, own), mesh)
  if chunk_size == parallel.AUTO and engine.is_single_cpu(mesh):
    chunk_size = 1  # Unbatched, one model at a time: see _map_models.
  elif chunk_size == parallel.AUTO:
    # The restart candidates of one fit (or the solver's starts) are held at once (one vmap).
    copies = config.restarts if adam else config.solver_starts
    chunk_size = engine.auto_chunk(
        mesh, len(valid), bytes_per_model(model, rows_MxT.shape[1], data.num_scenes,
                                          data.num_unique) * copies,
        memory_bytes=memory_bytes)
  data_r, probes_r = jax.device_put((data, probes), parallel.replicated_sharding(mesh))
  statics = {"model": model, "chunk_size": chunk_size,
             "num_shards": parallel.num_replica_shards(mesh)}
  if config.solver_for(model) == "coordinate":
    return _fit_coordinates(model, points_s, rows_s, valid_s, data_r, probes_r, own_s, config,
                            statics, _batch_info(model, num_models, valid, valid_MxT, chunk_size),
                            keep_params)
  start = time.perf_counter()
  select_s, selected = 0.0, None
  if config.restarts == 1:
    initial = engine.compile_ahead(_init_points, points_s, **statics)(points_s)
  else:
    select = engine.compile_ahead(_select_points, points_s, *selection_s, data_r, own_s,
                                  config=config, **statics)
    select_start = time.perf_counter()
    initial, *selected = select(points_s, *selection_s, data_r, own_s)
    selected = parallel.to_host(selected)
    select_s = time.perf_counter() - select_start
  # Placed like the points, so every training call takes and returns the same sharding.
  state = jax.device_put(initial, parallel.replica_sharding(mesh))
  zero = np.int32(0)
  train = engine.compile_ahead(_train_points, points_s, state, rows_s, valid_s, zero, zero,
                               data_r, own_s, config=config, **statics)
  evaluate = engine.compile_ahead(_evaluate_points, points_s, state[0], data_r, probes_r, own_s,
                                  config=config, **statics)
  compile_s = time.perf_counter() - start - select_s
  train_s = eval_s = 0.0
  history, done = [], 0
  for step in eval_steps(config):
    start = time.perf_counter()
    state, loss_M = train(points_s, state, rows_s, valid_s, np.int32(done), np.int32(step - done),
                          data_r, own_s)
    loss_M = parallel.to_host(loss_M)[:num_models]
    train_s += time.perf_counter() - start
    start = time.perf_counter()
    metrics = parallel.to_host(evaluate(points_s, state[0], data_r, probes_r, own_s))
    eval_s += time.perf_counter() - start
    metrics["train_loss"] = loss_M
    history.append(metrics)
    if on_eval is not None:
      on_eval(step - done, loss_M)
    done = step
  history = {k: np.stack([h[k][:num_models] for h in history], axis=1) for k in history[0]}
  memory = parallel.compiled_memory_bytes(train)
  info = {**_batch_info(model, num_models, valid, valid_MxT, chunk_size), "solver": "adam",
          "compile_s": compile_s, "select_s": select_s, "train_s": train_s, "eval_s": eval_s,
          "run_s": select_s + train_s + eval_s,
          "compiled_temp_bytes": memory[0] if memory else None,
          "restarts": config.restarts, "identified": None,
          # Per model: the kept candidate and its selection error (None for a single start).
          "restart_candidate": None if selected is None else selected[0][:num_models].tolist(),
          "restart_error": None if selected is None else selected[1][:num_models].tolist()}
  if keep_params:
    info["params"] = jax.tree_util.tree_map(lambda x: x[:num_models], parallel.to_host(state[0]))
  logging.info("%s: %d models, compile %.1fs, select %.1fs, train %.1fs, evaluate %.1fs",
               model.name, num_models, compile_s, select_s, train_s, eval_s)
  return history, info


def _batch_info(model, num_models, valid, valid_MxT, chunk_size):
  return {"model": model.name, "num_models": num_models, "padded_models": len(valid),
          "train_scenes_padded": int(valid_MxT.shape[1]),
          "train_scenes": valid_MxT.sum(-1).tolist(), "chunk_size": chunk_size}


def _fit_coordinates(model, points_s, rows_s, valid_s, data_r, probes_r, own_s, config, statics,
                     info, keep_params):
  """fit_models for the coordinate solver: one solve, one evaluation. The history repeats that
  evaluation at every step of `eval_steps`, so that it has the shape of a trained fit's."""
  num_models = info["num_models"]
  start = time.perf_counter()
  solve = engine.compile_ahead(_solve_points, points_s, rows_s, valid_s, data_r, own_s,
                               config=config, **statics)
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  params, loss_M, identified_M = solve(points_s, rows_s, valid_s, data_r, own_s)
  loss_M, identified_M = parallel.to_host((loss_M, identified_M))
  train_s = time.perf_counter() - start
  start = time.perf_counter()
  evaluate = engine.compile_ahead(_evaluate_points, points_s, params, data_r, probes_r, own_s,
                                  config=config, **statics)
  compile_s += time.perf_counter() - start
  start = time.perf_counter()
  metrics = parallel.to_host(evaluate(points_s, params, data_r, probes_r, own_s))
  eval_s = time.perf_counter() - start
  metrics["train_loss"] = loss_M
  num_evals = len(eval_steps(config))
  history = {k: np.repeat(v[:num_models, None], num_evals, axis=1) for k, v in metrics.items()}
  info.update({"solver": "coordinate", "compile_s": compile_s, "select_s": 0.0,
               "train_s": train_s, "eval_s": eval_s, "run_s": train_s + eval_s,
               "compiled_temp_bytes": None, "restarts": 1, "restart_candidate": None,
               "restart_error": None, "identified": identified_M[:num_models].tolist()})
  if keep_params:
    info["params"] = jax.tree_util.tree_map(lambda x: x[:num_models], parallel.to_host(params))
  logging.info("%s: %d models, coordinate solver, compile %.1fs, solve %.1fs, evaluate %.1fs",
               model.name, num_models, compile_s, train_s, eval_s)
  return history, info


def summarize(history, config):
  """Per-model summary of a history: best test-only object accuracy (headline), best test-only
  R² over evaluations and the values at the last evaluation (what the original reports)."""
  test = data_lib.MASKS.index("test_only")
  steps = eval_steps(config)
  object_acc_MxE = history["object_acc"][..., test]
  best_E_index = object_acc_MxE.argmax(-1)
  rows = []
  for m, e in enumerate(best_E_index):
    row = {
        "best_test_object_acc": float(object_acc_MxE[m, e]),
        "best_step": steps[e],
        "final_step": steps[-1],
        "test_concept_acc_at_best": float(history["concept_acc"][m, e, test]),
        "best_test_concept_acc": float(history["concept_acc"][m, :, test].max()),
        "best_test_r2": float(history["r2"][m, :, test].max()),
        "final_train_loss": float(history["train_loss"][m, -1]),
        # A diverged model is flagged, not fatal: its metrics are whatever NaNs gave.
        "diverged": bool(not np.isfinite(history["train_loss"][m]).all()),
    }
    for key in ("concept_acc", "object_acc", "mse", "r2"):
      for i, mask in enumerate(data_lib.MASKS):
        row[f"final_{mask}_{key}"] = float(history[key][m, -1, i])
    rows.append(row)
  return rows


@dataclasses.dataclass(frozen=True)
class GridEntry:
  """One fit of a grid: approximator, train fraction, seed, learning rate."""
  model: families.Approximator
  train_fraction: float
  seed: int
  learning_rate: float
  # (permutation, training count) to use instead of the seed's random split of train_fraction.
  split: tuple | None = None
  # Row of fit_grid's `own` whose targets and probes this fit uses (None: the data's).
  own_index: int | None = None


def grid_entries(models, fractions, seeds, learning_rates):
  """Every (model, fraction, seed, lr) combination, model-major."""
  return [GridEntry(m, float(f), int(s), float(lr)) for m in models for f in fractions
          for s in seeds for lr in learning_rates]


def batches_by_count(counts, pad_ratio=PAD_RATIO):
  """Groups of indices into `counts` (train-only scene counts) that are fitted together.

  Sorted by count; a group's largest count is at most pad_ratio times its smallest (≥ 1);
  pad_ratio=inf makes one group.
  """
  order = np.argsort(-np.asarray(counts), kind="stable")
  groups = []
  for i in order:
    if groups and max(counts[groups[-1][0]], 1) <= pad_ratio * max(counts[i], 1):
      groups[-1].append(int(i))
    else:
      groups.append([int(i)])
  return [sorted(g) for g in groups]


def fit_grid(entries, data, probes, config, mesh=None, chunk_size=parallel.AUTO,
             memory_bytes=None, on_eval=None, own=None, pad_ratio=PAD_RATIO):
  """Fits every entry: one jit(vmap) per approximator shape and training-count batch.

  Returns (result rows in entry order, infos per batch). Each row holds the grid coordinates,
  scene counts per mask, the summary of `summarize` and the full evaluation history (lists
  over evaluations; masks in data.MASKS order). on_eval: as in `fit_models`. own: a
  data_lib.OwnTargets whose rows the entries' own_index select (all entries then need one).
  pad_ratio: as in `batches_by_count` (fewer compiled batches against more padded arithmetic).
  """
  config.validate()
  by_model = {}
  for i, entry in enumerate(entries):
    by_model.setdefault(entry.model, []).append(i)
  rows = [None] * len(entries)
  infos = []
  for model, indices in by_model.items():
    group = [entries[i] for i in indices]
    points = data_lib.make_points(data.num_unique, [e.train_fraction for e in group],
                                  [e.seed for e in group], [e.learning_rate for e in group],
                                  [e.split for e in group])
    counts = data_lib.mask_counts(data, points)
    for batch in batches_by_count(counts[:, 0], pad_ratio):
      sub = jax.tree_util.tree_map(lambda x, b=batch: np.asarray(x)[b], points)
      own_sub = None if own is None else jax.tree_util.tree_map(
          lambda x, b=batch: np.asarray(x)[[group[i].own_index for i in b]], own)
      history, info = fit_models(model, data, probes, sub, config, mesh, chunk_size,
                                 memory_bytes, on_eval, own=own_sub)
      infos.append(info)
      for j, (b, summary) in enumerate(zip(batch, summarize(history, config))):
        e = group[b]
        rows[indices[b]] = {
            "family": model.family, "name": model.name, "widths": list(model.widths),
            "learned_w": model.learned_w, "embed_dim": model.width,
            "num_parameters": model.num_parameters(),
            "train_fraction": float(e.train_fraction), "seed": int(e.seed),
            "learning_rate": float(e.learning_rate), "schedule": config.schedule,
            "steps": config.steps, "solver": info["solver"], "restarts": info["restarts"],
            "standardize": config.standardize, "weight_decay": config.decay_for(model.family),
            **{key: None if info[key] is None else info[key][j]
               for key in ("restart_candidate", "restart_error")},
            # Coordinate solver: the share of coordinates whose predictions on unseen scenes
            # the training scenes determine; a fit below 1 reports test-only metrics of one
            # of many equally good fits (docs/complexity.md, "Identifiability").
            "identified_share": None if info["identified"] is None else info["identified"][j],
            "identified": None if info["identified"] is None else info["identified"][j] == 1.0,
            "num_train_objects": int(points.num_train_M[b]),
            **{f"num_{mask}_scenes": int(counts[b, k]) for k, mask in enumerate(data_lib.MASKS)},
            **summary,
            "history": {key: np.asarray(v[j]).tolist() for key, v in history.items()},
        }
  return rows, infos
