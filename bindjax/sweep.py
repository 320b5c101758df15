"""Coverage sweeps: many small dual encoders trained together, vmapped and sharded.

`config.grid` declares the sweep (see experiments/coverage_sweep.py):

  grid.spaces          ((C, V), ...) or ((C, V, K), ...) (V may be a tuple of per-concept sizes)
  grid.coverages       (ρ, ...)
  grid.seeds           (s, ...)   (model init, data and the coverage split of a replica)
  grid.learning_rates  () = config.optimizer.learning_rate
  grid.weight_decays   () = config.optimizer.weight_decay
  grid.models          () = config.model; else dicts of config.model overrides, each with an
                       optional "name"
(Tuples, because ml_collections overrides tuples but not lists on the command line, where a
comma list or a single value is enough: --config.grid.seeds=0,1,2.)

The grid expands to replicas (product, in that order). Replicas whose static settings
(`train.RunSpec`: space, model, batch) agree form a *bucket*; each bucket trains in ONE jitted
program, vmap(train_step) over a leading replica axis in a loop of as many steps as it is asked
for, sharded along the mesh's "replica" axis, padded to a multiple of the shard count. One
dispatch runs every step up to the next one whose rows are written (`dispatch_ends`), so a long
stretch between logged steps costs one dispatch, and the rows do not depend on it. Coverage,
seed, learning rate and weight decay are per-replica arrays (a permutation table plus a count),
so they never recompile.

A config without a grid (experiments/train.py) runs as a sweep of one replica
(`single_run_config`); that is `bindjax train`. The workdir layout, result rows and best/final
selection are `bindjax.results`'. With `checkpoint.keep_best`, each replica's parameters at its
best held-out object accuracy ride in the bucket's state (and so in every checkpoint).

A run holds the workdir's lock for its whole life (`bindjax.workdir_lock`). A killed sweep
resumes from each bucket's newest checkpoint that verifies (`checkpoint.Checkpoints`, falling
back past damaged ones); each checkpoint holds its bucket's rows up to its step, so results.jsonl
is rebuilt from them (any row lost or damaged before a checkpoint comes back, and the run says
so), rows past it are recomputed bit for bit, and results equal an uninterrupted sweep. Nothing
is rewritten before the restore it depends on has succeeded. A replica whose loss or
parameters become non-finite is frozen at its last finite state, flagged in a "diverged" row,
and left out of later rows; the others continue. A bucket whose replicas have all diverged
stops there. Checkpoints hold the towers in the per-layer layout of docs/models.md
(`checkpoint_state`, `restore_state`), whichever layout the model trains in.
"""
import collections
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import os
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bindjax import checkpoint
from bindjax import errors
from bindjax import files
from bindjax import models
from bindjax import parallel
from bindjax import results
from bindjax import train
from bindjax import workdir_lock
from bindjax import world
from bindjax import xla_options



@dataclasses.dataclass(frozen=True)
class Replica:
  """One point of the grid; `coordinates()` tags its result rows."""
  index: int
  bucket: int
  num_concepts: int
  num_values: object         # int, or tuple of per-concept sizes
  max_objects: int
  space_size: int
  coverage: float
  seed: int
  learning_rate: float
  weight_decay: float
  model: str
  num_train: int

  def coordinates(self):
    """The replica's `results.COORDINATES` as a dict (V a list when per-concept)."""
    v = list(self.num_values) if isinstance(self.num_values, tuple) else self.num_values
    return dict(zip(results.COORDINATES, (
        self.index, self.bucket, self.num_concepts, v, self.max_objects, self.space_size,
        self.coverage, self.seed, self.learning_rate, self.weight_decay, self.model,
        self.num_train)))


