"""Linear concept and object probes on frozen embeddings (docs/probes.md).

One bias-free linear map D→V_c per concept and one D→U for objects, trained together with the
summed soft cross-entropy of every head, Adam and a cosine decay to 0, full batch over the
training rows, as compiled `lax.scan` chunks. `fit_probes` takes a stack of M embedding matrices
sharing labels and split and fits them as M replicas of the replica engine
(`bindjax.runtime.engine`: placed on a mesh, chunked to fit in memory, compiled ahead);
`score_embeddings` scores any (e.g. predicted) embeddings with frozen probes and is vmappable
over models. The analysis of a set (split, fit, score, files) is
`bindjax.frozen.probes.probe_analysis`'s.

Concept heads of different V_c are padded to max V_c and masked, so all heads live in one array.
"""
import dataclasses
import functools
import logging
import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bindjax.core import objectives
from bindjax.runtime import engine
from bindjax.runtime import parallel

SIMILARITIES = ("dot", "cosine")
# Which scenes `run_probes` splits and fits: every scene, or the 2-object scenes alone (the
# original code's probes: on a set that also holds single-object scenes, the two differ).
SCENES = ("all", "two-object")
# exp(2.659) = 1/0.07, the usual learnable-temperature start for cosine logits.
_INIT_LOG_TEMPERATURE = math.log(1 / 0.07)


@dataclasses.dataclass(frozen=True)
class ProbeConfig:
  """Static probe settings (hashable: a jit static argument)."""
  steps: int = 10_000
  learning_rate: float = 1e-2
  similarity: str = "dot"
  train_fraction: float = 0.4
  seed: int = 0
  init_log_temperature: float = _INIT_LOG_TEMPERATURE
  scenes: str = "all"

  def validate(self):
    if self.scenes not in SCENES:
      raise ValueError(f"ProbeConfig.scenes={self.scenes!r}: expected one of {SCENES}")
    if self.similarity not in SIMILARITIES:
      raise ValueError(f"ProbeConfig.similarity={self.similarity!r}: expected one of "
                       f"{SIMILARITIES}")
    if self.steps < 1:
      raise ValueError(f"ProbeConfig.steps={self.steps}: expected ≥ 1")
    if not self.learning_rate > 0:
      raise ValueError(f"ProbeConfig.learning_rate={self.learning_rate}: expected > 0")
    if not 0 < self.train_fraction <= 1:
      raise ValueError(f"ProbeConfig.train_fraction={self.train_fraction}: expected in (0, 1]")
    return self


@flax.struct.dataclass
class ProbeLabels:
  """Multi-hot targets of every head for N scenes (duplicates count once)."""
  concept_CxNxV: jax.Array     # float32, padded to max V_c
  concept_mask_CxV: jax.Array  # bool, False on padding
  object_NxU: jax.Array        # float32
  num_objects_N: jax.Array     # int32, for accuracy by count
  values_per_concept: tuple = flax.struct.field(pytree_node=False, default=())
  max_objects: int = flax.struct.field(pytree_node=False, default=1)  # K

  def take(self, rows):
    """Labels of a subset of scenes."""
    return self.replace(concept_CxNxV=self.concept_CxNxV[:, rows], object_NxU=self.object_NxU[rows],
                        num_objects_N=self.num_objects_N[rows])


@flax.struct.dataclass
class ProbeWeights:
  """Probe vectors (rows = classes, like torch Linear.weight) and cosine log-temperatures."""
  concept_CxVxD: jax.Array
  object_UxD: jax.Array
  log_temperature_H: jax.Array  # [C+1]: concepts then object; unused for dot logits


