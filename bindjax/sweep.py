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
(`train.RunSpec`: space, model, batch) agree form a *bucket*; each bucket runs as ONE
jit(vmap(train_step)) over a leading replica axis, sharded along the mesh's "replica" axis,
padded to a multiple of the shard count. Coverage, seed, learning rate and weight decay are
per-replica arrays (a permutation table plus a count), so they never recompile.

Workdir layout:
  config.json          the sweep config          replicas.json   the expanded grid
  results.jsonl        one row per replica and logged step (grid coordinates + metrics)
  summary.csv          one row per finished replica (final and best evaluation)
  checkpoints/bucket_NNN/   orbax checkpoints of the stacked replica states (bindjax.checkpoint)
  sweep_done.json      written last; a rerun into a finished workdir reports and returns

A killed sweep resumes from each bucket's latest checkpoint; rows past it are dropped and
recomputed bit for bit, so results equal an uninterrupted sweep. A replica whose loss or
parameters become non-finite is frozen at its last finite state, flagged in a "diverged" row,
and left out of later rows; the others continue.
"""
import csv
import dataclasses
import io
import itertools
import json
import math
import os
import shutil
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bindjax import checkpoint
from bindjax import files
from bindjax import parallel
from bindjax import train
from bindjax import world
from bindjax import xla_options

CONFIG_FILE = "config.json"
REPLICAS_FILE = "replicas.json"
RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.csv"
DONE_FILE = "sweep_done.json"
CHECKPOINT_DIR = "checkpoints"
AUTO_CHUNK = -1
# Training metrics copied into every row (besides the evaluation metrics at eval steps).
TRAIN_METRICS = ("loss", "concept_loss", "object_loss", "batch_concept_accuracy",
                 "batch_object_accuracy", "learning_rate", "grad_norm", "tau")
# Row names of metrics whose train.py name is a grid coordinate.
RENAMED = {"learning_rate": "scheduled_learning_rate"}


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
    v = list(self.num_values) if isinstance(self.num_values, tuple) else self.num_values
    return {"replica": self.index, "bucket": self.bucket, "C": self.num_concepts, "V": v,
            "K": self.max_objects, "space_size": self.space_size, "coverage": self.coverage,
            "seed": self.seed, "learning_rate": self.learning_rate,
            "weight_decay": self.weight_decay, "model": self.model,
            "num_train_objects": self.num_train}


@dataclasses.dataclass
class Bucket:
  """Replicas sharing one RunSpec (one compiled program)."""
  index: int
  spec: train.RunSpec
  replicas: list
  hypers: list

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
      by_spec[spec] = Bucket(len(buckets), spec, [], [])
      buckets.append(by_spec[spec])
    bucket = by_spec[spec]
    replica = Replica(index=len(replicas), bucket=bucket.index, num_concepts=c,
                      num_values=v, max_objects=k, space_size=spec.space.num_objects,
                      coverage=float(coverage), seed=int(seed), learning_rate=float(lr),
                      weight_decay=float(wd), model=model_name, num_train=int(split.num_train))
    replicas.append(replica)
    bucket.replicas.append(replica)
    bucket.hypers.append(hyper)
  return replicas, buckets


# --------------------------------------------------------------------------------------------
# Compiled bucket programs


def _replica_step(spec, scene_sharding=None):
  """One replica's masked train step: a non-finite update leaves the state as it was."""

  def step(state, hyper, alive, diverged_step):
    new_state, metrics = train.train_step(state, hyper, spec, scene_sharding)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(optax.tree.norm(new_state.params))
    ok = alive & finite
    new_state = jax.tree_util.tree_map(lambda n, o: jnp.where(ok, n, o), new_state, state)
    diverged_step = jnp.where(alive & ~finite, state.step + 1, diverged_step)
    metrics = {name: metrics[name] for name in TRAIN_METRICS}
    metrics["diverged_step"] = diverged_step
    return new_state, ok, diverged_step, metrics

  return step


