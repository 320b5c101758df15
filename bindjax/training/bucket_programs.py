"""A bucket's compiled programs: its replicas' train step, evaluation and state, vmapped over the
replica axis and compiled ahead of time on the mesh by the replica engine
(`bindjax.runtime.engine`).

Each bucket (`bindjax.training.grid.Bucket`) trains in ONE compiled program, vmap(train_step) over a
leading replica axis in a loop of as many steps as it is asked for, sharded along the mesh's
"replica" axis, padded to a multiple of the shard count. A replica whose loss or parameters
become non-finite is frozen at its last finite state (`alive`, `diverged_step`). With keep_best,
each replica's parameters at its best held-out object accuracy ride in the state. Checkpoints
hold the towers in the per-layer layout of docs/models.md (`checkpoint_state`, `restore_state`),
whichever layout the model trains in.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bindjax.core import models
from bindjax.runtime import engine
from bindjax.runtime import parallel
from bindjax.runtime import program_store
from bindjax.runtime import xla_options
from bindjax.training import train
from bindjax.workdir import results


def _replica_step(spec, scene_sharding=None):
  """One replica's masked train step: a non-finite update leaves the state as it was."""

  def step(state, inputs, alive, diverged_step):
    new_state, metrics = train.train_step(state, inputs, spec, scene_sharding)
    # The norm, not a test of each parameter: parameters whose sum of squares overflows count as
    # diverged (at learning rate 1e38 the first update leaves them finite, near 1e38, and the
    # run is reported diverged at step 1), and results keep that definition.
    finite = jnp.isfinite(metrics[results.LOSS]) & jnp.isfinite(optax.tree.norm(new_state.params))
    ok = alive & finite
    new_state = jax.tree_util.tree_map(lambda n, o: jnp.where(ok, n, o), new_state, state)
    diverged_step = jnp.where(alive & ~finite, state.step + 1, diverged_step)
    metrics = {name: metrics[name] for name in results.TRAIN_METRICS}
    metrics[results.DIVERGED_STEP] = diverged_step
    return new_state, ok, diverged_step, metrics

  return step


def _bucket_functions(spec, mesh, chunk_size, keep_best):
  """(init, run, eval) of a whole bucket: vmapped (chunked) over replicas, jitted on the mesh.

  run(sweep_state, inputs, num_steps) takes `num_steps` train steps in one dispatch and returns
  the metrics of the last one.
  """
  shards = parallel.num_replica_shards(mesh)
  sharding = parallel.replica_sharding(mesh)
  # With a "data" axis, each replica's scenes are split over its data devices.
  scene_sharding = parallel.data_sharding(mesh)
  vstep = parallel.chunked_vmap(_replica_step(spec, scene_sharding), chunk_size,
                                num_shards=shards, spmd_axis_name=parallel.REPLICA_AXIS)

  def bucket_init(inputs):
    return init_bucket_state(inputs, spec, keep_best)

  def bucket_step(sweep_state, inputs):
    state, alive, diverged_step, metrics = vstep(
        sweep_state["train"], inputs, sweep_state["alive"], sweep_state["diverged_step"])
    return dict(sweep_state, train=state, alive=alive, diverged_step=diverged_step), metrics

  # Jitted so that its trace is made once: the loop's carry needs the metrics' shapes before
  # the loop traces the step.
  traced_step = jax.jit(bucket_step)

  def bucket_run(sweep_state, inputs, num_steps):
    # A traced trip count (a while loop): one program for every number of steps, where a scan
    # of fixed length would need a second program for the remainders; the step compiles once.
    metrics = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                           jax.eval_shape(traced_step, sweep_state, inputs)[1])
    return jax.lax.fori_loop(0, num_steps, lambda _, carry: traced_step(carry[0], inputs),
                             (sweep_state, metrics))

  def bucket_eval(sweep_state, inputs, step):
    def one(p, h):
      return train.eval_step(p, train.eval_key(h.key, step), h, spec, scene_sharding)
    metrics = parallel.chunked_vmap(one, chunk_size, num_shards=shards,
                                    spmd_axis_name=parallel.REPLICA_AXIS)(
                                        sweep_state["train"].params, inputs)
    if keep_best:
      sweep_state = dict(sweep_state, best=_update_best(
          sweep_state, metrics[results.SELECTION_METRIC], step))
    return sweep_state, metrics

  return (jax.jit(bucket_init, out_shardings=sharding),
          jax.jit(bucket_run, out_shardings=sharding, donate_argnums=0),
          jax.jit(bucket_eval, out_shardings=sharding, donate_argnums=0))