@dataclasses.dataclass
class Bucket:
  """Replicas sharing one RunSpec (one compiled program)."""
  index: int
  spec: train.RunSpec
  replicas: list
  hypers: list
  splits: list     # world.CoverageSplit per replica

  def stacked_hyper(self):
    """Hyper with a leading replica axis (numpy)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *self.hypers)


def _as_list(value, name):
  if isinstance(value, (list, tuple)):
    return list(value)
  raise ValueError(f"config.grid.{name}={value!r}: expected a tuple or list")


def _space_entry(entry, default_k):
  if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
    raise ValueError(f"config.grid.spaces entry {entry!r}: expected (C, V) or (C, V, K)")
  c, v = entry[0], entry[1]
  k = entry[2] if len(entry) == 3 else default_k
  v = tuple(v) if isinstance(v, (list, tuple)) else v
  return int(c), v, int(k)


def expand_grid(config):
  """Replicas and buckets of config.grid, validated (ValueError names the bad field).

  Returns (replicas, buckets). Replica order: spaces, models, learning rates, weight decays,
  coverages, seeds (the last varies fastest). Buckets appear in order of first replica.
  """
  if "grid" not in config:
    raise ValueError("config.grid is missing: a sweep needs grid.spaces, grid.coverages and "
                     "grid.seeds (see experiments/coverage_sweep.py)")
  grid = config.grid
  spaces = _as_list(grid.get("spaces"), "spaces")
  coverages = _as_list(grid.get("coverages"), "coverages")
  seeds = _as_list(grid.get("seeds"), "seeds")
  for name, values in (("spaces", spaces), ("coverages", coverages), ("seeds", seeds)):
    if not values:
      raise ValueError(f"config.grid.{name}=(): expected at least one value")
  lrs = _as_list(grid.get("learning_rates", []) or [], "learning_rates") or [
      config.optimizer.learning_rate]
  wds = _as_list(grid.get("weight_decays", []) or [], "weight_decays") or [
      config.optimizer.weight_decay]
  models = _as_list(grid.get("models", []) or [], "models") or [{}]
  for i, seed in enumerate(seeds):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"config.grid.seeds[{i}]={seed!r}: expected an integer >= 0")
  for i, coverage in enumerate(coverages):
    try:
      world.check_coverage(coverage)
    except ValueError:
      raise ValueError(f"config.grid.coverages[{i}]={coverage!r}: expected a number in "
                       f"(0, 1]") from None
  base = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  replicas, buckets, by_spec = [], [], {}
  for space_entry, model, lr, wd, coverage, seed in itertools.product(
      spaces, models, lrs, wds, coverages, seeds):
    c, v, k = _space_entry(space_entry, int(config.space.max_objects))
    model = dict(model)
    model_name = str(model.pop("name", "default" if not model else
                               ",".join(f"{a}={b}" for a, b in sorted(model.items()))))
    replica_config = ml_collections.ConfigDict(base)
    replica_config.space.num_concepts = c
    replica_config.space.num_values = list(v) if isinstance(v, tuple) else v
    replica_config.space.max_objects = k
    replica_config.coverage = float(coverage)
    replica_config.seed = int(seed)
    replica_config.optimizer.learning_rate = float(lr)
    replica_config.optimizer.weight_decay = float(wd)
    for key, value in model.items():
      if key not in replica_config.model:
        raise ValueError(f"config.grid.models entry {model!r}: unknown model field {key!r}; "
                         f"expected one of {sorted(replica_config.model.keys())}")
      replica_config.model[key] = value
    spec = train.RunSpec.from_config(replica_config)
    hyper, split = train.hyper_from_config(replica_config, spec)
    if spec not in by_spec:
      by_spec[spec] = Bucket(len(buckets), spec, [], [], [])
      buckets.append(by_spec[spec])
    bucket = by_spec[spec]
    replica = Replica(index=len(replicas), bucket=bucket.index, num_concepts=c,
                      num_values=v, max_objects=k, space_size=spec.space.num_objects,
                      coverage=float(coverage), seed=int(seed), learning_rate=float(lr),
                      weight_decay=float(wd), model=model_name, num_train=int(split.num_train))
    replicas.append(replica)
    bucket.replicas.append(replica)
    bucket.hypers.append(hyper)
    bucket.splits.append(split)
  return replicas, buckets


def single_run_config(config):
  """A single-run config (experiments/train.py: no grid) as the config of a one-replica sweep.

  The grid holds the run's own space, coverage and seed; learning rate, weight decay and model
  come from the config as they do for any sweep without those axes.
  """
  if "grid" in config:
    raise ValueError("config.grid is set: a config with a grid is a sweep; run it with "
                     "`bindjax sweep`")
  train.RunSpec.from_config(config)   # errors name the single run's own fields
  c = ml_collections.ConfigDict(config.to_dict())
  values = c.space.num_values
  values = tuple(values) if isinstance(values, (list, tuple)) else values
  c.grid = ml_collections.ConfigDict(dict(
      spaces=((c.space.num_concepts, values, c.space.max_objects),), coverages=(c.coverage,),
      seeds=(c.seed,), learning_rates=(), weight_decays=(), models=()))
  return c


# --------------------------------------------------------------------------------------------
# Compiled bucket programs


def _replica_step(spec, scene_sharding=None):
  """One replica's masked train step: a non-finite update leaves the state as it was."""

  def step(state, hyper, alive, diverged_step):
    new_state, metrics = train.train_step(state, hyper, spec, scene_sharding)
    # The norm, not a test of each parameter: parameters whose sum of squares overflows count as
    # diverged (at learning rate 1e38 the first update leaves them finite, near 1e38, and the
    # run is reported diverged at step 1), and results keep that definition.
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(optax.tree.norm(new_state.params))
    ok = alive & finite
    new_state = jax.tree_util.tree_map(lambda n, o: jnp.where(ok, n, o), new_state, state)
    diverged_step = jnp.where(alive & ~finite, state.step + 1, diverged_step)
    metrics = {name: metrics[name] for name in results.TRAIN_METRICS}
    metrics["diverged_step"] = diverged_step
    return new_state, ok, diverged_step, metrics

  return step