def _bucket_functions(spec, mesh, chunk_size):
  """(init, step, eval) of a whole bucket: vmapped (chunked) over replicas, jitted on the mesh."""
  shards = parallel.num_replica_shards(mesh)
  sharding = parallel.replica_sharding(mesh)
  # With a "data" axis, each replica's scenes are split over its data devices.
  scene_sharding = parallel.data_sharding(mesh)
  vstep = parallel.chunked_vmap(_replica_step(spec, scene_sharding), chunk_size,
                                num_shards=shards, spmd_axis_name=parallel.REPLICA_AXIS)

  def bucket_init(hyper):
    state = jax.vmap(lambda h: train.init(h.key, spec, h))(hyper)
    size = hyper.num_train.shape[0]
    return {"train": state, "alive": jnp.ones((size,), bool),
            "diverged_step": jnp.full((size,), -1, jnp.int32)}

  def bucket_step(sweep_state, hyper):
    state, alive, diverged_step, metrics = vstep(
        sweep_state["train"], hyper, sweep_state["alive"], sweep_state["diverged_step"])
    return {"train": state, "alive": alive, "diverged_step": diverged_step}, metrics

  def bucket_eval(params, hyper, step):
    def one(p, h):
      return train.eval_step(p, train.eval_key(h.key, step), h, spec, scene_sharding)
    return parallel.chunked_vmap(one, chunk_size, num_shards=shards,
                                 spmd_axis_name=parallel.REPLICA_AXIS)(params, hyper)

  return (jax.jit(bucket_init, out_shardings=sharding),
          jax.jit(bucket_step, out_shardings=sharding, donate_argnums=0),
          jax.jit(bucket_eval, out_shardings=sharding))


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


_PROGRAM_CACHE = {}


def compile_bucket(spec, mesh, hyper, chunk_setting=AUTO_CHUNK,
                   memory_fraction=parallel.DEFAULT_MEMORY_FRACTION, log=print,
                   fast_compile=False):
  """Compiled (init, step, eval, chunk_size) for a bucket's sharded stacked `hyper`.

  chunk_setting: 0 = all replicas at once, n > 0 = n replicas at a time (over all devices),
  AUTO_CHUNK = from the compiled program's memory analysis (or `estimate_step_bytes`) against
  the device memory and, on CPU, each core's share of the last-level cache. Compiled programs
  are cached per (spec, mesh, replicas, chunk).
  fast_compile: compile with xla_options.FAST_COMPILE_OPTIONS. Every program gets
  `xla_options.compiler_options` for the mesh's platform.
  """
  options = xla_options.compiler_options(_platform(mesh), fast_compile)
  if chunk_setting is None or chunk_setting == 0:
    chunk = None
  elif chunk_setting > 0:
    chunk = int(chunk_setting)
  elif chunk_setting == AUTO_CHUNK:
    chunk = _auto_chunk(spec, mesh, hyper, memory_fraction, log, options)
  else:
    raise ValueError(f"config.sweep.chunk_size={chunk_setting!r}: expected -1 (auto), 0 (off) "
                     "or a positive number of replicas")
  return _compiled(spec, mesh, hyper, chunk, options) + (chunk,)


def _compiled(spec, mesh, hyper, chunk, options=None):
  size = hyper.num_train.shape[0]
  key = (spec, mesh, size, chunk, tuple(sorted((options or {}).items())))
  if key not in _PROGRAM_CACHE:
    init_fn, step_fn, eval_fn = _bucket_functions(spec, mesh, chunk)
    abstract_state = jax.eval_shape(init_fn, hyper)
    sharding = parallel.replica_sharding(mesh)
    abstract_state = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), abstract_state)
    step_scalar = jax.ShapeDtypeStruct((), jnp.int32,
                                       sharding=parallel.replicated_sharding(mesh))
    _PROGRAM_CACHE[key] = (
        init_fn.lower(hyper).compile(options),
        step_fn.lower(abstract_state, hyper).compile(options),
        eval_fn.lower(abstract_state["train"].params, hyper, step_scalar).compile(options))
  return _PROGRAM_CACHE[key]


def _platform(mesh):
  return mesh.devices.flat[0].platform


def _auto_chunk(spec, mesh, hyper, memory_fraction, log, options):
  size = hyper.num_train.shape[0]
  shards = parallel.num_replica_shards(mesh)
  per_device = size // shards
  # The unchunked program is compiled anyway when it fits, so measuring it costs nothing then.
  _, step, _ = _compiled(spec, mesh, hyper, None, options)
  memory = parallel.compiled_memory_bytes(step)
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


