"""Binding-function complexity (SPEC §11): object-level splits and batch fitting of approximators.

The scenes are those holding exactly K (= max) objects. A model's split is a permutation of the
U object ids plus a training count, so train fractions and seeds change only arrays: every
(train fraction, seed, learning rate) of one approximator shape is a row of one `jit(vmap)`,
whose model axis is split over the devices of a `bindjax.parallel` mesh and chunked (`lax.map`)
when the models do not fit in memory at once. Each model trains by full-batch MSE on its
train-only scenes with Adam and is scored every `eval_every` steps by frozen linear probes.
"""
import csv
import dataclasses
import functools
import io
import json
import logging
import os
import time

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bindjax import files
from bindjax import objectives
from bindjax import parallel
from bindjax.probes import binding
from bindjax.probes import linear

MASKS = ("train_only", "test_only", "mixed")
SCHEDULES = ("cosine", "constant")


@dataclasses.dataclass(frozen=True)
class FitConfig:
  """Static training settings shared by a batch of models."""
  steps: int = 4000
  eval_every: int = 100
  # "constant" is the original code's behaviour (it builds a cosine schedule but never steps it).
  schedule: str = "cosine"
  probe_similarity: str = "dot"

  def validate(self):
    if self.schedule not in SCHEDULES:
      raise ValueError(f"schedule={self.schedule!r}: expected one of {SCHEDULES}")
    if self.steps < 1 or self.eval_every < 1 or self.steps % self.eval_every:
      raise ValueError(f"steps={self.steps}, eval_every={self.eval_every}: expected positive "
                       f"integers with eval_every dividing steps")
    if self.probe_similarity not in linear.SIMILARITIES:
      raise ValueError(f"probe_similarity={self.probe_similarity!r}: expected one of "
                       f"{linear.SIMILARITIES}")
    return self


@flax.struct.dataclass
class ComplexityData:
  """The K-object scenes of an embedding set, with everything scoring needs."""
  values_NxKxC: jax.Array   # int32 concept values
  targets_NxD: jax.Array    # float32 embeddings
  object_ids_NxK: jax.Array  # int32 SPEC §8 object ids
  labels: linear.ProbeLabels
  sq_dev_N: jax.Array       # ‖y_n − ȳ‖², ȳ = mean of all these scenes (R² denominator)
  num_unique: int = flax.struct.field(pytree_node=False, default=0)


@flax.struct.dataclass
class Points:
  """Per-model arrays of a batch (leading axis M)."""
  learning_rate_M: jax.Array
  permutation_MxU: jax.Array
  num_train_M: jax.Array
  key_Mx2: jax.Array


def prepare(embeddings_NxD, objects_NxKxC, num_objects_N, values_per_concept,
            scene_object_ids_NxK, num_unique):
  """ComplexityData of the scenes holding K objects (K = objects.shape[1]); also their rows."""
  embeddings_NxD = np.asarray(embeddings_NxD, np.float32)
  objects_NxKxC = np.asarray(objects_NxKxC)
  num_objects_N = np.asarray(num_objects_N)
  k = objects_NxKxC.shape[1]
  rows = np.flatnonzero(num_objects_N == k)
  if len(rows) < 2:
    raise ValueError(f"embedding set: {len(rows)} scenes hold K={k} objects; the complexity "
                     f"analysis needs at least 2")
  labels = linear.probe_labels(objects_NxKxC, num_objects_N, values_per_concept,
                               scene_object_ids_NxK, num_unique).take(rows)
  targets = embeddings_NxD[rows]
  sq_dev = ((targets - targets.mean(0)) ** 2).sum(-1)
  data = ComplexityData(jnp.asarray(objects_NxKxC[rows], jnp.int32), jnp.asarray(targets),
                        jnp.asarray(np.asarray(scene_object_ids_NxK)[rows], jnp.int32), labels,
                        jnp.asarray(sq_dev), int(num_unique))
  return data, rows


