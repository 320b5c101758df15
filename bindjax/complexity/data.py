"""Scenes and object-level splits of the complexity analysis (docs/complexity.md, "Object split").

The analysis uses the scenes holding exactly K (= max) objects. A split is a permutation of the
U object ids plus a training count: the first `num_train` objects of the permutation are the
training objects. A scene is train-only when all its objects are training objects, test-only
when none is, and mixed otherwise. Approximators train on the train-only scenes; all three
masks are scored.
"""
import flax
import jax
import jax.numpy as jnp
import numpy as np

from bindjax.frozen.compat import torch_random
from bindjax.frozen.probes import linear

MASKS = ("train_only", "test_only", "mixed")


@flax.struct.dataclass
class ComplexityData:
  """The K-object scenes of an embedding set, with everything scoring needs."""
  values_NxKxC: jax.Array   # int32 concept values
  targets_NxD: jax.Array    # float32 embeddings
  object_ids_NxK: jax.Array  # int32 object ids (first-appearance order of the whole set)
  labels: linear.ProbeLabels
  sq_dev_N: jax.Array       # ‖y_n − ȳ‖², ȳ = mean of all these scenes (R² denominator)
  num_unique: int = flax.struct.field(pytree_node=False, default=0)

  @property
  def num_scenes(self):
    return int(self.values_NxKxC.shape[0])


@flax.struct.dataclass
class OwnTargets:
  """Embeddings and probes of several models of the same scenes (leading axis M on every leaf):
  a fit given one of them (`grid_fits.fit_grid`'s `own`) trains on and is scored by its own model's
  embeddings and probes, e.g. every replica of a sweep (docs/binding.md)."""
  targets_MxNxD: jax.Array
  sq_dev_MxN: jax.Array         # squared_deviation of each model's targets
  probes: linear.ProbeWeights


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
  targets_NxD = embeddings_NxD[rows]
  sq_dev_N = squared_deviation(targets_NxD)
  data = ComplexityData(jnp.asarray(objects_NxKxC[rows], jnp.int32), jnp.asarray(targets_NxD),
                        jnp.asarray(np.asarray(scene_object_ids_NxK)[rows], jnp.int32), labels,
                        jnp.asarray(sq_dev_N), int(num_unique))
  return data, rows


def squared_deviation(targets_NxD):
  """‖y_n − ȳ‖² of every scene, ȳ the mean of all scenes (the R² denominator; host numpy)."""
  targets_NxD = np.asarray(targets_NxD, np.float32)
  return ((targets_NxD - targets_NxD.mean(0)) ** 2).sum(-1)


def own_targets(targets_MxNxD, probes):
  """OwnTargets of M models' embeddings of the scenes of a ComplexityData (in its row order)
  and their stacked ProbeWeights."""
  targets_MxNxD = np.asarray(targets_MxNxD, np.float32)
  return OwnTargets(targets_MxNxD, np.stack([squared_deviation(t) for t in targets_MxNxD]),
                    probes)


def with_own(data, probes, own):
  """(data, probes) of one model: with its own embeddings and probes when it has them (own: one
  row of an OwnTargets, or None)."""
  if own is None:
    return data, probes
  return data.replace(targets_NxD=own.targets_MxNxD, sq_dev_N=own.sq_dev_MxN), own.probes


def from_set(embedding_set):
  """ComplexityData and row indices of an EmbeddingSet's K-object scenes."""
  ids_NxK, unique_UxC = embedding_set.object_ids()
  return prepare(embedding_set.embeddings, embedding_set.objects, embedding_set.num_objects,
                 tuple(embedding_set.values_per_concept), ids_NxK, len(unique_UxC))


def recorded_split(embedding_set):
  """(permutation, training count) of the coverage split that `bindjax extract` recorded in an
  embedding set of all objects, in the set's object numbering (ValueError when it has none)."""
  provenance = embedding_set.provenance
  if "coverage_split" not in provenance:
    raise ValueError("embedding set: its provenance records no coverage split; expected a set "
                     "that `bindjax extract --objects=all` wrote from a trained model")
  if provenance.get("objects") != "all":
    raise ValueError(f"embedding set: objects={provenance.get('objects')!r}; its coverage "
                     "split needs a set of all objects (`bindjax extract --objects=all`)")
  # Pairs listed row-major over ascending ids: the set's numbering is the object ids.
  split = provenance["coverage_split"]
  return given_split(len(provenance["object_ids"]), split["permutation"], split["num_train"])


