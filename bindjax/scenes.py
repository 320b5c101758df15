"""Jit-compiled scene and query sampler (SPEC §3).

`sample_batch` is a pure function of a PRNG key and a replica's split tables (a permutation of
all object ids plus the number of training objects), so replicas with different coverages share
one compiled program and can be vmapped together. Query sets have data-dependent sizes; they are
padded to static maxima and carry masks:

  * concept queries: the distinct concept tokens present in the batch, a random subset of at most
    `max_concept_queries`;
  * object queries: the distinct union of (a) a random subset of at most `max_positive_queries`
    distinct objects present in the batch, (b) swap negatives (per scene with >= 2 objects: slots
    i != j and a concept c, object i with concept c taken from object j), (c) optional built
    negatives (uniform over all objects, per positive).

Distinct sets are computed with sorts and compare-with-previous (independent of |O|); random
subsets by top_k over random priorities given to first occurrences.
"""
import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from bindjax import world

SPLITS = ("train", "test")
SWAP_CONCEPTS = ("any", "differing")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Static sampler settings (hashable: a static jit argument).

  swap_concepts: "any" draws the swapped concept uniformly (SPEC §3; when both objects share that
  value the "negative" is the source object itself); "differing" draws it among the concepts where
  the two objects differ, and makes no swap negative for two identical objects.
  """
  batch_size: int
  max_concept_queries: int = 64
  max_positive_queries: int = 64
  swaps_per_scene: int = 1
  built_negatives_per_positive: int = 0
  swap_concepts: str = "any"

  def __post_init__(self):
    for name, minimum in (("batch_size", 1), ("max_concept_queries", 1),
                          ("max_positive_queries", 1), ("swaps_per_scene", 0),
                          ("built_negatives_per_positive", 0)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"SamplerConfig.{name} must be an integer >= {minimum}, got {value!r}")
      object.__setattr__(self, name, int(value))
    if self.swap_concepts not in SWAP_CONCEPTS:
      raise ValueError(f"SamplerConfig.swap_concepts must be one of {SWAP_CONCEPTS}, got "
                       f"{self.swap_concepts!r}")

  def num_concept_queries(self, space):
    """Qc: static number of concept-query slots."""
    return min(self.max_concept_queries, space.num_concept_tokens)

  def num_positive_queries(self, space):
    """Static number of positive object-query slots (before the union)."""
    return min(self.max_positive_queries, self.batch_size * space.max_objects,
               space.num_objects)

  def num_swap_negatives(self, space):
    return self.batch_size * self.swaps_per_scene if space.max_objects >= 2 else 0

  def num_built_negatives(self, space):
    return self.num_positive_queries(space) * self.built_negatives_per_positive

  def num_object_queries(self, space):
    """Qo: static number of object-query slots (the union can never exceed |O|)."""
    candidates = (self.num_positive_queries(space) + self.num_swap_negatives(space) +
                  self.num_built_negatives(space))
    return min(candidates, space.num_objects)


@flax.struct.dataclass
class SceneBatch:
  """One batch of B scenes with padded query sets (Qc, Qo static) and masks.

  objects_BxKxC holds -1 in empty slots; padded queries hold a valid token sequence (so towers
  never see an all-PAD input) but are masked out, and object_query_ids_Qo is -1 there.
  """
  scene_tokens_BxL: jax.Array
  objects_BxKxC: jax.Array
  object_mask_BxK: jax.Array
  num_objects_B: jax.Array
  concept_query_tokens_QcxLq: jax.Array
  concept_query_mask_Qc: jax.Array
  concept_labels_BxQc: jax.Array
  concept_active_B: jax.Array
  object_query_tokens_QoxLq: jax.Array
  object_query_ids_Qo: jax.Array
  object_query_mask_Qo: jax.Array
  object_labels_BxQo: jax.Array
  object_active_B: jax.Array


def _first_occurrences(sorted_x, sentinel):
  """Marks the first of each run of equal values in a sorted array, ignoring the sentinel."""
  previous = jnp.concatenate([jnp.full((1,), -1, sorted_x.dtype), sorted_x[:-1]])
  return (sorted_x != previous) & (sorted_x != sentinel)


def _uniform_below(key, shape, n):
  """Integers uniform in [0, n) for small n >= 1 (slot indices): floor(u·n)."""
  u = jax.random.uniform(key, shape)
  return jnp.minimum((u * n).astype(jnp.int32), n - 1)


def _draw_scenes(key, permutation_O, num_train, space, sampler, split):
  """Scene objects: counts uniform in 1..K, objects uniform with replacement from the pool."""
  b, k = sampler.batch_size, space.max_objects
  if split == "train":
    start, pool = jnp.int32(0), num_train
  else:
    start, pool = num_train, space.num_objects - num_train
  key_count, key_draw = jax.random.split(key)
  count_B = jax.random.randint(key_count, (b,), 1, k + 1, dtype=jnp.int32)
  # An empty pool (the test split at coverage 1) gives empty scenes, which are all inactive.
  count_B = jnp.where(pool > 0, count_B, 0)
  slot_mask_BxK = jnp.arange(k, dtype=jnp.int32)[None, :] < count_B[:, None]
  index_BxK = jax.random.randint(key_draw, (b, k), 0, jnp.maximum(pool, 1), dtype=jnp.int32)
  ids_BxK = jnp.take(permutation_O, start + index_BxK, mode="clip")
  ids_BxK = jnp.where(slot_mask_BxK, ids_BxK, -1)
  objects_BxKxC = jnp.where(slot_mask_BxK[..., None],
                            space.object_values(jnp.maximum(ids_BxK, 0)), -1)
  return count_B, slot_mask_BxK, ids_BxK, objects_BxKxC


def _concept_queries(key, objects_BxKxC, slot_mask_BxK, space, sampler):
  num_tokens = space.num_concept_tokens
  tokens_BxKxC = space.concept_tokens(objects_BxKxC)
  hits_BxKxCxT = tokens_BxKxC[..., None] == jnp.arange(num_tokens, dtype=jnp.int32)
  present_BxT = jnp.any(hits_BxKxCxT & slot_mask_BxK[:, :, None, None], axis=(1, 2))
  batch_present_T = jnp.any(present_BxT, axis=0)
  num_queries = sampler.num_concept_queries(space)
  if num_queries == num_tokens:
    token_Qc = jnp.arange(num_tokens, dtype=jnp.int32)
    mask_Qc = batch_present_T
  else:
    priority_T = jnp.where(batch_present_T, jax.random.uniform(key, (num_tokens,)), -1.0)
    top_Qc, token_Qc = jax.lax.top_k(priority_T, num_queries)
    mask_Qc = top_Qc >= 0
  labels_BxQc = jnp.take(present_BxT, token_Qc, axis=1) & mask_Qc[None, :]
  query_tokens_QcxLq = jnp.asarray(space.concept_query_tokens())[token_Qc]
  return query_tokens_QcxLq, mask_Qc, labels_BxQc


def _positive_candidates(key, ids_BxK, space, sampler):
  """A random subset of the distinct scene objects; `|O|` marks an empty slot."""
  sentinel = space.num_objects
  sorted_N = jnp.sort(jnp.where(ids_BxK >= 0, ids_BxK, sentinel).reshape(-1))
  first_N = _first_occurrences(sorted_N, sentinel)
  priority_N = jnp.where(first_N, jax.random.uniform(key, sorted_N.shape), -1.0)
  top_P, index_P = jax.lax.top_k(priority_N, sampler.num_positive_queries(space))
  return jnp.where(top_P >= 0, sorted_N[index_P], sentinel)


def _swap_negatives(key, count_B, objects_BxKxC, space, sampler):
  """Per scene with >= 2 objects: object i with concept c replaced by object j's value."""
  b, s, c = sampler.batch_size, sampler.swaps_per_scene, space.num_concepts
  key_i, key_j, key_c = jax.random.split(key, 3)
  n_Bx1 = count_B[:, None]
  i_BxS = _uniform_below(key_i, (b, s), jnp.maximum(n_Bx1, 1))
  j_BxS = (i_BxS + 1 + _uniform_below(key_j, (b, s), jnp.maximum(n_Bx1 - 1, 1))) % jnp.maximum(
      n_Bx1, 1)
  source_BxSxC = jnp.take_along_axis(objects_BxKxC, i_BxS[..., None], axis=1)
  donor_BxSxC = jnp.take_along_axis(objects_BxKxC, j_BxS[..., None], axis=1)
  valid_BxS = jnp.broadcast_to(n_Bx1 >= 2, (b, s))
  if sampler.swap_concepts == "any":
    concept_BxS = jax.random.randint(key_c, (b, s), 0, c, dtype=jnp.int32)
  else:
    differ_BxSxC = source_BxSxC != donor_BxSxC
    priority_BxSxC = jnp.where(differ_BxSxC, jax.random.uniform(key_c, (b, s, c)), -1.0)
    concept_BxSxC = jnp.argmax(priority_BxSxC, axis=-1).astype(jnp.int32)
    concept_BxS = concept_BxSxC
    valid_BxS = valid_BxS & jnp.any(differ_BxSxC, axis=-1)
  swapped_BxSxC = jnp.where(jnp.arange(c, dtype=jnp.int32) == concept_BxS[..., None],
                            donor_BxSxC, source_BxSxC)
  ids_BxS = space.object_ids(jnp.maximum(swapped_BxSxC, 0))
  return jnp.where(valid_BxS, ids_BxS, space.num_objects), concept_BxS, i_BxS, j_BxS