def _bucket_functions(spec, mesh, chunk_size, keep_best):
  """(init, run, eval) of a whole bucket: vmapped (chunked) over replicas, jitted on the mesh.

  run(sweep_state, hyper, num_steps) takes `num_steps` train steps in one dispatch and returns
  the metrics of the last one.
  """
  shards = parallel.num_replica_shards(mesh)
  sharding = parallel.replica_sharding(mesh)
  # With a "data" axis, each replica's scenes are split over its data devices.
  scene_sharding = parallel.data_sharding(mesh)
  vstep = parallel.chunked_vmap(_replica_step(spec, scene_sharding), chunk_size,
                                num_shards=shards, spmd_axis_name=parallel.REPLICA_AXIS)

  def bucket_init(hyper):
    return init_bucket_state(hyper, spec, keep_best)

  def bucket_step(sweep_state, hyper):
    state, alive, diverged_step, metrics = vstep(
        sweep_state["train"], hyper, sweep_state["alive"], sweep_state["diverged_step"])
    return dict(sweep_state, train=state, alive=alive, diverged_step=diverged_step), metrics

  def bucket_run(sweep_state, hyper, num_steps):
    # A traced trip count (a while loop): one program for every number of steps, where a scan
    # of fixed length would need a second program for the remainders; the step compiles once.
    metrics = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                           jax.eval_shape(bucket_step, sweep_state, hyper)[1])
    return jax.lax.fori_loop(0, num_steps, lambda _, carry: bucket_step(carry[0], hyper),
                             (sweep_state, metrics))

  def bucket_eval(sweep_state, hyper, step):
    def one(p, h):
      return train.eval_step(p, train.eval_key(h.key, step), h, spec, scene_sharding)
    metrics = parallel.chunked_vmap(one, chunk_size, num_shards=shards,
                                    spmd_axis_name=parallel.REPLICA_AXIS)(
                                        sweep_state["train"].params, hyper)
    if keep_best:
      sweep_state = dict(sweep_state, best=_update_best(
          sweep_state, metrics[results.SELECTION_METRIC], step))
    return sweep_state, metrics

  return (jax.jit(bucket_init, out_shardings=sharding),
          jax.jit(bucket_run, out_shardings=sharding, donate_argnums=0),
          jax.jit(bucket_eval, out_shardings=sharding, donate_argnums=0))


def init_bucket_state(hyper, spec, keep_best):
  """A bucket's state for stacked `hyper`: the replicas' TrainStates, which are still alive, when
  each diverged (-1: not), and with keep_best each one's best parameters, value and step."""
  state = jax.vmap(lambda h: train.init(h.key, spec, h))(hyper)
  size = hyper.num_train.shape[0]
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
  """Rough activation memory (bytes) of one replica's train step, for automatic chunking.

  Counts the float32 activations the backward pass keeps per block (attention scores, q/k/v,
  MLP hidden, norms, residuals) for the scene batch and the query set, times two for gradients.
  """
  m = spec.model
  space, sampler = spec.space, spec.sampler
  num_queries = sampler.num_concept_queries(space) + sampler.num_object_queries(space)

  def tower(sequences, length):
    per_block = length * (12 * m.d_model + 3 * m.mlp_width + 2 * m.num_heads * length)
    return sequences * per_block * m.num_layers

  floats = tower(sampler.batch_size, space.scene_length) + tower(num_queries, space.query_length)
  eval_floats = tower(spec.eval_sampler.batch_size, space.scene_length) / 2
  return int(4 * 2 * max(floats, eval_floats))


# Bounded: every compiled program holds its machine code in memory maps of its own, and a
# long-lived process (a notebook, the test suite) that compiled programs without end ran out of
# the kernel's per-process map limit and crashed inside the next compile.
_PROGRAM_CACHE = collections.OrderedDict()
_PROGRAM_CACHE_SIZE = 16


def compile_bucket(spec, mesh, hyper, chunk_setting=parallel.AUTO,
                   memory_fraction=parallel.DEFAULT_MEMORY_FRACTION, log=print,
                   fast_compile=False, keep_best=False):
  """Compiled (init, run, eval, chunk_size) for a bucket's sharded stacked `hyper`.

  run(state, hyper, global_scalar(n, mesh)) takes n train steps in one dispatch (one program
  for every n) and returns the state and the metrics of the last step; eval(state, hyper,
  global_scalar(step, mesh)) evaluates the state after `step` steps.

  chunk_setting (`parallel.chunk_setting`): None = all replicas at once, n = n replicas at a
  time (over all devices), "auto" = from the compiled program's memory analysis (or
  `estimate_step_bytes`) against the device memory and, on CPU, each core's share of the
  last-level cache. The last 16 compiled programs are cached per (spec, mesh, replicas,
  chunk).
  fast_compile: compile with xla_options.FAST_COMPILE_OPTIONS. Every program gets
  `xla_options.compiler_options` for the mesh's platform.
  keep_best: the state carries each replica's best parameters (`init_bucket_state`); eval
  returns the updated state beside the metrics either way.
  """
  options = xla_options.compiler_options(_platform(mesh), fast_compile)
  chunk = parallel.chunk_setting(chunk_setting, "config.sweep.chunk_size")
  if chunk == parallel.AUTO:
    chunk = _auto_chunk(spec, mesh, hyper, memory_fraction, log, options, keep_best)
  return _compiled(spec, mesh, hyper, chunk, options, keep_best) + (chunk,)


def _compiled(spec, mesh, hyper, chunk, options, keep_best):
  size = hyper.num_train.shape[0]
  key = (spec, mesh, size, chunk, tuple(sorted((options or {}).items())), keep_best)
  if key in _PROGRAM_CACHE:
    _PROGRAM_CACHE.move_to_end(key)
  else:
    init_fn, run_fn, eval_fn = _bucket_functions(spec, mesh, chunk, keep_best)
    abstract_state = abstract_bucket_state(spec, mesh, hyper, keep_best)
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=parallel.replicated_sharding(mesh))
    # Sharding must never change the random numbers a replica sees; set for these programs
    # only, so importing bindjax changes no global JAX setting.
    with jax.threefry_partitionable(True):
      _PROGRAM_CACHE[key] = (
          init_fn.lower(hyper).compile(options),
          run_fn.lower(abstract_state, hyper, scalar).compile(options),
          eval_fn.lower(abstract_state, hyper, scalar).compile(options))
    while len(_PROGRAM_CACHE) > _PROGRAM_CACHE_SIZE:
      _PROGRAM_CACHE.popitem(last=False)
  return _PROGRAM_CACHE[key]