def probe_labels(objects_NxKxC, num_objects_N, values_per_concept, scene_object_ids_NxK,
                 num_unique):
  """Builds ProbeLabels from scenes (objects padded with -1) and their object ids (first
  appearance order, docs/probes.md "Targets and loss")."""
  objects_NxKxC = np.asarray(objects_NxKxC)
  num_objects_N = np.asarray(num_objects_N)
  ids_NxK = np.asarray(scene_object_ids_NxK)
  n, k, c = objects_NxKxC.shape
  if len(values_per_concept) != c:
    raise ValueError(f"values_per_concept={values_per_concept}: expected {c} concepts to match "
                     f"objects of shape {objects_NxKxC.shape}")
  if ids_NxK.shape != (n, k):
    raise ValueError(f"scene_object_ids shape {ids_NxK.shape}: expected {(n, k)}")
  present_NxK = np.arange(k)[None, :] < num_objects_N[:, None]
  v_max = max(values_per_concept)
  concept_CxNxV = np.zeros((c, n, v_max), np.float32)
  rows_NxK = np.broadcast_to(np.arange(n)[:, None], (n, k))
  for ci, v in enumerate(values_per_concept):
    vals_NxK = objects_NxKxC[..., ci]
    if np.any(present_NxK & ((vals_NxK < 0) | (vals_NxK >= v))):
      raise ValueError(f"objects: concept {ci} has values outside 0..{v - 1}")
    concept_CxNxV[ci, rows_NxK[present_NxK], vals_NxK[present_NxK]] = 1.0
  if np.any(present_NxK & ((ids_NxK < 0) | (ids_NxK >= num_unique))):
    raise ValueError(f"scene_object_ids: expected ids in 0..{num_unique - 1} for present objects")
  object_NxU = np.zeros((n, num_unique), np.float32)
  object_NxU[rows_NxK[present_NxK], ids_NxK[present_NxK]] = 1.0
  concept_mask_CxV = np.arange(v_max)[None, :] < np.asarray(values_per_concept)[:, None]
  return ProbeLabels(jnp.asarray(concept_CxNxV), jnp.asarray(concept_mask_CxV),
                     jnp.asarray(object_NxU), jnp.asarray(num_objects_N, jnp.int32),
                     tuple(int(v) for v in values_per_concept), int(k))


def labels_from_set(embedding_set):
  """ProbeLabels of an EmbeddingSet (object ids from `EmbeddingSet.object_ids()`)."""
  ids_NxK, unique_UxC = embedding_set.object_ids()
  return probe_labels(embedding_set.objects, embedding_set.num_objects,
                      tuple(embedding_set.values_per_concept), ids_NxK, len(unique_UxC))


def split_count(num_rows, fraction):
  """Training rows of a split: clamp(int(fraction·n), 1, n-1) (docs/probes.md "Training")."""
  if num_rows < 2:
    raise ValueError(f"num_rows={num_rows}: a split needs at least 2 rows")
  return min(max(1, int(fraction * num_rows)), num_rows - 1)


def scene_split(num_scenes, seed, train_fraction=ProbeConfig.train_fraction):
  """Scene split: torch-compatible randperm(N) from `seed`; train = first clamp(int(fN))."""
  from bindjax.frozen.compat import torch_random  # pylint: disable=g-import-not-at-top
  perm = np.asarray(torch_random.randperm(num_scenes, seed), np.int64)
  n_train = split_count(num_scenes, train_fraction)
  return perm[:n_train], perm[n_train:]


def _safe_norm(x):
  # Zero rows (padded concept values) would give a NaN gradient through jnp.linalg.norm.
  return jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), 1e-24))


def _logits(z_NxD, w_QxD, log_temperature, similarity):
  if similarity == "dot":
    return z_NxD @ w_QxD.T
  z_NxD = z_NxD / (1e-6 + _safe_norm(z_NxD))
  w_QxD = w_QxD / (1e-6 + _safe_norm(w_QxD))
  return jnp.exp(log_temperature) * (z_NxD @ w_QxD.T)


def head_logits(weights, z_NxD, similarity="dot"):
  """(concept logits [C,N,V] (padding columns are garbage: mask them), object logits [N,U])."""
  concept = jax.vmap(lambda w, t: _logits(z_NxD, w, t, similarity))(
      weights.concept_CxVxD, weights.log_temperature_H[:-1])
  obj = _logits(z_NxD, weights.object_UxD, weights.log_temperature_H[-1], similarity)
  return concept, obj


def _head_losses(weights, z_NxD, labels, row_mask_N, similarity):
  concept_CxNxV, object_NxU = head_logits(weights, z_NxD, similarity)
  row_mask_N = row_mask_N.astype(bool)

  def concept_loss(logits_NxV, labels_NxV, mask_V):
    rows_N = row_mask_N & objectives.active_rows(labels_NxV, mask_V)
    return objectives.soft_cross_entropy(logits_NxV, labels_NxV, rows_N, mask_V)

  concept_C = jax.vmap(concept_loss)(concept_CxNxV, labels.concept_CxNxV, labels.concept_mask_CxV)
  object_mask_U = jnp.ones(labels.object_NxU.shape[-1], bool)
  object_rows_N = row_mask_N & objectives.active_rows(labels.object_NxU, object_mask_U)
  object_loss = objectives.soft_cross_entropy(object_NxU, labels.object_NxU, object_rows_N,
                                              object_mask_U)
  return concept_C, object_loss