def from_set(embedding_set):
  """ComplexityData and row indices of an EmbeddingSet's K-object scenes."""
  ids_NxK, unique_UxC = embedding_set.object_ids()
  return prepare(embedding_set.embeddings, embedding_set.objects, embedding_set.num_objects,
                 tuple(embedding_set.values_per_concept), ids_NxK, len(unique_UxC))


def object_split(num_unique, fraction, seed):
  """SPEC §11: torch-compatible randperm(U) from seed; train = first clamp(int(f·U), 1, U-1)."""
  from bindjax.compat import torch_random  # pylint: disable=g-import-not-at-top
  if not 0 < fraction < 1:
    raise ValueError(f"train fraction={fraction}: expected 0 < f < 1")
  perm = np.asarray(torch_random.randperm(num_unique, seed), np.int32)
  return perm, linear.split_count(num_unique, fraction)


def scene_masks(object_ids_NxK, permutation_U, num_train):
  """[3, N] bool: train-only, test-only, mixed scenes for the training objects perm[:num_train]."""
  rank_U = jnp.zeros_like(permutation_U).at[permutation_U].set(
      jnp.arange(permutation_U.shape[0], dtype=permutation_U.dtype))
  is_train_NxK = rank_U[object_ids_NxK] < num_train
  train_only = is_train_NxK.all(-1)
  test_only = (~is_train_NxK).all(-1)
  return jnp.stack([train_only, test_only, ~(train_only | test_only)])


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
  masks = masks_3xN.astype(jnp.float32)
  count_3 = masks.sum(-1)
  safe_3 = jnp.maximum(count_3, 1.0)
  concept_acc_3 = (masks @ concept_correct_CxN.astype(jnp.float32).T).mean(-1) / safe_3
  object_acc_3 = masks @ object_correct_N.astype(jnp.float32) / safe_3
  sse_3 = masks @ se_N
  return {
      "concept_acc": concept_acc_3,
      "object_acc": object_acc_3,
      "mse": sse_3 / (safe_3 * pred_NxD.shape[-1]),
      "r2": 1.0 - sse_3 / jnp.maximum(masks @ data.sq_dev_N, 1e-12),
  }


def _lr_factor(step, config):
  if config.schedule == "constant":
    return 1.0
  return 0.5 * (1.0 + jnp.cos(jnp.pi * step / config.steps))


