"""Batched fitting of binding approximators (docs/complexity.md, "Fitting").

Every (train fraction, seed, learning rate) of one approximator shape is a row of one
`jit(vmap)`, whose model axis is split over the devices of a `bindjax.runtime.parallel` mesh
and chunked (`lax.map`) when the models do not fit in memory at once. Each model trains by
full-batch MSE on its train-only scenes alone: the scenes are gathered once per fit and padded
to the largest count of the batch, and `grid_fits.fit_grid` batches together only splits of
similar training counts, so little padding is computed. After the steps listed by
`eval_steps`, a separate compiled program scores every model on all scenes (three masks) with
frozen linear probes (the programs are `fit_programs`'). The host drives the loop between
compiled chunks of steps, which lets callers show progress. Models may also bring their own
targets and probes over the same scenes (`own`, data.OwnTargets: e.g. every replica of a
sweep) and their own object split (grid_fits.GridEntry.split).
"""
import logging
import time
import typing

import jax
import jax.numpy as jnp
import numpy as np

from bindjax.complexity import data as data_lib
from bindjax.complexity import fit_programs
from bindjax.frozen.probes import linear
from bindjax.runtime import engine
from bindjax.runtime import parallel
from bindjax.runtime import xla_options

def eval_steps(config):
  """The training steps after which models are evaluated (1-based counts of updates)."""
  first = 1 if config.eval_cadence == "original" else config.eval_every
  return list(range(first, config.steps + 1, config.eval_every))


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
  selects a candidate (`fit_settings.FitConfig.restart_holdout`).
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


class _Batch(typing.NamedTuple):
  """A batch of fits placed on the mesh: the models' points, training rows and masks, restart
  selection masks and own targets (replica-sharded), the data and probes (replicated), and the
  static arguments of every compiled program."""
  points: data_lib.Points
  rows: jax.Array
  valid: jax.Array
  selection: tuple
  data: data_lib.ComplexityData
  probes: typing.Any
  own: typing.Any
  statics: dict
  options: dict | None   # XLA compiler options of every program


def fit_models(model, data, probes, points, config, mesh=None, chunk_size=parallel.AUTO,
               memory_bytes=None, on_eval=None, keep_params=False, own=None):
  """Fits M models of one shape (M = len of points) as one compiled batch over the mesh.

  chunk_size: "auto", None (all at once) or an int. "auto" is 1 on a single CPU device (see
  `fit_programs._map_models`), else `engine.auto_chunk` of `bytes_per_model` against the device
  memory. Compiled programs are kept in the engine's bounded cache (`engine.compile_ahead`).
  on_eval: called after every evaluation as on_eval(steps_done_in_this_eval, train_loss_M).
  keep_params: also return the trained parameters (host numpy, leading axis M) as info["params"].
  own: data_lib.OwnTargets with one row per model: each model trains on and is scored by its own
  targets and probes (data's targets and `probes` are then unused).
  Returns (history dict of numpy [M, num_evals, ...], info dict with timings and chunking).
  """
  config = config.validate().for_family(model.family)
  num_models = int(np.shape(points.learning_rate_M)[0])
  mesh = mesh or engine.auto_mesh(num_models)
  rows_MxT, valid_MxT = data_lib.training_rows(data, points)
  adam = config.solver_for(model) == "adam"
  selection = restart_masks(data, points, config) if adam and config.restarts > 1 else ()
  (points_s, rows_s, valid_s, selection_s, own_s), valid = engine.place(
      (points, rows_MxT, valid_MxT, selection, own), mesh)
  chunk_size = _chunk_size(chunk_size, mesh, len(valid), model, data, rows_MxT.shape[1],
                           config, memory_bytes)
  data_r, probes_r = jax.device_put((data, probes), parallel.replicated_sharding(mesh))
  statics = {"model": model, "chunk_size": chunk_size,
             "num_shards": parallel.num_replica_shards(mesh)}
  options = (xla_options.compiler_options(engine.platform(mesh), fast_compile=True)
             if config.fast_compile else None)
  batch = _Batch(points_s, rows_s, valid_s, selection_s, data_r, probes_r, own_s, statics,
                 options)
  info = _batch_info(model, num_models, valid, valid_MxT, chunk_size)
  if not adam:
    return _fit_coordinates(batch, config, info, keep_params)
  return _fit_adam(batch, mesh, config, info, keep_params, on_eval)


def _chunk_size(chunk_size, mesh, num_padded, model, data, num_train_scenes, config,
                memory_bytes):
  """fit_models' chunk_size with "auto" resolved."""
  if chunk_size == parallel.AUTO and engine.is_single_cpu(mesh):
    return 1  # Unbatched, one model at a time: see fit_programs._map_models.
  if chunk_size == parallel.AUTO:
    # The restart candidates of one fit (or the solver's starts) are held at once (one vmap).
    adam = config.solver_for(model) == "adam"
    copies = config.restarts if adam else config.solver_starts
    return engine.auto_chunk(
        mesh, num_padded, bytes_per_model(model, num_train_scenes, data.num_scenes,
                                          data.num_unique) * copies,
        memory_bytes=memory_bytes)
  return chunk_size


def _initial_state(batch, config):
  """(params, Adam state) of every model, the kept restart candidates and their errors (None
  for a single start), and the seconds the selection ran."""
  if config.restarts == 1:
    init = engine.compile_ahead(fit_programs.init_points, batch.points, options=batch.options,
                                **batch.statics)
    return init(batch.points), None, 0.0
  select = engine.compile_ahead(fit_programs.select_points, batch.points, *batch.selection,
                                batch.data, batch.own, config=config, options=batch.options,
                                **batch.statics)
  start = time.perf_counter()
  initial, *selected = select(batch.points, *batch.selection, batch.data, batch.own)
  selected = parallel.to_host(selected)
  return initial, selected, time.perf_counter() - start