def object_split(num_unique, fraction, seed):
  """Torch-compatible randperm(U) from seed; the training objects are its first
  clamp(int(f·U), 1, U−1) entries. Returns (permutation, training count)."""
  if not 0 < fraction < 1:
    raise ValueError(f"train fraction={fraction}: expected 0 < f < 1")
  perm_U = np.asarray(torch_random.randperm(num_unique, seed), np.int32)
  return perm_U, linear.split_count(num_unique, fraction)


def scene_masks(object_ids_NxK, permutation_U, num_train):
  """[3, N] bool: train-only, test-only, mixed scenes for the training objects perm[:num_train]."""
  rank_U = jnp.zeros_like(permutation_U).at[permutation_U].set(
      jnp.arange(permutation_U.shape[0], dtype=permutation_U.dtype))
  is_train_NxK = rank_U[object_ids_NxK] < num_train
  train_only = is_train_NxK.all(-1)
  test_only = (~is_train_NxK).all(-1)
  return jnp.stack([train_only, test_only, ~(train_only | test_only)])


def make_points(num_unique, fractions, seeds, learning_rates, splits=None):
  """Points for every (fraction, seed, lr) given as equal-length sequences; keys from seeds.

  splits: per point None (the seed's random `object_split` of the fraction) or a given split
  (permutation [U] of the object ids, training count in 1..U), e.g. a trained model's own
  coverage split.
  """
  perms, counts = [], []
  for f, s, split in zip(fractions, seeds, splits or [None] * len(fractions)):
    perm_U, count = object_split(num_unique, f, s) if split is None else given_split(
        num_unique, *split)
    perms.append(perm_U)
    counts.append(count)
  keys_Mx2 = np.stack([np.asarray(jax.random.PRNGKey(int(s))) for s in seeds])
  return Points(np.asarray(learning_rates, np.float32), np.stack(perms).astype(np.int32),
                np.asarray(counts, np.int32), keys_Mx2.astype(np.uint32))


def given_split(num_unique, permutation, num_train):
  """(permutation, training count) checked against U objects (ValueError otherwise)."""
  perm_U = np.asarray(permutation)
  if perm_U.shape != (num_unique,) or not np.array_equal(np.sort(perm_U), np.arange(num_unique)):
    raise ValueError(f"object split: expected a permutation of the {num_unique} object ids, got "
                     f"shape {perm_U.shape}")
  if not 1 <= int(num_train) <= num_unique:
    raise ValueError(f"object split: {num_train} training objects; expected 1..{num_unique}")
  return perm_U.astype(np.int32), int(num_train)


def mask_counts(data, points):
  """[M, 3] scene counts of the three masks of every point (host numpy)."""
  fn = jax.vmap(lambda p, n: scene_masks(data.object_ids_NxK, p, n).sum(-1))
  return np.asarray(fn(jnp.asarray(points.permutation_MxU), jnp.asarray(points.num_train_M)))


def training_rows(data, points):
  """Row indices of every point's train-only scenes, padded to the largest count.

  Returns (rows [M, T] int32, valid [M, T] bool): padding repeats row 0 and is not valid.
  """
  ids_NxK = np.asarray(data.object_ids_NxK)
  perms_MxU = np.asarray(points.permutation_MxU)
  rows = []
  for perm_U, count in zip(perms_MxU, np.asarray(points.num_train_M)):
    is_train_U = np.zeros(len(perm_U), bool)
    is_train_U[perm_U[:count]] = True
    rows.append(np.flatnonzero(is_train_U[ids_NxK].all(-1)))
  width = max(1, max(len(r) for r in rows))
  rows_MxT = np.zeros((len(rows), width), np.int32)
  valid_MxT = np.zeros((len(rows), width), bool)
  for m, r in enumerate(rows):
    rows_MxT[m, :len(r)] = r
    valid_MxT[m, :len(r)] = True
  return rows_MxT, valid_MxT


def all_scenes(values_per_concept, max_objects):
  """Every ordered K-tuple of all objects, row-major: (objects [N,K,C], object ids [N,K]).

  Object ids are mixed-radix little-endian (id = Σ_c v_c Π_{c'<c} V_c'), which is also the
  first-appearance order of this scene list.
  """
  grids = np.meshgrid(*[np.arange(v) for v in values_per_concept], indexing="ij")
  objects_UxC = np.stack([g.reshape(-1, order="F") for g in grids], axis=-1)
  u = len(objects_UxC)
  ids_NxK = np.stack(np.meshgrid(*[np.arange(u)] * max_objects, indexing="ij"), -1).reshape(
      -1, max_objects)
  return objects_UxC[ids_NxK].astype(np.int32), ids_NxK.astype(np.int32)
