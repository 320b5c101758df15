"""Jit-compiled scene and query sampler (docs/sampling.md).

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

Distinct sets (`bindjax.core.distinct_sets`): first occurrences through a table indexed by
object id (a scatter-min; a sort above 2^20 objects); random subsets by one sort of random
priorities given to first occurrences; labels by scattering each scene's objects into the
columns of their queries. All random numbers of a batch come from one counter-mode threefry
call (fast to compile and to run).
"""
import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from bindjax.core import distinct_sets
from bindjax.core import world

SPLITS = ("train", "test")
SWAP_CONCEPTS = ("any", "differing")
TRAIN_QUERIES = ("all", "train")


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Static sampler settings (hashable: a static jit argument). The defaults are the published
  run's (`run_spec.default_config` takes them from here).

  swap_concepts: "any" draws the swapped concept uniformly (docs/sampling.md#object-queries;
  when both objects share that value the "negative" is the source object itself); "differing"
  draws it among the concepts where the two objects differ, and makes no swap negative for two
  identical objects.
  train_queries: which objects training batches may query. "all" (the original code's default):
  any object, so a swap negative can be a held-out object. "train": training objects only;
  built negatives are drawn from the training objects and swap negatives that are held-out
  objects are dropped (their slots stay masked). Test batches always query all objects.
  """
  batch_size: int
  max_concept_queries: int = 64
  max_positive_queries: int = 64
  swaps_per_scene: int = 1
  built_negatives_per_positive: int = 0
  swap_concepts: str = "any"
  train_queries: str = "all"

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
    if self.train_queries not in TRAIN_QUERIES:
      raise ValueError(f"SamplerConfig.train_queries must be one of {TRAIN_QUERIES}, got "
                       f"{self.train_queries!r}")

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

  def map_per_scene(self, fn):
    """A copy with fn applied to every per-scene array (those with a leading B axis)."""
    return self.replace(**{f.name: fn(getattr(self, f.name)) for f in dataclasses.fields(self)
                           if f.name.rsplit("_", 1)[-1].startswith("B")})


# Randomness: one counter-mode threefry call per batch, split into named pieces.
def _word_layout(space, sampler):
  """Shapes of the random words one batch consumes (all from one counter-mode threefry call)."""
  b, k, s = sampler.batch_size, space.max_objects, sampler.swaps_per_scene
  layout = {"count": (b,), "draw": (b, k), "positive": (b * k,)}
  if sampler.num_concept_queries(space) < space.num_concept_tokens:
    layout["concept"] = (space.num_concept_tokens,)
  if sampler.num_swap_negatives(space):
    layout["swap"] = (b, s)      # one word gives slots i, j and the concept (mixed radix)
  if sampler.built_negatives_per_positive:
    layout["built"] = (sampler.num_positive_queries(space), sampler.built_negatives_per_positive)
  return layout


def _rotate_left(x, r):
  return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32(key0, key1, x0, x1):
  """Threefry-2x32 with 20 rounds (Salmon et al. 2011): the two uint32 output words for the
  counter words (x0, x1) under the key (key0, key1), elementwise; the same words as
  `jax.extend.random.threefry_2x32`. Unrolled: XLA:CPU runs jax's rolled version as a while
  loop, about twice as slow for the few thousand words a batch needs."""
  rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
  keys = (key0, key1, key0 ^ key1 ^ np.uint32(0x1BD11BDA))
  x0, x1 = x0 + keys[0], x1 + keys[1]
  for i in range(5):
    for r in rotations[i % 2]:
      x0 = x0 + x1
      x1 = _rotate_left(x1, r) ^ x0
    x0 = x0 + keys[(i + 1) % 3]
    x1 = x1 + keys[(i + 2) % 3] + np.uint32(i + 1)
  return x0, x1


def _random_bits(key, n):
  """n random uint32 words from `key`: counter-mode threefry on the key's data for threefry keys
  (typed or raw uint32[2]); jax.random.bits for other key implementations."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if str(jax.random.key_impl(key)) != "threefry2x32":
      return jax.random.bits(key, (n,), jnp.uint32)
    key = jax.random.key_data(key)
  key = jnp.asarray(key).astype(jnp.uint32)
  counter = jnp.arange((n + 1) // 2, dtype=jnp.uint32)
  high, low = threefry2x32(key[0], key[1], jnp.zeros_like(counter), counter)
  return jnp.concatenate([high, low])[:n]


def _below(words, n):
  """Random uint32 words -> int32 in [0, n) (n >= 1, may be traced; bias <= n / 2^32)."""
  return (words % jnp.asarray(n).astype(jnp.uint32)).astype(jnp.int32)


def _random_words(key, space, sampler):
  layout = _word_layout(space, sampler)
  sizes = [int(np.prod(shape)) for shape in layout.values()]
  # Materialise the words once: otherwise XLA fuses the 20 threefry rounds into every consumer
  # and recomputes them there.
  words = jax.lax.optimization_barrier(_random_bits(key, sum(sizes)))
  pieces = jnp.split(words, np.cumsum(sizes)[:-1])
  return {name: piece.reshape(shape) for (name, shape), piece in zip(layout.items(), pieces)}


def _draw_scenes(words, permutation_O, num_train, space, split):
  """Scene objects: counts uniform in 1..K, objects uniform with replacement from the pool."""
  k = space.max_objects
  if split == "train":
    start, pool = jnp.int32(0), num_train
  else:
    start, pool = num_train, space.num_objects - num_train
  count_B = 1 + _below(words["count"], k)
  # An empty pool (the test split at coverage 1) gives empty scenes, which are all inactive.
  count_B = jnp.where(pool > 0, count_B, 0)
  slot_mask_BxK = jnp.arange(k, dtype=jnp.int32)[None, :] < count_B[:, None]
  index_BxK = _below(words["draw"], jnp.maximum(pool, 1))
  ids_BxK = jnp.take(permutation_O, start + index_BxK, mode="clip")
  ids_BxK = jnp.where(slot_mask_BxK, ids_BxK, -1)
  objects_BxKxC = jnp.where(slot_mask_BxK[..., None],
                            space.object_values(jnp.maximum(ids_BxK, 0)), -1)
  return count_B, slot_mask_BxK, ids_BxK, objects_BxKxC


def _concept_queries(words, objects_BxKxC, slot_mask_BxK, space, sampler):
  """Concept-query tokens [Qc, Lq], mask [Qc] and labels [B, Qc] (float32)."""
  num_tokens = space.num_concept_tokens
  tokens_BxKxC = jnp.where(slot_mask_BxK[..., None], space.concept_tokens(objects_BxKxC),
                           num_tokens)
  tokens_BxKC = tokens_BxKxC.reshape(tokens_BxKxC.shape[0], -1)
  present_BxT = distinct_sets.scatter_rows(tokens_BxKC, num_tokens, jnp.float32)
  batch_present_T = jnp.any(present_BxT > 0, axis=0)
  num_queries = sampler.num_concept_queries(space)
  if num_queries == num_tokens:
    token_Qc = jnp.arange(num_tokens, dtype=jnp.int32)
    mask_Qc = batch_present_T
    labels_BxQc = present_BxT          # absent tokens are masked and all-zero columns already
  else:
    token_Qc, mask_Qc = distinct_sets.random_subset(words["concept"], batch_present_T, num_queries)
    labels_BxQc = jnp.where(mask_Qc[None, :], jnp.take(present_BxT, token_Qc, axis=1), 0.0)
  query_tokens_QcxLq = jnp.asarray(space.concept_query_tokens())[token_Qc]
  return query_tokens_QcxLq, mask_Qc, labels_BxQc


def _positive_candidates(words, ids_BxK, space, sampler):
  """A random subset of the distinct scene objects; `|O|` marks an empty slot."""
  ids_N = ids_BxK.reshape(-1)
  first_N = distinct_sets.first_occurrences(ids_N, space.num_objects)
  position_P, valid_P = distinct_sets.random_subset(words["positive"], first_N,
                                       sampler.num_positive_queries(space))
  return jnp.where(valid_P, ids_N[position_P], space.num_objects)


def _swap_negatives(words, count_B, objects_BxKxC, space, sampler):
  """Per scene with >= 2 objects: object i with concept c replaced by object j's value.

  Returns swapped ids [B,S] (|O| where there is no swap), and the concepts and slots used.
  """
  b, s, c = sampler.batch_size, sampler.swaps_per_scene, space.num_concepts
  n_Bx1 = jnp.maximum(count_B[:, None], 1).astype(jnp.uint32)
  others_Bx1 = jnp.maximum(n_Bx1 - 1, 1)
  word_BxS = words["swap"]
  i_BxS = (word_BxS % n_Bx1).astype(jnp.int32)
  word_BxS = word_BxS // n_Bx1
  j_BxS = ((i_BxS + 1 + (word_BxS % others_Bx1).astype(jnp.int32)) %
           n_Bx1.astype(jnp.int32))
  word_BxS = word_BxS // others_Bx1
  source_BxSxC = jnp.take_along_axis(objects_BxKxC, i_BxS[..., None], axis=1)
  donor_BxSxC = jnp.take_along_axis(objects_BxKxC, j_BxS[..., None], axis=1)
  valid_BxS = jnp.broadcast_to(count_B[:, None] >= 2, (b, s))
  if sampler.swap_concepts == "any":
    concept_BxS = (word_BxS % np.uint32(c)).astype(jnp.int32)
  else:
    differ_BxSxC = source_BxSxC != donor_BxSxC
    num_differ_BxS = differ_BxSxC.sum(-1).astype(jnp.uint32)
    rank_BxS = (word_BxS % jnp.maximum(num_differ_BxS, 1)).astype(jnp.int32)
    # the rank-th differing concept
    concept_BxS = jnp.argmax(
        differ_BxSxC & (jnp.cumsum(differ_BxSxC, axis=-1) == rank_BxS[..., None] + 1),
        axis=-1).astype(jnp.int32)
    valid_BxS = valid_BxS & (num_differ_BxS > 0)
  swapped_BxSxC = jnp.where(jnp.arange(c, dtype=jnp.int32) == concept_BxS[..., None],
                            donor_BxSxC, source_BxSxC)
  ids_BxS = space.object_ids(jnp.maximum(swapped_BxSxC, 0))
  return jnp.where(valid_BxS, ids_BxS, space.num_objects), concept_BxS, i_BxS, j_BxS


def _training_objects(permutation_O, num_train, space):
  """bool [|O|]: which object ids are training objects (permutation_O[:num_train])."""
  is_train_O = jnp.arange(space.num_objects, dtype=jnp.int32) < num_train
  return jnp.zeros((space.num_objects,), bool).at[permutation_O].set(is_train_O)


def _object_queries(words, count_B, ids_BxK, objects_BxKxC, permutation_O, num_train, space,
                    sampler, training_only):
  """Object-query tokens [Qo, Lq], ids [Qo] (-1 padded), mask [Qo] and labels [B, Qo].

  training_only: queries are training objects only (`SamplerConfig.train_queries="train"` on a
  training batch): built negatives come from the training objects, held-out swaps are dropped.
  """
  sentinel = space.num_objects
  positive_P = _positive_candidates(words, ids_BxK, space, sampler)
  candidates = [positive_P]
  if sampler.num_swap_negatives(space):
    swap_BxS = _swap_negatives(words, count_B, objects_BxKxC, space, sampler)[0]
    if training_only:
      is_train_O = _training_objects(permutation_O, num_train, space)
      swap_BxS = jnp.where(is_train_O[jnp.minimum(swap_BxS, sentinel - 1)], swap_BxS, sentinel)
    candidates.append(swap_BxS.reshape(-1))
  if sampler.built_negatives_per_positive:
    if training_only:
      built_PxN = jnp.take(permutation_O, _below(words["built"], jnp.maximum(num_train, 1)))
    else:
      built_PxN = _below(words["built"], space.num_objects)
    built_PxN = jnp.where(positive_P[:, None] < sentinel, built_PxN, sentinel)
    candidates.append(built_PxN.reshape(-1))
  candidates_N = jnp.concatenate(candidates)
  first_N = distinct_sets.first_occurrences(candidates_N, sentinel)
  num_queries = sampler.num_object_queries(space)
  if num_queries < candidates_N.shape[0]:
    # More candidate slots than objects: move the distinct ids to the front.
    ids_Qo = distinct_sets.compact(candidates_N, first_N, num_queries, -1)
    mask_Qo = ids_Qo >= 0
  else:
    mask_Qo = first_N
    ids_Qo = jnp.where(mask_Qo, candidates_N, -1)
  labels_BxQo = distinct_sets.membership_labels(ids_BxK, ids_Qo, mask_Qo, space.num_objects)
  tokens_QoxLq = space.object_query_tokens(jnp.maximum(ids_Qo, 0))
  return tokens_QoxLq, ids_Qo, mask_Qo, labels_BxQo


def _sample_batch(key, permutation_O, num_train, space, sampler, split):
  words = _random_words(key, space, sampler)
  permutation_O = permutation_O.astype(jnp.int32)
  num_train = jnp.asarray(num_train, jnp.int32)
  count_B, slot_mask_BxK, ids_BxK, objects_BxKxC = _draw_scenes(
      words, permutation_O, num_train, space, split)
  concept_tokens, concept_mask, concept_labels = _concept_queries(
      words, objects_BxKxC, slot_mask_BxK, space, sampler)
  object_tokens, object_ids, object_mask, object_labels = _object_queries(
      words, count_B, ids_BxK, objects_BxKxC, permutation_O, num_train, space, sampler,
      training_only=split == "train" and sampler.train_queries == "train")
  return SceneBatch(
      scene_tokens_BxL=space.scene_tokens(objects_BxKxC, count_B),
      objects_BxKxC=objects_BxKxC,
      object_mask_BxK=slot_mask_BxK,
      num_objects_B=count_B,
      concept_query_tokens_QcxLq=concept_tokens,
      concept_query_mask_Qc=concept_mask,
      concept_labels_BxQc=concept_labels,
      concept_active_B=jnp.any(concept_labels > 0, axis=-1),
      object_query_tokens_QoxLq=object_tokens,
      object_query_ids_Qo=object_ids,
      object_query_mask_Qo=object_mask,
      object_labels_BxQo=object_labels,
      object_active_B=jnp.any(object_labels > 0, axis=-1))


_sample_batch_jit = jax.jit(_sample_batch, static_argnames=("space", "sampler", "split"))


def check_arguments(space, sampler, split):
  """Validates the static arguments of `sample_batch`."""
  if not isinstance(space, world.ObjectSpace):
    raise ValueError(f"space must be a bindjax.core.world.ObjectSpace, got {type(space).__name__}")
  if not isinstance(sampler, SamplerConfig):
    raise ValueError(f"sampler must be a SamplerConfig, got {type(sampler).__name__}")
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  space.check_enumerable("scene sampling (permutation of all object ids)")


def _check_permutation(permutation_O, space):
  if jnp.shape(permutation_O) != (space.num_objects,):
    raise ValueError(f"permutation_O must have shape ({space.num_objects},) for |O| = "
                     f"{space.num_objects}, got {jnp.shape(permutation_O)}")


def sample_batch(key, permutation_O, num_train, *, space, sampler, split):
  """One SceneBatch (docs/sampling.md) from `key` and a replica's split tables.

  Args:
    key: PRNG key.
    permutation_O: int32 [|O|], a permutation of all object ids (CoverageSplit.permutation).
    num_train: int32 scalar; training objects are permutation_O[:num_train], held-out objects
      the rest. An array (not a shape), so different coverages never retrace.
    space, sampler: static ObjectSpace and SamplerConfig.
    split: "train" draws scene objects from the training objects, "test" from the held-out ones.
      Queries (swap and built negatives) range over all objects in both, except in "train"
      batches with `sampler.train_queries="train"`, whose queries are training objects only.

  Pure and jit-compiled; vmap over `key` and/or (`permutation_O`, `num_train`) freely.
  """
  check_arguments(space, sampler, split)
  _check_permutation(permutation_O, space)
  return _sample_batch_jit(key, jnp.asarray(permutation_O, jnp.int32),
                           jnp.asarray(num_train, jnp.int32), space=space, sampler=sampler,
                           split=split)


def sample_batches(key, permutation_O, num_train, num_batches, *, space, sampler, split):
  """`num_batches` batches stacked on a leading axis, batch i from fold_in(key, i); one program.

  Amortises dispatch when many batches are needed at once (evaluation, benchmarks).
  """
  check_arguments(space, sampler, split)
  _check_permutation(permutation_O, space)
  if isinstance(num_batches, bool) or not isinstance(num_batches, (int, np.integer)) or (
      num_batches < 1):
    raise ValueError(f"num_batches must be an integer >= 1, got {num_batches!r}")
  return _sample_batches_jit(key, jnp.asarray(permutation_O, jnp.int32),
                             jnp.asarray(num_train, jnp.int32), num_batches=int(num_batches),
                             space=space, sampler=sampler, split=split)


@functools.partial(jax.jit, static_argnames=("num_batches", "space", "sampler", "split"))
def _sample_batches_jit(key, permutation_O, num_train, num_batches, space, sampler, split):
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_batches))
  return jax.vmap(lambda k: _sample_batch(k, permutation_O, num_train, space, sampler, split))(
      keys)


def sampler_for(space, sampler, split):
  """`sample_batch` with the static arguments bound: f(key, permutation_O, num_train)."""
  check_arguments(space, sampler, split)
  return functools.partial(sample_batch, space=space, sampler=sampler, split=split)