def _fit_adam(batch, mesh, config, info, keep_params, on_eval):
  """fit_models for Adam: the restart selection if any, then training with an evaluation after
  every step of `eval_steps`."""
  num_models = info["num_models"]
  start = time.perf_counter()
  initial, selected, select_s = _initial_state(batch, config)
  # Placed like the points, so every training call takes and returns the same sharding.
  state = jax.device_put(initial, parallel.replica_sharding(mesh))
  zero = np.int32(0)
  train = engine.compile_ahead(fit_programs.train_points, batch.points, state, batch.rows,
                               batch.valid, zero, zero, batch.data, batch.own, config=config,
                               options=batch.options, **batch.statics)
  evaluate = engine.compile_ahead(fit_programs.evaluate_points, batch.points, state[0],
                                  batch.data, batch.probes, batch.own, config=config,
                                  options=batch.options, **batch.statics)
  compile_s = time.perf_counter() - start - select_s
  state, history, train_s, eval_s = _train_and_evaluate(batch, state, train, evaluate, config,
                                                        num_models, on_eval)
  memory = parallel.compiled_memory_bytes(train)
  info.update({"solver": "adam",
               "compile_s": compile_s, "select_s": select_s, "train_s": train_s,
               "eval_s": eval_s, "run_s": select_s + train_s + eval_s,
               "compiled_temp_bytes": memory[0] if memory else None,
               "restarts": config.restarts, "identified": None,
               # Per model: the kept candidate and its selection error (None: a single start).
               "restart_candidate": None if selected is None else selected[0][:num_models].tolist(),
               "restart_error": None if selected is None else selected[1][:num_models].tolist()})
  if keep_params:
    info["params"] = jax.tree_util.tree_map(lambda x: x[:num_models], parallel.to_host(state[0]))
  logging.info("%s: %d models, compile %.1fs, select %.1fs, train %.1fs, evaluate %.1fs",
               info["model"], num_models, compile_s, select_s, train_s, eval_s)
  return history, info


def _train_and_evaluate(batch, state, train, evaluate, config, num_models, on_eval):
  """The host loop: train to each step of `eval_steps`, then evaluate. Returns (final state,
  history dict of numpy [M, num_evals, ...], training seconds, evaluation seconds)."""
  train_s = eval_s = 0.0
  history, done = [], 0
  for step in eval_steps(config):
    start = time.perf_counter()
    state, loss_M = train(batch.points, state, batch.rows, batch.valid, np.int32(done),
                          np.int32(step - done), batch.data, batch.own)
    loss_M = parallel.to_host(loss_M)[:num_models]
    train_s += time.perf_counter() - start
    start = time.perf_counter()
    metrics = parallel.to_host(evaluate(batch.points, state[0], batch.data, batch.probes,
                                        batch.own))
    eval_s += time.perf_counter() - start
    metrics["train_loss"] = loss_M
    history.append(metrics)
    if on_eval is not None:
      on_eval(step - done, loss_M)
    done = step
  history = {k: np.stack([h[k][:num_models] for h in history], axis=1) for k in history[0]}
  return state, history, train_s, eval_s


def _batch_info(model, num_models, valid, valid_MxT, chunk_size):
  return {"model": model.name, "num_models": num_models, "padded_models": len(valid),
          "train_scenes_padded": int(valid_MxT.shape[1]),
          "train_scenes": valid_MxT.sum(-1).tolist(), "chunk_size": chunk_size}


def _fit_coordinates(batch, config, info, keep_params):
  """fit_models for the coordinate solver: one solve, one evaluation. The history repeats that
  evaluation at every step of `eval_steps`, so that it has the shape of a trained fit's."""
  num_models = info["num_models"]
  start = time.perf_counter()
  solve = engine.compile_ahead(fit_programs.solve_points, batch.points, batch.rows, batch.valid,
                               batch.data, batch.own, config=config, options=batch.options,
                               **batch.statics)
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  params, loss_M, identified_M = solve(batch.points, batch.rows, batch.valid, batch.data,
                                       batch.own)
  loss_M, identified_M = parallel.to_host((loss_M, identified_M))
  train_s = time.perf_counter() - start
  start = time.perf_counter()
  evaluate = engine.compile_ahead(fit_programs.evaluate_points, batch.points, params, batch.data,
                                  batch.probes, batch.own, config=config, options=batch.options,
                                  **batch.statics)
  compile_s += time.perf_counter() - start
  start = time.perf_counter()
  metrics = parallel.to_host(evaluate(batch.points, params, batch.data, batch.probes, batch.own))
  eval_s = time.perf_counter() - start
  metrics["train_loss"] = loss_M
  num_evals = len(eval_steps(config))
  history = {k: np.repeat(v[:num_models, None], num_evals, axis=1) for k, v in metrics.items()}
  info.update({"solver": "coordinate", "solver_projection": config.solver_projection,
               "solver_iterations": config.solver_iterations,
               "compile_s": compile_s, "select_s": 0.0,
               "train_s": train_s, "eval_s": eval_s, "run_s": train_s + eval_s,
               "compiled_temp_bytes": None, "restarts": 1, "restart_candidate": None,
               "restart_error": None, "identified": identified_M[:num_models].tolist()})
  if keep_params:
    info["params"] = jax.tree_util.tree_map(lambda x: x[:num_models], parallel.to_host(params))
  logging.info("%s: %d models, coordinate solver, compile %.1fs, solve %.1fs, evaluate %.1fs",
               info["model"], num_models, compile_s, train_s, eval_s)
  return history, info