def _fit_one(point, data, probes, model, config):
  """Train one model; returns its evaluation history (dict of [num_evals, ...])."""
  masks_3xN = scene_masks(data.object_ids_NxK, point.permutation_MxU, point.num_train_M)
  train_N = masks_3xN[0]
  params = model.init(point.key_Mx2)
  adam = optax.scale_by_adam()
  opt_state = adam.init(params)

  def loss_fn(p):
    se_N = ((model.apply(p, data.values_NxKxC) - data.targets_NxD) ** 2).mean(-1)
    return objectives.masked_mean(se_N, train_N)

  def step(carry, t):
    p, state = carry
    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, state = adam.update(grads, state, p)
    lr = point.learning_rate_M * _lr_factor(t, config)
    p = jax.tree_util.tree_map(lambda x, u: x - lr * u, p, updates)
    return (p, state), loss

  def round_(carry, r):
    carry, losses = jax.lax.scan(step, carry, r * config.eval_every +
                                 jnp.arange(config.eval_every))
    pred = model.apply(carry[0], data.values_NxKxC)
    metrics = evaluate_predictions(pred, data, probes, masks_3xN, config.probe_similarity)
    metrics["train_loss"] = losses[-1]
    return carry, metrics

  _, history = jax.lax.scan(round_, (params, opt_state),
                            jnp.arange(config.steps // config.eval_every))
  return history


@functools.partial(jax.jit, static_argnames=("model", "config", "chunk_size", "num_shards"))
def _fit_points(points, data, probes, model, config, chunk_size, num_shards):
  fn = parallel.chunked_vmap(lambda p: _fit_one(p, data, probes, model, config), chunk_size,
                             num_shards)
  return fn(points)


def bytes_per_model(model, num_scenes, num_unique):
  """Rough memory of one model's fit: parameters ×5 (grads, Adam moments, update) + activations."""
  hidden = sum(model.widths) + model._head_in()  # pylint: disable=protected-access
  activations = num_scenes * (model.num_slots * model.width + hidden + model.out_dim) * 3
  scores = num_scenes * (num_unique + sum(model.values_per_concept)) * 2
  return 4 * (5 * model.num_parameters() + activations + scores)


def make_points(num_unique, fractions, seeds, learning_rates):
  """Points for every (fraction, seed, lr) given as equal-length sequences; keys from seeds."""
  perms, counts = [], []
  for f, s in zip(fractions, seeds):
    perm, count = object_split(num_unique, f, s)
    perms.append(perm)
    counts.append(count)
  keys = np.stack([np.asarray(jax.random.PRNGKey(int(s))) for s in seeds])
  return Points(np.asarray(learning_rates, np.float32), np.stack(perms).astype(np.int32),
                np.asarray(counts, np.int32), keys.astype(np.uint32))


def auto_mesh(num_models, devices=None):
  """Replica mesh over the fewest devices that still give the fewest models per device.

  E.g. 3 models on 8 devices use 3 devices (no padded copies); 9 models use 5 (2 per device).
  """
  devices = list(jax.devices() if devices is None else devices)
  per_device = -(-num_models // len(devices))
  used = min(len(devices), -(-num_models // per_device))
  return parallel.make_mesh(devices=devices[:used])


def fit_models(model, data, probes, points, config, mesh=None, chunk_size="auto",
               memory_bytes=None):
  """Fits M models of one shape (M = len of points) in one jit(vmap), sharded over the mesh.

  chunk_size: "auto" (from `bytes_per_model` and device memory), None (all at once) or an int.
  Returns (history dict of numpy [M, num_evals, ...], info dict with timings and chunking).
  """
  config.validate()
  num_models = int(np.shape(points.learning_rate_M)[0])
  mesh = mesh or auto_mesh(num_models)
  shards = parallel.num_replica_shards(mesh)
  padded, valid = parallel.pad_to_multiple(points, shards)
  per_device = len(valid) // shards
  if chunk_size == "auto":
    n = int(data.values_NxKxC.shape[0])
    chunk_size = parallel.choose_chunk_size(
        bytes_per_model(model, n, data.num_unique), per_device, num_shards=shards,
        memory_bytes=memory_bytes)
  sharded = parallel.shard_replicas(padded, mesh)
  replicated = jax.device_put((data, probes), parallel.replicated_sharding(mesh))
  start = time.perf_counter()
  compiled = _fit_points.lower(sharded, *replicated, model=model, config=config,
                               chunk_size=chunk_size, num_shards=shards).compile()
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  history = parallel.to_host(compiled(sharded, *replicated))
  run_s = time.perf_counter() - start
  history = {k: v[:num_models] for k, v in history.items()}
  memory = parallel.compiled_memory_bytes(compiled)
  info = {"model": model.name, "num_models": num_models, "padded_models": len(valid),
          "chunk_size": chunk_size, "compile_s": compile_s, "run_s": run_s,
          "compiled_temp_bytes": memory[0] if memory else None}
  logging.info("%s: %d models, compile %.1fs, run %.1fs", model.name, num_models, compile_s,
               run_s)
  return history, info


def summarize(history, config):
  """Per-model summary of a history: best test-only object accuracy (headline) and finals."""
  test = MASKS.index("test_only")
  object_acc_MxE = history["object_acc"][..., test]
  best_E_index = object_acc_MxE.argmax(-1)
  rows = []
  for m, e in enumerate(best_E_index):
    row = {
        "best_test_object_acc": float(object_acc_MxE[m, e]),
        "best_step": int((e + 1) * config.eval_every),
        "test_concept_acc_at_best": float(history["concept_acc"][m, e, test]),
        "best_test_concept_acc": float(history["concept_acc"][m, :, test].max()),
        "best_test_r2": float(history["r2"][m, :, test].max()),
        "final_train_loss": float(history["train_loss"][m, -1]),
        # A diverged model is flagged, not fatal: its metrics are whatever NaNs gave.
        "diverged": bool(not np.isfinite(history["train_loss"][m]).all()),
    }
    for key in ("concept_acc", "object_acc", "mse", "r2"):
      for i, mask in enumerate(MASKS):
        row[f"final_{mask}_{key}"] = float(history[key][m, -1, i])
    rows.append(row)
  return rows


def mask_counts(data, points):
  """[M, 3] scene counts of the three masks of every point (host numpy)."""
  fn = jax.vmap(lambda p, n: scene_masks(data.object_ids_NxK, p, n).sum(-1))
  return np.asarray(fn(jnp.asarray(points.permutation_MxU), jnp.asarray(points.num_train_M)))


@dataclasses.dataclass(frozen=True)
class GridEntry:
  """One fit of a grid: approximator, train fraction, seed, learning rate."""
  model: binding.Approximator
  train_fraction: float
  seed: int
  learning_rate: float


def fit_grid(entries, data, probes, config, mesh=None, chunk_size="auto", memory_bytes=None):
  """Fits every entry, one jit(vmap) per approximator shape; returns (result rows, infos).

  Each row holds the grid coordinates, scene counts per mask, the summary of `summarize` and
  the full evaluation history (lists over evaluations; masks in MASKS order).
  """
  config.validate()
  buckets = {}
  for i, entry in enumerate(entries):
    buckets.setdefault(entry.model, []).append(i)
  rows = [None] * len(entries)
  infos = []
  for model, indices in buckets.items():
    group = [entries[i] for i in indices]
    points = make_points(data.num_unique, [e.train_fraction for e in group],
                         [e.seed for e in group], [e.learning_rate for e in group])
    history, info = fit_models(model, data, probes, points, config, mesh, chunk_size,
                               memory_bytes)
    infos.append(info)
    counts = mask_counts(data, points)
    for j, (i, summary) in enumerate(zip(indices, summarize(history, config))):
      e = entries[i]
      rows[i] = {
          "family": model.family, "name": model.name, "widths": list(model.widths),
          "learned_w": model.learned_w, "embed_dim": model.width,
          "num_parameters": model.num_parameters(),
          "train_fraction": float(e.train_fraction), "seed": int(e.seed),
          "learning_rate": float(e.learning_rate), "schedule": config.schedule,
          "steps": config.steps, "num_train_objects": int(points.num_train_M[j]),
          **{f"num_{mask}_scenes": int(counts[j, k]) for k, mask in enumerate(MASKS)},
          **summary,
          "history": {key: np.asarray(v[j]).tolist() for key, v in history.items()},
      }
  return rows, infos


def frozen_probes(embedding_set, source="auto", probe_config=None):
  """Probe weights that score predictions: stored ones or freshly fitted on all scenes.

  source: "stored" (EmbeddingSet.probes, error if missing), "fit", or "auto" (stored when the
  set has every head, else fit). Fitted probes use all scenes (SPEC §11 scores with probes of
  the full set). Returns (ProbeWeights, description string).
  """
  vpc = tuple(embedding_set.values_per_concept)
  heads = [f"concept_{c}" for c in range(len(vpc))] + ["object"]
  stored = embedding_set.probes or {}
  has_all = all(h in stored for h in heads)
  if source == "stored" or (source == "auto" and has_all):
    return linear.probes_to_weights(stored, vpc), "stored"
  if source not in ("auto", "fit"):
    raise ValueError(f"probes={source!r}: expected 'auto', 'stored' or 'fit'")
  probe_config = probe_config or linear.ProbeConfig()
  labels = linear.labels_from_set(embedding_set)
  n = embedding_set.embeddings.shape[0]
  weights, _ = linear.fit_probes(embedding_set.embeddings, labels, np.ones(n, bool), probe_config)
  if probe_config.similarity == "cosine":  # Rank-equivalent dot probes (see weights_to_probes).
    weights = linear.probes_to_weights(linear.weights_to_probes(weights, vpc, "cosine"), vpc)
  return weights, f"fit on all {n} scenes, {probe_config.steps} steps"


def estimate_grid_bytes(entries, num_scenes, num_unique):
  """Sum of `bytes_per_model` over entries (for reporting)."""
  return sum(bytes_per_model(e.model, num_scenes, num_unique) for e in entries)




def all_scenes(values_per_concept, max_objects):
  """Every ordered K-tuple of all objects, row-major: (objects [N,K,C], object ids [N,K]).

  Object ids are mixed-radix little-endian (id = Σ_c v_c Π_{c'<c} V_c'), which is also the
  SPEC §8 first-appearance order of this scene list.
  """
  grids = np.meshgrid(*[np.arange(v) for v in values_per_concept], indexing="ij")
  objects_UxC = np.stack([g.reshape(-1, order="F")
                          for g in grids], axis=-1)
  u = len(objects_UxC)
  ids = np.stack(np.meshgrid(*[np.arange(u)] * max_objects, indexing="ij"), -1).reshape(
      -1, max_objects)
  return objects_UxC[ids].astype(np.int32), ids.astype(np.int32)


def parse_models(spec, values_per_concept, max_objects, out_dim, embed_dim=0):
  """Approximators from "mlp:1024,mlp:512x512,additive,product,product:W,sum_product,...".

  Raises ValueError naming the bad item.
  """
  models = []
  for item in [s.strip() for s in str(spec).split(",") if s.strip()]:
    family, _, option = item.partition(":")
    try:
      if family == "mlp":
        widths = tuple(int(w) for w in option.split("x")) if option else ()
        models.append(binding.make("mlp", values_per_concept, max_objects, out_dim, widths,
                                   embed_dim))
      else:
        if option not in ("", "W"):
          raise ValueError(f"option {option!r}: only ':W' (learned W) is known")
        models.append(binding.make(family, values_per_concept, max_objects, out_dim, (),
                                   embed_dim, learned_w=option == "W"))
    except ValueError as e:
      raise ValueError(f"models item {item!r}: {e}") from None
  if not models:
    raise ValueError(f"models={spec!r}: expected at least one approximator")
  return models


def grid_entries(models, fractions, seeds, learning_rates):
  """Every (model, fraction, seed, lr) combination, model-major."""
  return [GridEntry(m, float(f), int(s), float(lr)) for m in models for f in fractions
          for s in seeds for lr in learning_rates]


CSV_COLUMNS = (
    "name", "family", "train_fraction", "seed", "learning_rate", "schedule", "steps",
    "num_parameters", "num_train_objects", "num_train_only_scenes", "num_test_only_scenes",
    "num_mixed_scenes", "best_test_object_acc", "best_step", "test_concept_acc_at_best",
    "best_test_concept_acc", "best_test_r2", "final_train_loss", "diverged",
    *[f"final_{m}_{k}" for k in ("concept_acc", "object_acc", "mse", "r2") for m in MASKS])


def rows_to_csv(rows):
  """CSV text of result rows (history left out)."""
  out = io.StringIO()
  writer = csv.DictWriter(out, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
  writer.writeheader()
  for row in rows:
    writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS})
  return out.getvalue()


def _resolve_chunk(value):
  if value in (None, "none", "None", ""):
    return None
  if value == "auto":
    return "auto"
  try:
    chunk = int(value)
  except (TypeError, ValueError):
    raise ValueError(f"chunk_size={value!r}: expected 'auto', 'none' or an integer") from None
  if chunk < 1:
    raise ValueError(f"chunk_size={value!r}: expected ≥ 1")
  return chunk


def _load_probes_file(path, values_per_concept):
  with np.load(path, allow_pickle=False) as f:
    probes = {k: f[k] for k in f.files}
  return linear.probes_to_weights(probes, values_per_concept)


def run(config, workdir, embedding_set=None, log=print):
  """The `bindjax complexity` flow: probes, batch-fitted grid, optional trees; writes results.

  Writes workdir/results.json (config, probe source, timings, rows with histories),
  workdir/results.csv and workdir/complexity.png. Returns the result rows.
  """
  results_path = os.path.join(workdir, "results.json")
  if os.path.exists(results_path) and not config.get("overwrite", False):
    raise FileExistsError(f"{results_path} exists; set --config.overwrite=True to replace it")
  if embedding_set is None:
    from bindjax.commands import probe as probe_command  # pylint: disable=g-import-not-at-top
    embedding_set = probe_command.load_embedding_set(config.embeddings)
  vpc = tuple(embedding_set.values_per_concept)
  fit_config = FitConfig(steps=int(config.steps), eval_every=int(config.eval_every),
                         schedule=config.schedule,
                         probe_similarity="dot").validate()
  models = parse_models(config.models, vpc, embedding_set.objects.shape[1],
                        embedding_set.embeddings.shape[1], int(config.embed_dim))
  chunk_size = _resolve_chunk(config.chunk_size)
  start = time.perf_counter()
  if config.probes_file:
    probes, probe_source = _load_probes_file(config.probes_file, vpc), config.probes_file
  else:
    probe_config = linear.ProbeConfig(steps=int(config.probe_steps),
                                      similarity=config.probe_similarity)
    probes, probe_source = frozen_probes(embedding_set, config.probes, probe_config)
  probe_s = time.perf_counter() - start
  data, _ = from_set(embedding_set)
  all_rows = np.ones(data.values_NxKxC.shape[0], bool)
  probe_check = {
      k: float(np.asarray(v)[0]) for k, v in evaluate_predictions(
          data.targets_NxD, data, probes, jnp.asarray(np.stack([all_rows] * 3))).items()
      if k in ("concept_acc", "object_acc")}
  log(f"probes ({probe_source}) on the real {len(all_rows)} K-object scenes: concept acc "
      f"{probe_check['concept_acc']:.3f}, object acc {probe_check['object_acc']:.3f}")
  entries = grid_entries(models, config.train_fractions, config.seeds, config.learning_rates)
  start = time.perf_counter()
  rows, infos = fit_grid(entries, data, probes, fit_config, chunk_size=chunk_size,
                         memory_bytes=int(config.memory_bytes) or None)
  grid_s = time.perf_counter() - start
  if config.trees:
    from bindjax.probes import trees  # pylint: disable=g-import-not-at-top
    for kind in [k.strip() for k in config.tree_models.split(",") if k.strip()]:
      fractions = [f for f in config.train_fractions for _ in config.seeds]
      seeds = [s for _ in config.train_fractions for s in config.seeds]
      rows += trees.fit_trees(kind, data, probes, fractions, seeds,
                              int(config.tree_estimators))
  for row in rows:
    log(f"{row['name']:>20} f={row['train_fraction']:.2f} seed={row['seed']}: best test-only "
        f"object acc {row['best_test_object_acc']:.3f}, concept acc "
        f"{row['test_concept_acc_at_best']:.3f}, test R² {row['best_test_r2']:.3f}")
  summary = {
      "config": config.to_dict(), "embeddings": embedding_set.provenance,
      "num_scenes": int(len(all_rows)), "num_objects": data.num_unique,
      "probes": probe_source, "probe_accuracy_on_real": probe_check, "probe_s": probe_s,
      "grid_s": grid_s, "buckets": infos, "masks": list(MASKS), "rows": rows,
  }
  os.makedirs(workdir, exist_ok=True)
  files.write_atomic(os.path.join(workdir, "results.csv"), rows_to_csv(rows))
  from bindjax.plots import complexity as plot  # pylint: disable=g-import-not-at-top
  plot.save_figure(rows, os.path.join(workdir, "complexity.png"))
  files.write_atomic(results_path, json.dumps(summary, indent=1, default=_json_default))
  return rows


def _json_default(value):
  if isinstance(value, (np.integer, np.floating)):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, tuple):
    return list(value)
  return str(value)