def init_bucket_state(inputs, spec, keep_best):
  """A bucket's state for stacked `inputs`: the replicas' TrainStates, which are still alive, when
  each diverged (-1: not), and with keep_best each one's best parameters, value and step."""
  state = jax.vmap(lambda h: train.init(h.key, spec, h))(inputs)
  size = inputs.num_train.shape[0]
  sweep_state = {"train": state, "alive": jnp.ones((size,), bool),
                 "diverged_step": jnp.full((size,), -1, jnp.int32)}
  if keep_best:
    sweep_state["best"] = {"params": state.params,
                           "value": jnp.full((size,), -jnp.inf, jnp.float32),
                           "step": jnp.full((size,), -1, jnp.int32)}
  return sweep_state


def _update_best(sweep_state, value_R, step):
  """The best-parameters record after an evaluation: replicas alive whose value improved take
  their current parameters (NaN never improves; ties keep the earlier step)."""
  best = sweep_state["best"]
  improved_R = sweep_state["alive"] & (value_R > best["value"])

  def pick(new, old):
    return jnp.where(improved_R.reshape((-1,) + (1,) * (new.ndim - 1)), new, old)

  return {"params": jax.tree_util.tree_map(pick, sweep_state["train"].params, best["params"]),
          "value": jnp.where(improved_R, value_R, best["value"]),
          "step": jnp.where(improved_R, step, best["step"])}


def estimate_step_bytes(spec):
  """Rough activation memory (bytes) of one replica's train step, for automatic chunking: the
  towers' kept activations (`models.tower_activation_floats`) for the scene batch and the query
  set, times two for gradients, or the evaluation's when larger."""
  m, space, sampler = spec.model, spec.space, spec.sampler
  num_queries = sampler.num_concept_queries(space) + sampler.num_object_queries(space)
  floats = (models.tower_activation_floats(m, sampler.batch_size, space.scene_length)
            + models.tower_activation_floats(m, num_queries, space.query_length))
  eval_floats = models.tower_activation_floats(m, spec.eval_sampler.batch_size,
                                               space.scene_length) / 2
  return int(4 * 2 * max(floats, eval_floats))


def compile_bucket(spec, mesh, inputs, chunk_setting=parallel.AUTO,
                   memory_fraction=parallel.DEFAULT_MEMORY_FRACTION, log=print,
                   fast_compile=False, keep_best=False):
  """Compiled (init, run, eval, chunk_size) for a bucket's sharded stacked `inputs`.

  run(state, inputs, global_scalar(n, mesh)) takes n train steps in one dispatch (one program
  for every n) and returns the state and the metrics of the last step; eval(state, inputs,
  global_scalar(step, mesh)) evaluates the state after `step` steps.

  chunk_setting (`parallel.chunk_setting`): None = all replicas at once, n = n replicas at a
  time (over all devices), "auto" = from the compiled program's memory analysis (or
  `estimate_step_bytes`) against the device memory and, on CPU, each core's share of the
  last-level cache (`engine.auto_chunk`). Compiled programs are cached per (spec.program, mesh,
  replicas, chunk) in the engine's bounded cache (`engine.cached`).
  fast_compile: compile with xla_options.FAST_COMPILE_OPTIONS. Every program gets
  `xla_options.compiler_options` for the mesh's platform.
  keep_best: the state carries each replica's best parameters (`init_bucket_state`); eval
  returns the updated state beside the metrics either way.
  """
  # The loop's settings (steps, cadence) are not part of the programs: the schedule's length
  # rides in `inputs`, so buckets that differ only there share them.
  spec = spec.program
  options = xla_options.compiler_options(engine.platform(mesh), fast_compile)
  chunk = parallel.chunk_setting(chunk_setting, "config.sweep.chunk_size")
  # One process may load one stored set of a bucket's programs: on XLA:CPU (jax 0.10.2) a second
  # set, loaded beside the first, fails when it runs ("Function wrapped_broadcast.4 not found").
  # Automatic chunking has already built the unchunked set, so a chunked set is compiled afresh.
  store = True
  if chunk == parallel.AUTO:
    chunk = _auto_chunk(spec, mesh, inputs, memory_fraction, log, options, keep_best)
    store = chunk is None
  return _compiled(spec, mesh, inputs, chunk, options, keep_best, log, store) + (chunk,)