def _global_scalar(value, mesh):
  x = np.asarray(value, np.int32)
  return jax.make_array_from_callback((), parallel.replicated_sharding(mesh), lambda _: x)


# --------------------------------------------------------------------------------------------
# Results


def _clean(value):
  value = float(value)
  return value if math.isfinite(value) else None


class _Results:
  """Rows of one sweep: appended whole-line (process 0 only) to results.jsonl."""

  def __init__(self, workdir, replicas):
    self.path = os.path.join(workdir, RESULTS_FILE)
    self.replicas = replicas
    self.writer = parallel.is_writer()
    self.file = None
    self.diverged = {}   # replica index -> divergence step already reported

  def truncate(self, kept_steps):
    """Keeps rows with step <= kept_steps[bucket] (None drops the bucket); drops torn lines."""
    if not self.writer:
      return
    rows = files.read_jsonl(self.path)
    kept = [r for r in rows
            if kept_steps.get(r["bucket"]) is not None and r["step"] <= kept_steps[r["bucket"]]]
    files.write_jsonl(self.path, kept)
    self.diverged = {r["replica"]: r["diverged_step"] for r in kept if r["kind"] == "diverged"}

  def open(self):
    if self.writer and self.file is None:
      self.file = open(self.path, "a")

  def add(self, bucket, step, train_metrics, eval_metrics):
    """Rows of the valid replicas of `bucket` at `step` from host metric arrays [R]."""
    lines = []
    for i, replica in enumerate(bucket.replicas):
      if replica.index in self.diverged:
        continue
      row = {"kind": "eval" if eval_metrics is not None else "train", **replica.coordinates(),
             "step": int(step)}
      diverged_step = int(train_metrics["diverged_step"][i])
      for name in TRAIN_METRICS:
        row[RENAMED.get(name, name)] = _clean(train_metrics[name][i])
      if eval_metrics is not None:
        for name in sorted(eval_metrics):
          row[name] = _clean(eval_metrics[name][i])
      if diverged_step >= 0:
        row["kind"] = "diverged"
        row["diverged"] = True
        row["diverged_step"] = diverged_step
        self.diverged[replica.index] = diverged_step
      lines.append(json.dumps(row) + "\n")
    if self.writer and lines:
      self.file.write("".join(lines))
      self.file.flush()

  def sync(self):
    if self.file is not None:
      self.file.flush()
      os.fsync(self.file.fileno())

  def close(self):
    if self.file is not None:
      self.file.close()
      self.file = None


SUMMARY_METRICS = ("heldout/object_accuracy", "heldout/object_accuracy_1obj",
                   "heldout/concept_accuracy", "train/object_accuracy",
                   "train/concept_accuracy", "loss", "tau")


def summary_rows(rows, replicas):
  """One dict per replica that has evaluations: final and best held-out object accuracy."""
  by_replica = {}
  for row in rows:
    by_replica.setdefault(row["replica"], []).append(row)
  out = []
  for replica in replicas:
    mine = by_replica.get(replica.index, [])
    evals = [r for r in mine if r["kind"] == "eval"]
    if not evals:
      continue
    final = evals[-1]
    best = max(evals, key=lambda r: (-1.0 if r.get("heldout/object_accuracy") is None
                                     else r["heldout/object_accuracy"], -r["step"]))
    k = replica.max_objects
    summary = replica.coordinates()
    summary["V"] = json.dumps(summary["V"]) if isinstance(summary["V"], list) else summary["V"]
    summary["final_step"] = final["step"]
    for name in SUMMARY_METRICS + (f"heldout/object_accuracy_{k}obj",):
      summary[f"final {name}"] = final.get(name)
    summary["best_step"] = best["step"]
    summary["best heldout/object_accuracy"] = best.get("heldout/object_accuracy")
    summary["best heldout/object_accuracy_maxobj"] = best.get(f"heldout/object_accuracy_{k}obj")
    diverged = [r for r in mine if r["kind"] == "diverged"]
    summary["diverged_step"] = diverged[0]["diverged_step"] if diverged else ""
    out.append(summary)
  return out


def write_summary(workdir, rows, replicas):
  """summary.csv with one line per finished replica (atomic rewrite)."""
  table = summary_rows(rows, replicas)
  if not table:
    return
  fields = []
  for row in table:
    fields.extend(k for k in row if k not in fields)
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=fields)
  writer.writeheader()
  for row in table:
    writer.writerow({k: "" if v is None else v for k, v in row.items()})
  files.write_atomic(os.path.join(workdir, SUMMARY_FILE), buffer.getvalue())