def _object_queries(key, count_B, ids_BxK, objects_BxKxC, space, sampler):
  sentinel = space.num_objects
  key_pos, key_swap, key_built = jax.random.split(key, 3)
  positive_P = _positive_candidates(key_pos, ids_BxK, space, sampler)
  candidates = [positive_P]
  if sampler.num_swap_negatives(space):
    swap_BxS = _swap_negatives(key_swap, count_B, objects_BxKxC, space, sampler)[0]
    candidates.append(swap_BxS.reshape(-1))
  if sampler.built_negatives_per_positive:
    built_PxN = jax.random.randint(
        key_built, (positive_P.shape[0], sampler.built_negatives_per_positive), 0,
        space.num_objects, dtype=jnp.int32)
    built_PxN = jnp.where(positive_P[:, None] < sentinel, built_PxN, sentinel)
    candidates.append(built_PxN.reshape(-1))
  sorted_N = jnp.sort(jnp.concatenate(candidates))
  first_N = _first_occurrences(sorted_N, sentinel)
  num_queries = sampler.num_object_queries(space)
  if num_queries < sorted_N.shape[0]:
    # More candidate slots than objects: move the distinct ids to the front.
    ids_Qo = jnp.sort(jnp.where(first_N, sorted_N, sentinel))[:num_queries]
    mask_Qo = ids_Qo < sentinel
  else:
    ids_Qo, mask_Qo = sorted_N, first_N
  ids_Qo = jnp.where(mask_Qo, ids_Qo, -1)
  labels_BxQo = jnp.any(ids_BxK[:, :, None] == ids_Qo[None, None, :], axis=1) & mask_Qo[None, :]
  tokens_QoxLq = space.object_query_tokens(jnp.maximum(ids_Qo, 0))
  return tokens_QoxLq, ids_Qo, mask_Qo, labels_BxQo