def abstract_bucket_state(spec, mesh, hyper, keep_best):
  """The bucket state's shapes, dtypes and shardings on `mesh` (nothing is computed)."""
  sharding = parallel.replica_sharding(mesh)
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
      jax.eval_shape(lambda h: init_bucket_state(h, spec, keep_best), hyper))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _relayout(state, convert, sharding):
  return jax.lax.with_sharding_constraint(jax.vmap(convert)(state), sharding)


def checkpoint_state(state, sharding):
  """The bucket state as its checkpoints hold it: every tower in the per-layer layout (the
  layout of the files written before the blocks were scanned)."""
  return _relayout(state, models.unstack_blocks, sharding)


def restore_state(restore, target, sharding, **kwargs):
  """(step, state, metadata) of `restore` (a `checkpoint.Checkpoints` restore method, called
  with `kwargs`) into the abstract bucket state `target`, all of whose leaves have `sharding`;
  None when there is no checkpoint."""
  per_layer = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                           jax.eval_shape(jax.vmap(models.unstack_blocks), target))
  restored = restore(per_layer, **kwargs)
  if restored is None:
    return None
  step, state, metadata = restored
  return step, _relayout(state, models.stack_blocks, sharding), metadata


def _platform(mesh):
  return mesh.devices.flat[0].platform


def _auto_chunk(spec, mesh, hyper, memory_fraction, log, options, keep_best):
  size = hyper.num_train.shape[0]
  shards = parallel.num_replica_shards(mesh)
  per_device = size // shards
  # The unchunked program is compiled anyway when it fits, so measuring it costs nothing then.
  _, run, _ = _compiled(spec, mesh, hyper, None, options, keep_best)
  memory = parallel.compiled_memory_bytes(run)
  temp, fixed = memory if memory else (0, 0)
  per_replica = temp / per_device if temp else estimate_step_bytes(spec)
  chunk = parallel.choose_chunk_size(per_replica, per_device, fixed_bytes=fixed,
                                     memory_fraction=memory_fraction, num_shards=shards)
  reason = "device memory"
  cache = parallel.cpu_cache_bytes_per_core() if _platform(mesh) == "cpu" else None
  if cache:
    # A CPU core streams a chunk's activations through its share of the last-level cache: the
    # cpu preset's model ran 1.4× faster one replica per core at a time than eight at once
    # (experiments/benchmarks/results/sweep_throughput_cpu{,_unchunked}.md); the small model,
    # well inside the cache, ran best unchunked.
    cache_chunk = parallel.choose_chunk_size(per_replica, per_device, memory_bytes=cache,
                                             memory_fraction=1.0, num_shards=shards)
    if cache_chunk is not None and (chunk is None or cache_chunk < chunk):
      chunk, reason = cache_chunk, f"the CPU's {cache / 2**20:.0f} MiB cache share per core"
  if chunk is not None:
    log(f"chunking: {chunk} replicas at a time (≈{per_replica / 2**20:.1f} MiB per replica, "
        f"{per_device} per device; fits {reason})")
  return chunk


def global_scalar(value, mesh):
  """`value` as the int32 scalar, replicated on `mesh`, that the bucket programs take (the
  number of steps of run, the step of eval)."""
  x = np.asarray(value, np.int32)
  return jax.make_array_from_callback((), parallel.replicated_sharding(mesh), lambda _: x)


# --------------------------------------------------------------------------------------------
# Results