def probe_loss(weights, z_NxD, labels, row_mask_N, similarity="dot"):
  """Σ soft-CE over concept heads plus the object head, on the rows of row_mask."""
  concept_C, object_loss = _head_losses(weights, z_NxD, labels, row_mask_N, similarity)
  return concept_C.sum() + object_loss


def score_embeddings(weights, embeddings_NxD, labels, row_mask_N, similarity="dot"):
  """Set-separation accuracy and losses of frozen probes on the rows of row_mask.

  Returns a dict of arrays: concept_acc (mean over concepts), concept_acc_per_concept [C],
  object_acc, object_acc_per_count [K], concept_loss, object_loss, loss. An accuracy over no
  rows (a count no scene has) is NaN, which JSON results write as null. Pure and vmappable
  over weights and/or embeddings.
  """
  z_NxD = jnp.asarray(embeddings_NxD, jnp.float32)
  row_mask_N = jnp.asarray(row_mask_N).astype(bool)
  concept_CxNxV, object_NxU = head_logits(weights, z_NxD, similarity)

  def concept_acc(logits_NxV, labels_NxV, mask_V):
    rows_N = row_mask_N & objectives.active_rows(labels_NxV, mask_V)
    correct_N = objectives.set_separation_correct(logits_NxV, labels_NxV, mask_V)
    return _nan_without_rows(objectives.masked_mean(correct_N, rows_N), rows_N.sum())

  per_concept_C = jax.vmap(concept_acc)(concept_CxNxV, labels.concept_CxNxV,
                                        labels.concept_mask_CxV)
  object_mask_U = jnp.ones(labels.object_NxU.shape[-1], bool)
  object_rows_N = row_mask_N & objectives.active_rows(labels.object_NxU, object_mask_U)
  object_correct_N = objectives.set_separation_correct(object_NxU, labels.object_NxU,
                                                       object_mask_U)
  object_acc, per_count_K, rows_K = objectives.accuracy_by_count(
      object_correct_N, object_rows_N, labels.num_objects_N, labels.max_objects)
  object_acc = _nan_without_rows(object_acc, object_rows_N.sum())
  per_count_K = _nan_without_rows(per_count_K, rows_K)
  concept_losses_C, object_loss = _head_losses(weights, z_NxD, labels, row_mask_N, similarity)
  return {
      "concept_acc": per_concept_C.mean(),
      "concept_acc_per_concept": per_concept_C,
      "object_acc": object_acc,
      "object_acc_per_count": per_count_K,
      "concept_loss": concept_losses_C.sum(),
      "object_loss": object_loss,
      "loss": concept_losses_C.sum() + object_loss,
  }


def _nan_without_rows(value, num_rows):
  return jnp.where(num_rows > 0, value, jnp.nan)


def init_weights(key, values_per_concept, num_unique, dim, config):
  """Torch-Linear-style init U(±1/√D); padded concept rows are zero."""
  v_max = max(values_per_concept)
  concept_key, object_key = jax.random.split(key)
  bound = 1.0 / math.sqrt(dim)
  concept = jax.random.uniform(concept_key, (len(values_per_concept), v_max, dim), jnp.float32,
                               -bound, bound)
  mask_CxV = jnp.arange(v_max)[None, :] < jnp.asarray(values_per_concept)[:, None]
  concept = jnp.where(mask_CxV[..., None], concept, 0.0)
  obj = jax.random.uniform(object_key, (num_unique, dim), jnp.float32, -bound, bound)
  log_t = jnp.full((len(values_per_concept) + 1,), config.init_log_temperature, jnp.float32)
  return ProbeWeights(concept, obj, log_t)


# Steps per compiled call of a probe fit (at most; a divisor of the steps): the host reports
# progress between calls.
MAX_CHUNK_STEPS = 1000


def _optimizer(config):
  return optax.adam(optax.cosine_decay_schedule(config.learning_rate, config.steps))