def _compiled(spec, mesh, inputs, chunk, options, keep_best, log, store=True):
  size = inputs.num_train.shape[0]
  key = (spec, mesh, size, chunk, tuple(sorted((options or {}).items())), keep_best)

  def compile_programs():
    init_fn, run_fn, eval_fn = _bucket_functions(spec, mesh, chunk, keep_best)
    abstract_state = abstract_bucket_state(spec, mesh, inputs, keep_best)
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=parallel.replicated_sharding(mesh))
    # Sharding must never change the random numbers a replica sees; set for these programs
    # only, so importing bindjax changes no global JAX setting.
    with jax.threefry_partitionable(True):
      return (init_fn.lower(inputs).compile(options),
              run_fn.lower(abstract_state, inputs, scalar).compile(options),
              eval_fn.lower(abstract_state, inputs, scalar).compile(options))

  def build():
    if not store:
      return compile_programs()
    signature = jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), inputs)
    return program_store.load_or_build(("bucket", repr(key), repr(signature)),
                                       list(mesh.devices.flat), compile_programs, log)

  return engine.cached(key, build)


def abstract_bucket_state(spec, mesh, inputs, keep_best):
  """The bucket state's shapes, dtypes and shardings on `mesh` (nothing is computed)."""
  sharding = parallel.replica_sharding(mesh)
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
      jax.eval_shape(lambda h: init_bucket_state(h, spec, keep_best), inputs))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _relayout(state, convert, sharding):
  return jax.lax.with_sharding_constraint(jax.vmap(convert)(state), sharding)


def checkpoint_state(state, sharding):
  """The bucket state as its checkpoints hold it: every tower in the per-layer layout (the
  layout of the files written before the blocks were scanned)."""
  return _relayout(state, models.unstack_blocks, sharding)


def checkpoint_target(target, sharding):
  """The abstract bucket state `target` as its checkpoints hold it (`checkpoint_state`), every
  leaf with `sharding`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      jax.eval_shape(jax.vmap(models.unstack_blocks), target))


def from_checkpoint(tree, sharding):
  """`tree` (the bucket state or any part of it, as its checkpoints hold it) in the layout the
  model trains in, every leaf with `sharding`."""
  return _relayout(tree, models.stack_blocks, sharding)


def restore_state(restore, target, sharding, **kwargs):
  """(step, state, metadata) of `restore` (a `checkpoint.Checkpoints` restore method, called
  with `kwargs`) into the abstract bucket state `target`, all of whose leaves have `sharding`;
  None when there is no checkpoint."""
  restored = restore(checkpoint_target(target, sharding), **kwargs)
  if restored is None:
    return None
  step, state, metadata = restored
  return step, from_checkpoint(state, sharding), metadata


def _auto_chunk(spec, mesh, inputs, memory_fraction, log, options, keep_best):
  size = inputs.num_train.shape[0]
  # The unchunked program is compiled anyway when it fits, so measuring it costs nothing then.
  _, run, _ = _compiled(spec, mesh, inputs, None, options, keep_best, log)
  memory = parallel.compiled_memory_bytes(run)
  temp, fixed = memory if memory else (0, 0)
  per_device = size // parallel.num_replica_shards(mesh)
  per_replica = temp / per_device if temp else estimate_step_bytes(spec)
  return engine.auto_chunk(mesh, size, per_replica, fixed_bytes=fixed,
                           memory_fraction=memory_fraction, within_cpu_cache=True, log=log)


def global_scalar(value, mesh):
  """`value` as the int32 scalar, replicated on `mesh`, that the bucket programs take (the
  number of steps of run, the step of eval)."""
  x = np.asarray(value, np.int32)
  return jax.make_array_from_callback((), parallel.replicated_sharding(mesh), lambda _: x)