# --------------------------------------------------------------------------------------------
# The sweep loop


def _config_json(config):
  return json.loads(config.to_json_best_effort(sort_keys=True))


def sweep_setting(config, name, default):
  """config.sweep.<name>, or `default` for configs without it."""
  sweep = config.get("sweep") or {}
  return sweep.get(name, default) if hasattr(sweep, "get") else default


def _remove_outputs(workdir):
  for name in (CONFIG_FILE, REPLICAS_FILE, RESULTS_FILE, SUMMARY_FILE, DONE_FILE):
    path = os.path.join(workdir, name)
    if os.path.exists(path):
      os.remove(path)
  for name in (CHECKPOINT_DIR, "report"):
    shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)


def run_sweep(config, workdir, *, overwrite=False, progress=True, log=print, devices=None):
  """Runs (or resumes) the sweep of `config` in `workdir`; returns the done-file summary.

  A finished workdir is reported and left alone unless overwrite=True (which deletes the
  previous sweep's outputs first). A workdir holding a different sweep is a ValueError.
  devices: the devices of the mesh (default all, over every process).
  """
  from tqdm import tqdm

  replicas, buckets = expand_grid(config)
  workdir = os.path.abspath(os.fspath(workdir))
  config_json = _config_json(config)
  done_path = os.path.join(workdir, DONE_FILE)
  if overwrite and parallel.is_writer():
    _remove_outputs(workdir)
  parallel.sync("bindjax_sweep_overwrite")
  if os.path.exists(done_path):
    with open(done_path) as f:
      done = json.load(f)
    log(f"sweep in {workdir} already finished ({done['num_replicas']} replicas, "
        f"{done['num_buckets']} buckets); nothing to do (pass --overwrite to run it again)")
    return done
  config_path = os.path.join(workdir, CONFIG_FILE)
  if os.path.exists(config_path):
    with open(config_path) as f:
      if json.load(f) != config_json:
        raise ValueError(f"workdir={workdir!r} holds a sweep with a different config; use a new "
                         "--workdir or pass --overwrite")
  if parallel.is_writer():
    os.makedirs(workdir, exist_ok=True)
    files.write_json(config_path, config_json, sort_keys=True)
    files.write_json(os.path.join(workdir, REPLICAS_FILE), [r.coordinates() for r in replicas])

  mesh = parallel.make_mesh(int(sweep_setting(config, "num_data", 1)), devices=devices)
  chunk_setting = int(sweep_setting(config, "chunk_size", AUTO_CHUNK))
  memory_fraction = float(sweep_setting(config, "memory_fraction",
                                         parallel.DEFAULT_MEMORY_FRACTION))
  fast_compile = bool(sweep_setting(config, "fast_compile", False))
  keep = int(config.checkpoint.keep)
  checkpoint_every = int(config.checkpoint.every)
  log_every = int(config.log_every)

  def bucket_dir(bucket):
    return os.path.join(workdir, CHECKPOINT_DIR, f"bucket_{bucket.index:03d}")

  managers = {b.index: checkpoint.Checkpoints(bucket_dir(b), keep=keep) for b in buckets}
  starts = {b.index: managers[b.index].latest_step() or 0 for b in buckets}
  results = _Results(workdir, replicas)
  results.truncate({b: (s if s else None) for b, s in starts.items()})
  parallel.sync("bindjax_sweep_truncated")
  num_steps = {b.index: b.spec.num_steps for b in buckets}
  total = sum(len(b.replicas) * num_steps[b.index] for b in buckets)
  initial = sum(len(b.replicas) * starts[b.index] for b in buckets)
  log(f"sweep: {len(replicas)} replicas in {len(buckets)} buckets on {mesh.devices.size} devices "
      f"({jax.process_count()} processes); mesh {dict(mesh.shape)}"
      + (f"; resuming at {initial:,} of {total:,} replica-steps" if initial else ""))
  bar = tqdm(total=total, initial=initial, unit="replica-step", unit_scale=True,
             dynamic_ncols=True, disable=not (progress and parallel.is_writer()),
             file=sys.stderr, mininterval=1.0)
  compile_seconds = 0.0
  results.open()
  try:
    for bucket in buckets:
      manager = managers[bucket.index]
      start = starts[bucket.index]
      if start >= bucket.spec.num_steps:
        manager.close()
        continue
      compile_seconds += _run_bucket(bucket, mesh, manager, start, results, bar, log,
                                     chunk_setting, memory_fraction, checkpoint_every,
                                     log_every, compile_seconds, fast_compile)
      manager.close()
      if parallel.is_writer():
        write_summary(workdir, files.read_jsonl(results.path), replicas)
  finally:
    bar.close()
    results.close()
    for manager in managers.values():
      manager.close()
  rows = files.read_jsonl(results.path) if parallel.is_writer() else []
  done = {"num_replicas": len(replicas), "num_buckets": len(buckets),
          "num_diverged": len(results.diverged), "compile_seconds": round(compile_seconds, 2),
          "replica_steps": total, "results": os.path.join(workdir, RESULTS_FILE)}
  if parallel.is_writer():
    write_summary(workdir, rows, replicas)
    files.write_json(done_path, done)
  parallel.sync("bindjax_sweep_done")
  log(f"sweep finished: {len(replicas)} replicas, {len(results.diverged)} diverged; compile "
      f"{compile_seconds:.1f} s; results in {results.path}")
  return done