class _Results:
  """The rows of one sweep, by bucket; results.jsonl (process 0 writes it) is their view.

  Each checkpoint of a bucket holds the bucket's rows up to its step (`packed`), so a resumed
  sweep takes every row its checkpoints cover from them (`restore`) and rewrites the file to
  hold exactly those (`publish`) once the restores succeeded, before appending new rows.
  """

  def __init__(self, workdir, replicas, log):
    self.path = os.path.join(workdir, results.RESULTS_FILE)
    self.writer = parallel.is_writer()
    self.log = log
    self.coordinates = {r.index: r.coordinates() for r in replicas}
    self.by_bucket = {}  # bucket index -> its rows, in order
    self.diverged = {}   # replica index -> divergence step already reported
    self.file = None
    self._file_rows = None

  def rows(self):
    """Every row so far, in the order an uninterrupted sweep writes them."""
    return [row for b in sorted(self.by_bucket) for row in self.by_bucket[b]]

  def restore(self, bucket, step, metadata, is_logged):
    """Takes `bucket`'s rows up to checkpoint `step` from the checkpoint's metadata.

    Checkpoints written before they held rows leave results.jsonl as the only copy: its rows
    of the bucket up to `step` are kept if they are complete (every replica at every logged
    step, up to its divergence), else ValueError saying which rows are missing.
    """
    if not step:
      rows = []
    elif "rows" in metadata:
      rows = results.unpack_rows(metadata["rows"], self.coordinates)
    else:
      if self._file_rows is None:
        self._file_rows = results.read_rows(os.path.dirname(self.path))
      rows = [r for r in self._file_rows
              if r[results.BUCKET] == bucket.index and r[results.STEP] <= step]
      missing = _missing_rows(rows, bucket, [s for s in range(1, step + 1) if is_logged(s)])
      if missing:
        replica, at = missing[0]
        raise ValueError(
            f"{self.path} lacks {len(missing)} rows of bucket {bucket.index} up to its checkpoint "
            f"at step {step} (first: replica {replica}, step {at}), and that checkpoint predates "
            "checkpoints holding rows, so they cannot be rebuilt; restore the file from a copy or "
            "pass --overwrite to start the run over")
    self.by_bucket[bucket.index] = rows
    self.diverged.update(results.diverged_steps(rows))

  def packed(self, bucket):
    """The bucket's rows so far, packed for its checkpoint's metadata."""
    return results.pack_rows(self.by_bucket[bucket.index], self.coordinates)

  def publish(self):
    """Makes results.jsonl hold exactly the rows so far and opens it for appending (once)."""
    if self.file is None and self.writer:
      self._match_file("rebuilt them from the checkpoints")
      self.file = open(self.path, "a")

  def _match_file(self, repair):
    """Rewrites results.jsonl when it differs from the rows so far; says so when rows the file
    should have held were missing or damaged (rows past a checkpoint are dropped silently: they
    are recomputed)."""
    text = results.rows_text(self.rows())
    old = b""
    if os.path.exists(self.path):
      with open(self.path, "rb") as f:
        old = f.read()
    if old == text.encode():
      return
    present = set(old.split(b"\n"))
    lines = text.encode().split(b"\n")[:-1]
    missing = sum(line not in present for line in lines)
    if missing:
      self.log(f"{self.path}: {missing} of the {len(lines)} rows it should hold were missing or "
               f"damaged; {repair}")
    files.write_atomic(self.path, text)

  def add(self, bucket, step, train_metrics, eval_metrics):
    """Rows of the valid replicas of `bucket` at `step` from host metric arrays [R]."""
    rows = []
    for i, replica in enumerate(bucket.replicas):
      if replica.index in self.diverged:
        continue
      diverged_step = int(train_metrics["diverged_step"][i])
      rows.append(results.make_row(
          replica.coordinates(), step, {k: v[i] for k, v in train_metrics.items()},
          None if eval_metrics is None else {k: v[i] for k, v in eval_metrics.items()},
          diverged_step))
      if diverged_step >= 0:
        self.diverged[replica.index] = diverged_step
    self.by_bucket[bucket.index].extend(rows)
    if self.writer and rows:
      try:
        files.append_jsonl(self.file, rows)
      except OSError as e:
        raise OSError(e.errno, f"cannot write {self.path}: {e.strerror or e}") from None

  def all_diverged(self, bucket):
    return all(replica.index in self.diverged for replica in bucket.replicas)

  def sync(self):
    if self.file is not None:
      self.file.flush()
      os.fsync(self.file.fileno())

  def finish(self):
    """Closes the file, first making sure it holds every row (rewritten when it does not)."""
    self.close()
    if self.writer:
      self._match_file("rewrote the file")

  def close(self):
    if self.file is not None:
      self.file.close()
      self.file = None


def _missing_rows(rows, bucket, logged_steps):
  """(replica, step) of rows a bucket must have at `logged_steps` but `rows` lack: each replica
  has a row at every logged step until its "diverged" row."""
  steps = collections.defaultdict(list)
  for row in rows:
    steps[row[results.REPLICA]].append(row[results.STEP])
  ended = results.diverged_steps(rows)
  missing = []
  for replica in bucket.replicas:
    have = steps[replica.index]
    expected = logged_steps[:len(have)] if replica.index in ended else logged_steps
    missing += [(replica.index, s) for s in expected if s not in have]
  return missing


# --------------------------------------------------------------------------------------------
# The sweep loop