def bytes_per_model(num_train_rows, dim, labels):
  """Rough memory (bytes) of one model's probe fit: its parameters ×5 (weights, gradients, Adam's
  two moments, update), its training rows, and a step's logits ×3 (with their softmax and
  gradient) over those rows."""
  num_concepts, _, v_max = labels.concept_CxNxV.shape
  classes = num_concepts * v_max + labels.object_NxU.shape[-1]
  parameters = classes * dim + num_concepts + 1
  return 4 * (5 * parameters + num_train_rows * dim + 3 * num_train_rows * classes)


def _initial_state(key, labels, num_models, dim, config):
  """(ProbeWeights, Adam state) of one initialisation, repeated for M models (host arrays)."""
  weights = init_weights(key, labels.values_per_concept, labels.object_NxU.shape[-1], dim, config)
  state = (weights, _optimizer(config).init(weights))
  return jax.tree_util.tree_map(
      lambda x: np.broadcast_to(np.asarray(x), (num_models,) + np.shape(x)), state)


@functools.partial(jax.jit, static_argnames=("config", "num_steps", "chunk_size", "num_shards"),
                   donate_argnames=("state",))
def _train_models(state, embeddings_MxTxD, labels, config, num_steps, chunk_size, num_shards):
  """num_steps Adam steps of every model on all T (training) rows, `chunk_size` models at a
  time (`parallel.chunked_vmap`): (state, losses [M, num_steps])."""
  optimizer = _optimizer(config)
  all_rows_T = jnp.ones(embeddings_MxTxD.shape[1], bool)

  def fit_one(state, z_TxD):
    def step(carry, _):
      w, opt_state = carry
      loss, grads = jax.value_and_grad(probe_loss)(w, z_TxD, labels, all_rows_T,
                                                   config.similarity)
      if config.similarity != "cosine":  # Dot logits have no temperature to learn.
        grads = grads.replace(log_temperature_H=jnp.zeros_like(grads.log_temperature_H))
      updates, opt_state = optimizer.update(grads, opt_state, w)
      return (optax.apply_updates(w, updates), opt_state), loss

    return jax.lax.scan(step, state, None, length=num_steps)

  return parallel.chunked_vmap(fit_one, chunk_size, num_shards)(state, embeddings_MxTxD)


def _training_rows(embeddings, labels, train_mask_N):
  """(embeddings [M, T, D] and labels of the training rows (host), whether the input was one
  [N, D] matrix); ValueError on mismatched shapes."""
  embeddings_MxNxD = np.asarray(embeddings, np.float32)
  single = embeddings_MxNxD.ndim == 2
  if single:
    embeddings_MxNxD = embeddings_MxNxD[None]
  if embeddings_MxNxD.ndim != 3:
    raise ValueError(f"embeddings shape {embeddings_MxNxD.shape}: expected [N, D] or [M, N, D]")
  n = embeddings_MxNxD.shape[1]
  train_mask_N = np.asarray(train_mask_N).astype(bool)
  if train_mask_N.shape != (n,) or labels.object_NxU.shape[0] != n:
    raise ValueError(f"train_mask shape {train_mask_N.shape} and labels rows "
                     f"{labels.object_NxU.shape[0]}: expected both to have N={n} rows")
  rows_T = np.flatnonzero(train_mask_N)
  return embeddings_MxNxD[:, rows_T], labels.take(rows_T), single


def _chunk_size(chunk_size, mesh, num_padded, labels, train_MxTxD, memory_bytes):
  """fit_probes' chunk_size with "auto" resolved by `engine.auto_chunk`; the labels of the
  training rows are held once per device."""
  chunk_size = parallel.chunk_setting(chunk_size)
  if chunk_size != parallel.AUTO:
    return chunk_size
  _, num_train, dim = train_MxTxD.shape
  label_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(labels))
  return engine.auto_chunk(mesh, num_padded, bytes_per_model(num_train, dim, labels),
                           fixed_bytes=label_bytes, memory_bytes=memory_bytes, log=logging.info)