def _run_bucket(bucket, mesh, manager, start, results, bar, log, chunk_setting,
                memory_fraction, checkpoint_every, log_every, compile_before, fast_compile):
  """Trains one bucket from `start` to its last step; returns the compile seconds."""
  spec = bucket.spec
  shards = parallel.num_replica_shards(mesh)
  hyper_np, valid = parallel.pad_to_multiple(bucket.stacked_hyper(), shards)
  hyper = parallel.shard_replicas(hyper_np, mesh)
  t0 = time.perf_counter()
  init_fn, step_fn, eval_fn, chunk = compile_bucket(spec, mesh, hyper, chunk_setting,
                                                    memory_fraction, log, fast_compile)
  compile_seconds = time.perf_counter() - t0
  log(f"bucket {bucket.index}: {len(bucket.replicas)} replicas (padded to {len(valid)}), "
      f"|O| = {spec.space.num_objects}, d_model {spec.model.d_model}; compiled in "
      f"{compile_seconds:.1f} s" + (f"; chunk {chunk}" if chunk else ""))
  postfix = {"compile": f"{compile_before + compile_seconds:.0f}s"}
  bar.set_postfix(postfix, refresh=False)
  state = init_fn(hyper)
  if start:
    restored = manager.restore(checkpoint.abstract_target(state))
    start, state, _ = restored
    log(f"bucket {bucket.index}: resumed from the checkpoint at step {start}")
  manager.prune_after(start if start else None)

  pending = []

  def flush():
    for step, train_metrics, eval_metrics in pending:
      train_host = parallel.to_host(train_metrics)
      eval_host = parallel.to_host(eval_metrics) if eval_metrics is not None else None
      results.add(bucket, step, train_host, eval_host)
      if eval_host is not None:
        alive = train_host["diverged_step"][:len(bucket.replicas)] < 0
        acc = eval_host["heldout/object_accuracy"][:len(bucket.replicas)][alive]
        if acc.size:
          postfix["heldout_obj"] = f"{acc.mean():.3f}"
          bar.set_postfix(postfix, refresh=False)
    pending.clear()

  num_steps = spec.num_steps
  for step in range(start, num_steps):
    done = step + 1
    state, train_metrics = step_fn(state, hyper)
    is_eval = done % spec.eval_every == 0 or done == num_steps
    is_checkpoint = done % checkpoint_every == 0 or done == num_steps
    eval_metrics = None
    if is_eval:
      eval_metrics = eval_fn(state["train"].params, hyper, _global_scalar(done, mesh))
    # Metrics of the previous logged step: its values are ready by now, this step is queued.
    flush()
    if is_eval or is_checkpoint or done % log_every == 0:
      pending.append((done, train_metrics, eval_metrics))
    if is_checkpoint:
      flush()
      results.sync()
      manager.save(done, state, {"step": done, "bucket": bucket.index})
    bar.update(len(bucket.replicas))
  flush()
  manager.wait()
  return compile_seconds