def _sample_batch(key, permutation_O, num_train, space, sampler, split):
  key_scene, key_concept, key_object = jax.random.split(key, 3)
  permutation_O = permutation_O.astype(jnp.int32)
  num_train = jnp.asarray(num_train, jnp.int32)
  count_B, slot_mask_BxK, ids_BxK, objects_BxKxC = _draw_scenes(
      key_scene, permutation_O, num_train, space, sampler, split)
  concept_tokens, concept_mask, concept_labels = _concept_queries(
      key_concept, objects_BxKxC, slot_mask_BxK, space, sampler)
  object_tokens, object_ids, object_mask, object_labels = _object_queries(
      key_object, count_B, ids_BxK, objects_BxKxC, space, sampler)
  return SceneBatch(
      scene_tokens_BxL=space.scene_tokens(objects_BxKxC, count_B),
      objects_BxKxC=objects_BxKxC,
      object_mask_BxK=slot_mask_BxK,
      num_objects_B=count_B,
      concept_query_tokens_QcxLq=concept_tokens,
      concept_query_mask_Qc=concept_mask,
      concept_labels_BxQc=concept_labels.astype(jnp.float32),
      concept_active_B=jnp.any(concept_labels, axis=-1),
      object_query_tokens_QoxLq=object_tokens,
      object_query_ids_Qo=object_ids,
      object_query_mask_Qo=object_mask,
      object_labels_BxQo=object_labels.astype(jnp.float32),
      object_active_B=jnp.any(object_labels, axis=-1))


_sample_batch_jit = jax.jit(_sample_batch, static_argnames=("space", "sampler", "split"))


def check_arguments(space, sampler, split):
  """Validates the static arguments of `sample_batch`."""
  if not isinstance(space, world.ObjectSpace):
    raise ValueError(f"space must be a bindjax.world.ObjectSpace, got {type(space).__name__}")
  if not isinstance(sampler, SamplerConfig):
    raise ValueError(f"sampler must be a SamplerConfig, got {type(sampler).__name__}")
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  space.check_enumerable("scene sampling (permutation of all object ids)")


def sample_batch(key, permutation_O, num_train, *, space, sampler, split):
  """One SceneBatch (SPEC §3) from `key` and a replica's split tables.

  Args:
    key: PRNG key.
    permutation_O: int32 [|O|], a permutation of all object ids (CoverageSplit.permutation).
    num_train: int32 scalar; training objects are permutation_O[:num_train], held-out objects
      the rest. An array (not a shape), so different coverages never retrace.
    space, sampler: static ObjectSpace and SamplerConfig.
    split: "train" draws scene objects from the training objects, "test" from the held-out ones.
      Queries (swap and built negatives) range over all objects in both.

  Pure and jit-compiled; vmap over `key` and/or (`permutation_O`, `num_train`) freely.
  """
  check_arguments(space, sampler, split)
  if jnp.shape(permutation_O)[-1:] != (space.num_objects,) or jnp.ndim(permutation_O) != 1:
    raise ValueError(f"permutation_O must have shape ({space.num_objects},) for |O| = "
                     f"{space.num_objects}, got {jnp.shape(permutation_O)}")
  return _sample_batch_jit(key, jnp.asarray(permutation_O, jnp.int32),
                           jnp.asarray(num_train, jnp.int32), space=space, sampler=sampler,
                           split=split)


def sample_batches(key, permutation_O, num_train, num_batches, *, space, sampler, split):
  """`num_batches` independent batches (leading axis) from fold_in(key, i), in one program."""
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_batches))
  return jax.vmap(lambda k: sample_batch(k, permutation_O, num_train, space=space,
                                         sampler=sampler, split=split))(keys)


def sampler_for(space, sampler, split):
  """`sample_batch` with the static arguments bound: f(key, permutation_O, num_train)."""
  check_arguments(space, sampler, split)
  return functools.partial(sample_batch, space=space, sampler=sampler, split=split)