def fit_probes(embeddings, labels, train_mask_N, config=ProbeConfig(), on_chunk=None, *,
               mesh=None, chunk_size=parallel.AUTO, memory_bytes=None):
  """Fits all probe heads on the rows of train_mask, for one [N,D] or a stack [M,N,D] of embeddings.

  All M stacks share labels, split and initial weights (seed) and are fitted on their training
  rows alone (gathered once) through the replica engine: placed on `mesh` along its replica axis
  (default `engine.auto_mesh(M)`), `chunk_size` models at a time ("auto": `engine.auto_chunk` of
  `bytes_per_model` against `memory_bytes`, default the device's; None: all at once; or an int),
  in compiled calls (`engine.compile_ahead`) of at most MAX_CHUNK_STEPS steps; on_chunk(
  steps_in_call, loss_M) is called after each. Returns (ProbeWeights, loss curve [steps]) with a
  leading M axis when the input was a stack.
  """
  config.validate()
  train_MxTxD, train_labels, single = _training_rows(embeddings, labels, train_mask_N)
  num_models, _, dim = train_MxTxD.shape
  mesh = mesh or engine.auto_mesh(num_models)
  initial = _initial_state(jax.random.PRNGKey(config.seed), labels, num_models, dim, config)
  (state, train_s), valid = engine.place((initial, train_MxTxD), mesh)
  labels_r = jax.device_put(train_labels, parallel.replicated_sharding(mesh))
  steps_per_call = max(d for d in range(1, min(config.steps, MAX_CHUNK_STEPS) + 1)
                       if config.steps % d == 0)
  train = engine.compile_ahead(
      _train_models, state, train_s, labels_r, config=config, num_steps=steps_per_call,
      chunk_size=_chunk_size(chunk_size, mesh, len(valid), train_labels, train_MxTxD,
                             memory_bytes),
      num_shards=parallel.num_replica_shards(mesh))
  losses = []
  for _ in range(config.steps // steps_per_call):
    state, loss_MxS = train(state, train_s, labels_r)
    losses.append(parallel.to_host(loss_MxS)[:num_models])
    if on_chunk is not None:
      on_chunk(steps_per_call, losses[-1][:, -1])
  losses = np.concatenate(losses, axis=1)
  # Returned as jax arrays on the default device, as callers score with them.
  weights = jax.tree_util.tree_map(lambda x: jnp.asarray(x[:num_models]),
                                   parallel.to_host(state[0]))
  if single:
    weights, losses = jax.tree_util.tree_map(lambda x: x[0], (weights, losses))
  return weights, losses


def rows_to_mask(rows, num_rows):
  """Boolean mask of length num_rows, True at rows."""
  mask = np.zeros(num_rows, bool)
  mask[np.asarray(rows)] = True
  return mask


def weights_to_probes(weights, values_per_concept, similarity="dot"):
  """ProbeWeights -> EmbeddingSet.probes naming: "concept_c" [V_c, D], "object" [U, D].

  Cosine probes are stored row-normalised so plain dot products with normalised embeddings
  reproduce their ranking (the temperature only scales logits).
  """
  concept = np.asarray(weights.concept_CxVxD)
  obj = np.asarray(weights.object_UxD)
  if similarity == "cosine":
    concept = concept / (1e-6 + np.linalg.norm(concept, axis=-1, keepdims=True))
    obj = obj / (1e-6 + np.linalg.norm(obj, axis=-1, keepdims=True))
  probes = {f"concept_{c}": concept[c, :v].astype(np.float32)
            for c, v in enumerate(values_per_concept)}
  probes["object"] = obj.astype(np.float32)
  return probes


def probes_to_weights(probes, values_per_concept):
  """EmbeddingSet.probes dict -> ProbeWeights for dot-product scoring (raises on missing heads)."""
  missing = [f"concept_{c}" for c in range(len(values_per_concept))
             if f"concept_{c}" not in probes] + ([] if "object" in probes else ["object"])
  if missing:
    raise ValueError(f"probes: missing {missing}; have {sorted(probes)}")
  dim = np.asarray(probes["object"]).shape[-1]
  v_max = max(values_per_concept)
  concept = np.zeros((len(values_per_concept), v_max, dim), np.float32)
  for c, v in enumerate(values_per_concept):
    w = np.asarray(probes[f"concept_{c}"], np.float32)
    if w.shape != (v, dim):
      raise ValueError(f"probes['concept_{c}'] shape {w.shape}: expected {(v, dim)}")
    concept[c, :v] = w
  return ProbeWeights(jnp.asarray(concept), jnp.asarray(probes["object"], jnp.float32),
                      jnp.zeros(len(values_per_concept) + 1, jnp.float32))


def to_python(metrics):
  """Arrays -> floats/lists for JSON."""
  return jax.tree_util.tree_map(lambda x: np.asarray(x).tolist(), metrics)