def _mesh_devices(buckets, num_data, devices):
  """The devices to use: all of them, or in one process only as many as the largest bucket
  fills, so a small sweep (a single run) is not padded with copies onto idle devices."""
  devices = list(jax.devices() if devices is None else devices)
  if jax.process_count() > 1:
    return devices
  groups = min(len(devices) // num_data, max(len(b.replicas) for b in buckets))
  return devices[:max(1, groups) * num_data]


def _check_workdir_path(workdir):
  """errors.ConfigError when `workdir` is a file or lies under one."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise errors.ConfigError(f"workdir={workdir!r} is a file; expected a directory")
  parent = workdir
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise errors.ConfigError(f"workdir={workdir!r} lies under {parent}, which is a file; "
                             "expected a directory path")


@contextlib.contextmanager
def _ownership(workdir, log):
  """Holds the workdir's lock (taken by the writer process) for the block."""
  lock, failure = None, None
  if parallel.is_writer():
    try:
      lock = workdir_lock.acquire(workdir)
    except OSError as e:
      failure = e
  if parallel.any_process(failure is not None):
    raise failure or OSError(f"workdir {workdir}: process 0 could not take its lock")
  try:
    if lock is not None and lock.stale:
      log(f"workdir {workdir}: took over the lock of a run that has ended "
          f"({workdir_lock.describe(lock.stale)})")
    yield
  finally:
    if lock is not None:
      lock.release()


def _holds_run(workdir):
  return (os.path.exists(os.path.join(workdir, results.CONFIG_FILE))
          or files.recorded_outputs(workdir) is not None)


def _check_workdir(workdir, config_json, overwrite):
  """Usage errors (errors.ConfigError) for a workdir this run may not use: one holding files
  that are not a bindjax run (with --overwrite: files named like its outputs), or without
  --overwrite a run of a different config."""
  entries = [name for name in (os.listdir(workdir) if os.path.isdir(workdir) else [])
             if name != workdir_lock.LOCK_FILE]
  if not entries or _holds_run(workdir):
    if not overwrite:
      results.check_saved_config(workdir, config_json)
    return
  if not overwrite:
    raise errors.ConfigError(f"workdir={workdir!r} is not empty and holds no bindjax run; "
                             "expected a new or empty directory or a run to resume, or pass "
                             "--overwrite")
  clashes = sorted(set(entries) & set(results.OUTPUTS + (results.REPORT_DIR, files.OUTPUTS_FILE)))
  if clashes:
    raise errors.ConfigError(f"workdir={workdir!r} holds {', '.join(clashes)}, which bindjax did "
                             "not record as its outputs; move them away (--overwrite removes "
                             "only what bindjax wrote)")


def _remove_outputs(workdir):
  """What a previous run recorded as its outputs (a run older than the record: the names it
  writes), and the report's recorded files; a user's files stay."""
  legacy = results.OUTPUTS if os.path.exists(os.path.join(workdir, results.CONFIG_FILE)) else ()
  files.remove_recorded_outputs(workdir, legacy)
  report_dir = os.path.join(workdir, results.REPORT_DIR)
  if os.path.isdir(report_dir):
    files.remove_recorded_outputs(report_dir)
    if not os.listdir(report_dir):
      os.rmdir(report_dir)


def _finished(workdir, done, buckets, log):
  """A finished workdir's done record, after checking results.jsonl against it; a damaged file
  is rebuilt from the buckets' final checkpoints (ValueError when they cannot rebuild it)."""
  path = os.path.join(workdir, results.RESULTS_FILE)
  expected = done.get("results_sha256")
  if expected is None or not parallel.is_writer():
    return done
  content = b""
  if os.path.exists(path):
    with open(path, "rb") as f:
      content = f.read()
  if hashlib.sha256(content).hexdigest() == expected:
    return done
  coordinates = {}
  rows = []
  for bucket in buckets:
    coordinates.update((r.index, r.coordinates()) for r in bucket.replicas)
    directory = results.bucket_checkpoint_dir(workdir, bucket.index)
    latest = None
    if os.path.isdir(directory):
      with checkpoint.Checkpoints(directory) as ckpt:
        latest = ckpt.verified_metadata(log)
    if latest is None or "rows" not in latest[1]:
      rows = None
      break
    rows += results.unpack_rows(latest[1]["rows"], coordinates)
  if rows is None or results.rows_digest(rows) != expected:
    raise ValueError(f"{path} does not match {results.DONE_FILE} (damaged or edited) and the "
                     "checkpoints cannot rebuild it; restore it from a copy or pass --overwrite")
  files.write_atomic(path, results.rows_text(rows))
  results.write_summary(workdir, rows, [c for _, c in sorted(coordinates.items())])
  log(f"{path} did not match {results.DONE_FILE} (damaged or edited); rebuilt it from the "
      "checkpoints")
  return done


def run_sweep(config, workdir, *, overwrite=False, progress=True, log=print, devices=None):
  """Runs (or resumes) the sweep of `config` in `workdir`; returns the done-file summary.

  The run holds the workdir's lock throughout (`bindjax.workdir_lock`). A finished workdir is
  reported and left alone unless overwrite=True, which first deletes what the previous run
  recorded as its outputs (and only that). Errors: errors.ConfigError for a setting or a
  workdir this run may not use (a different config, files that are not a bindjax run);
  ValueError for damaged data it cannot repair; OSError for the environment (a workdir held by
  a live run or not writable, a full disk). devices: the devices of the mesh (default all,
  over every process).
  """
  with errors.config_errors():
    replicas, buckets = expand_grid(config)
    parallel.chunk_setting(config.sweep.chunk_size, "config.sweep.chunk_size")
    num_data = int(config.sweep.num_data)
    mesh = parallel.make_mesh(num_data, devices=_mesh_devices(buckets, num_data, devices))
  workdir = os.path.abspath(os.fspath(workdir))
  _check_workdir_path(workdir)
  with _ownership(workdir, log):
    return _run_owned(config, workdir, replicas, buckets, mesh, overwrite=overwrite,
                      progress=progress, log=log)


def _run_owned(config, workdir, replicas, buckets, mesh, *, overwrite, progress, log):
  from tqdm import tqdm

  writer = parallel.is_writer()
  config_json = results.config_json(config)
  done_path = os.path.join(workdir, results.DONE_FILE)
  _check_workdir(workdir, config_json, overwrite)
  if overwrite and writer:
    _remove_outputs(workdir)
  # Every process has checked the workdir before process 0 writes into it.
  parallel.sync("bindjax_sweep_checked")
  if os.path.exists(done_path):
    done = _finished(workdir, files.read_json(done_path), buckets, log)
    parallel.sync("bindjax_sweep_finished")
    log(f"the run in {workdir} is finished ({done['num_replicas']} replicas, "
        f"{done['num_buckets']} buckets); nothing to do (pass --overwrite to run it again)")
    return done
  coordinates = [r.coordinates() for r in replicas]
  if writer:
    files.record_outputs(workdir, results.OUTPUTS)
    # A resumed run already has them (the config was checked): nothing is rewritten.
    for name, value, sort_keys in ((results.CONFIG_FILE, config_json, True),
                                   (results.REPLICAS_FILE, coordinates, False)):
      if not os.path.exists(os.path.join(workdir, name)):
        files.write_json(os.path.join(workdir, name), value, sort_keys=sort_keys)

  settings = config.sweep
  keep = int(config.checkpoint.keep)
  managers = {b.index: checkpoint.Checkpoints(results.bucket_checkpoint_dir(workdir, b.index),
                                              keep=keep) for b in buckets}
  rows = _Results(workdir, replicas, log)
  loop = _Loop(mesh=mesh, results=rows, bar=None, log=log,
               keep_best=bool(config.checkpoint.keep_best), chunk_setting=settings.chunk_size,
               memory_fraction=float(settings.memory_fraction),
               fast_compile=bool(settings.fast_compile),
               checkpoint_every=int(config.checkpoint.every), log_every=int(config.log_every))
  try:
    log(f"sweep: {len(replicas)} replicas in {len(buckets)} buckets on {mesh.devices.size} "
        f"devices ({jax.process_count()} processes); mesh {dict(mesh.shape)}")
    # Every restore (state and rows, checksums verified) succeeds before anything is rewritten.
    latest = {b.index: managers[b.index].verified_metadata(log) for b in buckets}
    last_saved = max([b.index for b in buckets if latest[b.index]], default=-1)
    restored = {}
    for bucket in buckets:
      start, state, complete = loop.restore(bucket, managers[bucket.index], latest[bucket.index])
      # Keep the state for training only where no later restore would hold a second one.
      restored[bucket.index] = (start, None if complete or bucket.index < last_saved else state,
                                complete)
    total = sum(len(b.replicas) * b.spec.num_steps for b in buckets)
    initial = sum(len(b.replicas) * (b.spec.num_steps if restored[b.index][2]
                                     else restored[b.index][0]) for b in buckets)
    if initial:
      log(f"resuming at {initial:,} of {total:,} replica-steps")
    loop.bar = tqdm(total=total, initial=initial, unit="replica-step", unit_scale=True,
                    dynamic_ncols=True, disable=not (progress and writer), file=sys.stderr,
                    mininterval=1.0)
    rows.publish()
    for bucket in buckets:
      manager = managers[bucket.index]
      start, state, complete = restored.pop(bucket.index)
      if not complete:
        loop.run_bucket(bucket, manager, start, state)
      manager.close()
      if writer:
        results.write_summary(workdir, rows.rows(), coordinates)
    rows.finish()
  except BaseException:
    rows.close()
    for manager in managers.values():
      try:
        manager.close()
      except OSError:
        pass   # the error that got us here says more
    raise
  finally:
    if loop.bar is not None:
      loop.bar.close()
  all_rows = rows.rows()
  done = {"num_replicas": len(replicas), "num_buckets": len(buckets),
          "num_diverged": len(rows.diverged), "compile_seconds": round(loop.compile_seconds, 2),
          "replica_steps": total, "results": rows.path, "num_rows": len(all_rows),
          "results_sha256": results.rows_digest(all_rows)}
  if writer:
    results.write_summary(workdir, all_rows, coordinates)
    files.write_json(done_path, done)
  parallel.sync("bindjax_sweep_done")
  log(f"sweep finished: {len(replicas)} replicas, {len(rows.diverged)} diverged; compile "
      f"{loop.compile_seconds:.1f} s; results in {rows.path}")
  return done


def run_single(config, workdir, *, overwrite=False, progress=True, log=print):
  """`bindjax train`: runs a config without a grid as a one-replica sweep in `workdir`.

  Returns the replica's final evaluation row; when the replica diverged, with "diverged" True
  and "diverged_step" (the step whose update was non-finite) added.
  """
  with errors.config_errors():
    config = single_run_config(config)
  run_sweep(config, workdir, overwrite=overwrite, progress=progress, log=log)
  rows = results.read_rows(workdir)
  final = [r for r in results.select_evaluations(rows, "final") if r[results.KIND] == "eval"]
  out = dict(final[0]) if final else {results.STEP: 0}
  diverged_at = results.diverged_steps(rows)
  if diverged_at:
    (step,) = diverged_at.values()   # one replica
    out.update({results.DIVERGED: True, results.DIVERGED_STEP: step})
  return out


def is_checkpoint_step(spec, checkpoint_every, step):
  """Whether a bucket saves a checkpoint after `step` steps (every checkpoint_every, the last)."""
  return step % checkpoint_every == 0 or step == spec.num_steps


def is_logged_step(spec, log_every, checkpoint_every, step):
  """Whether a bucket writes rows after `step` steps (evaluations, checkpoints, log_every)."""
  return (step % spec.eval_every == 0 or step % log_every == 0
          or is_checkpoint_step(spec, checkpoint_every, step))


def dispatch_ends(spec, log_every, checkpoint_every, start=0):
  """The steps after `start` at which the sweep loop's dispatches of a bucket end: every step
  that writes rows, and the step after one whose rows are written during the next dispatch
  (any but a checkpoint's), since the bucket stops there when they show every replica diverged.
  The steps in between run on the device in one dispatch, so k follows the cadence alone.
  """
  def waits(step):
    return (step > start and is_logged_step(spec, log_every, checkpoint_every, step)
            and not is_checkpoint_step(spec, checkpoint_every, step))

  return [step for step in range(start + 1, spec.num_steps + 1)
          if is_logged_step(spec, log_every, checkpoint_every, step) or waits(step - 1)]


@dataclasses.dataclass
class _Loop:
  """The settings and running state the buckets of one sweep share."""
  mesh: object
  results: _Results
  bar: object
  log: object
  keep_best: bool
  chunk_setting: int
  memory_fraction: float
  fast_compile: bool
  checkpoint_every: int
  log_every: int
  compile_seconds: float = 0.0

  def is_logged(self, bucket):
    """Whether the bucket writes rows at a step (`is_logged_step`)."""
    return functools.partial(is_logged_step, bucket.spec, self.log_every, self.checkpoint_every)

  @staticmethod
  def complete(bucket, latest):
    """Whether the bucket's checkpoint `latest` ((step, metadata) or None) ends its training."""
    if latest is None:
      return False
    step, metadata = latest
    return bool(metadata.get("complete", step >= bucket.spec.num_steps))

  def _hyper(self, bucket):
    """The bucket's stacked hyper, padded to the replica shards and sharded; and its padding."""
    hyper_np, valid = parallel.pad_to_multiple(bucket.stacked_hyper(),
                                               parallel.num_replica_shards(self.mesh))
    return parallel.shard_replicas(hyper_np, self.mesh), valid

  def restore(self, bucket, manager, latest):
    """Restores the bucket from its newest checkpoint up to `latest` ((step, metadata) of the
    newest whose metadata verifies, or None) whose arrays verify too, falling back past
    damaged ones and saying so; takes its rows from it and deletes newer checkpoints.

    Returns (step, state, whether the bucket's training is complete); (0, None, False) without
    a checkpoint.
    """
    if latest is None:
      self.results.restore(bucket, 0, {}, self.is_logged(bucket))
      manager.prune_after(None)
      return 0, None, False
    hyper, _ = self._hyper(bucket)
    target = abstract_bucket_state(bucket.spec, self.mesh, hyper, self.keep_best)
    start, state, metadata = restore_state(manager.restore_verified, target,
                                           parallel.replica_sharding(self.mesh),
                                           at_most=latest[0], log=self.log)
    self.results.restore(bucket, start, metadata, self.is_logged(bucket))
    manager.prune_after(start)
    return start, state, self.complete(bucket, (start, metadata))

  def run_bucket(self, bucket, manager, start, state=None):
    """Trains one bucket from step `start` to its last step (or until all its replicas
    diverged). state: the state `restore` returned at `start` (restored again when None)."""
    spec, mesh = bucket.spec, self.mesh
    hyper, valid = self._hyper(bucket)
    t0 = time.perf_counter()
    init_fn, run_fn, eval_fn, chunk = compile_bucket(
        spec, mesh, hyper, self.chunk_setting, self.memory_fraction, self.log,
        self.fast_compile, self.keep_best)
    seconds = time.perf_counter() - t0
    self.compile_seconds += seconds
    self.log(f"bucket {bucket.index}: {len(bucket.replicas)} replicas (padded to {len(valid)}), "
             f"|O| = {spec.space.num_objects}, d_model {spec.model.d_model}; compiled in "
             f"{seconds:.1f} s" + (f"; chunk {chunk}" if chunk else ""))
    if not start:
      state = init_fn(hyper)
    else:
      if state is None:
        _, state, _ = restore_state(
            manager.restore, abstract_bucket_state(spec, mesh, hyper, self.keep_best),
            parallel.replica_sharding(mesh), step=start)
      self.log(f"bucket {bucket.index}: resumed from the checkpoint at step {start}")
    postfix = {"compile": f"{self.compile_seconds:.0f}s"}
    self.bar.set_postfix(postfix, refresh=False)
    metadata = {"bucket": bucket.index, "padded_replicas": len(valid)}
    pending = []

    def flush():
      """Writes the pending rows; returns whether every replica of the bucket has diverged."""
      if not pending:
        return False
      host = parallel.gather_to_host([(train, evaluation) for _, train, evaluation in pending],
                                     mesh)
      for (step, _, _), (train_host, eval_host) in zip(pending, host):
        self.results.add(bucket, step, train_host, eval_host)
        if eval_host is not None:
          alive = train_host["diverged_step"][:len(bucket.replicas)] < 0
          acc = eval_host[results.SELECTION_METRIC][:len(bucket.replicas)][alive]
          if acc.size:
            postfix["heldout_obj"] = f"{acc.mean():.3f}"
            self.bar.set_postfix(postfix, refresh=False)
      pending.clear()
      return self.results.all_diverged(bucket)

    num_steps = spec.num_steps
    step = start
    for done in dispatch_ends(spec, self.log_every, self.checkpoint_every, start):
      state, train_metrics = run_fn(state, hyper, global_scalar(done - step, mesh))
      is_eval = done % spec.eval_every == 0 or done == num_steps
      is_checkpoint = is_checkpoint_step(spec, self.checkpoint_every, done)
      eval_metrics = None
      if is_eval:
        state, eval_metrics = eval_fn(state, hyper, global_scalar(done, mesh))
      # Metrics of the previous logged step: its values are ready by now, this dispatch queued.
      # Divergence is only learnt from flushed rows, so it is checked only when rows were written.
      stop = flush()
      if is_eval or is_checkpoint or stop or done % self.log_every == 0:
        pending.append((done, train_metrics, eval_metrics))
      if is_checkpoint or stop:
        flush()
        self.results.sync()
        manager.save(done, checkpoint_state(state, parallel.replica_sharding(mesh)),
                     dict(metadata, step=done, complete=stop or done == num_steps,
                          rows=self.results.packed(bucket)))
      self.bar.update(len(bucket.replicas) * ((num_steps if stop else done) - step))
      if stop:
        self.log(f"bucket {bucket.index}: every replica diverged; stopped at step {done}")
        break
      step = done
    flush()
    manager.wait()
