"""Tests for bindjax.core.scenes: every batch is checked against a brute-force numpy
recomputation."""
import functools

import chex
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bindjax.core import coverage_splits
from bindjax.core import distinct_sets
from bindjax.core import scenes
from bindjax.core import world

# A few static configurations (each compiles once), covering: the published shape scaled down,
# per-concept values, positives capped below the distinct count, built negatives, more candidate
# slots than objects (compaction), K=1 (no swaps) and the "differing" swap mode.
CONFIGS = {
    "c2v20k2": (world.ObjectSpace.uniform(2, 20, 2), scenes.SamplerConfig(48), 0.8),
    "per_concept": (world.ObjectSpace((3, 5, 2), 3),
                    scenes.SamplerConfig(24, max_concept_queries=6, max_positive_queries=8,
                                         swaps_per_scene=2, built_negatives_per_positive=2), 0.6),
    "tiny_world": (world.ObjectSpace.uniform(2, 3, 3), scenes.SamplerConfig(16), 0.5),
    "one_object": (world.ObjectSpace.uniform(3, 4, 1), scenes.SamplerConfig(20), 0.3),
    "differing": (world.ObjectSpace((2, 3), 2),
                  scenes.SamplerConfig(32, swap_concepts="differing"), 0.7),
}


@functools.cache
def _split(name, seed=0):
  space, _, coverage = CONFIGS[name]
  return coverage_splits.coverage_split(space, coverage, seed)


def _sample(name, seed, split="train", split_seed=0):
  space, sampler, _ = CONFIGS[name]
  tables = _split(name, split_seed)
  batch = scenes.sample_batch(jax.random.key(seed), tables.permutation, tables.num_train,
                              space=space, sampler=sampler, split=split)
  return jax.tree.map(np.asarray, batch), tables


def _is_swap_of_scene(query, scene_objects):
  """query = some object i of the scene with one concept taken from another slot j != i."""
  n = len(scene_objects)
  for i in range(n):
    for j in range(n):
      if i == j:
        continue
      for c in range(len(query)):
        candidate = scene_objects[i].copy()
        candidate[c] = scene_objects[j][c]
        if np.array_equal(candidate, query):
          return True
  return False


def check_batch(batch, space, sampler, tables, split):
  """Recomputes everything a batch claims from its decoded scene tokens."""
  b, k, c = sampler.batch_size, space.max_objects, space.num_concepts
  qc, qo = sampler.num_concept_queries(space), sampler.num_object_queries(space)
  assert batch.scene_tokens_BxL.shape == (b, space.scene_length)
  assert batch.objects_BxKxC.shape == (b, k, c)
  assert batch.concept_query_tokens_QcxLq.shape == (qc, space.query_length)
  assert batch.concept_labels_BxQc.shape == (b, qc)
  assert batch.object_query_tokens_QoxLq.shape == (qo, space.query_length)
  assert batch.object_labels_BxQo.shape == (b, qo)
  assert batch.concept_labels_BxQc.dtype == np.float32
  assert batch.object_labels_BxQo.dtype == np.float32
  allowed = set((tables.train_ids if split == "train" else tables.heldout_ids).tolist())

  scene_ids = []
  for row in range(b):
    n = batch.num_objects_B[row]
    assert 1 <= n <= k
    decoded = space.decode_scene(batch.scene_tokens_BxL[row])
    np.testing.assert_array_equal(decoded, batch.objects_BxKxC[row, :n])
    assert (batch.objects_BxKxC[row, n:] == -1).all()
    np.testing.assert_array_equal(batch.object_mask_BxK[row], np.arange(k) < n)
    ids = set(space.object_ids(decoded).tolist())
    assert ids <= allowed, f"{split} scene holds objects outside its pool: {ids - allowed}"
    scene_ids.append(ids)
  batch_ids = set().union(*scene_ids)

  # Concept queries: distinct tokens present in the batch, as many as fit.
  scene_tokens = [set(t.tolist()) for t in batch.scene_tokens_BxL]
  present_tokens = {t for ts in scene_tokens for t in ts if t < space.num_concept_tokens}
  mask = batch.concept_query_mask_Qc
  query_tokens = batch.concept_query_tokens_QcxLq
  assert (query_tokens[:, 1] == space.eos_token).all()
  assert (query_tokens[:, 2:] == space.pad_token).all()
  assert (query_tokens[:, 0] < space.num_concept_tokens).all()   # padded ones still valid
  chosen = query_tokens[mask, 0].tolist()
  assert len(set(chosen)) == len(chosen) and set(chosen) <= present_tokens
  assert len(chosen) == min(sampler.max_concept_queries, len(present_tokens))
  expected = np.array([[t in ts for t in query_tokens[:, 0]] for ts in scene_tokens]) & mask
  np.testing.assert_array_equal(batch.concept_labels_BxQc, expected.astype(np.float32))
  np.testing.assert_array_equal(batch.concept_active_B, expected.any(-1))

  # Object queries: distinct; positives cover min(P, distinct) batch objects; every other query
  # is a swap negative of some scene or (only with built negatives) any object.
  mask = batch.object_query_mask_Qo
  ids = batch.object_query_ids_Qo
  assert (ids[~mask] == -1).all()
  valid_ids = ids[mask].tolist()
  assert len(set(valid_ids)) == len(valid_ids)
  tokens = batch.object_query_tokens_QoxLq
  assert ((tokens[:, 0] == space.soo_token) & (tokens[:, -1] == space.eos_token)).all()
  np.testing.assert_array_equal(tokens[mask], space.object_query_tokens(ids[mask]))
  present_queries = set(valid_ids) & batch_ids
  assert len(present_queries) >= min(sampler.num_positive_queries(space), len(batch_ids))
  if not sampler.built_negatives_per_positive:
    rows = [batch.objects_BxKxC[r, :batch.num_objects_B[r]] for r in range(b)]
    for query in set(valid_ids) - batch_ids:
      values = space.object_values(np.array(query))
      assert any(_is_swap_of_scene(values, r) for r in rows if len(r) >= 2), query
  expected = np.array([[q in s for q in ids] for s in scene_ids]) & mask
  np.testing.assert_array_equal(batch.object_labels_BxQo, expected.astype(np.float32))
  np.testing.assert_array_equal(batch.object_active_B, expected.any(-1))


# (config, split) pairs to compile: every config on "train", two on "test".
PAIRS = [(name, "train") for name in sorted(CONFIGS)] + [("c2v20k2", "test"),
                                                         ("per_concept", "test")]


@pytest.mark.parametrize("name,split", PAIRS)
def test_labels_match_brute_force(name, split):
  space, sampler, _ = CONFIGS[name]
  for seed in range(3):
    batch, tables = _sample(name, seed, split)
    check_batch(batch, space, sampler, tables, split)


@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(seed=st.integers(0, 2**31 - 1), split_seed=st.integers(0, 3),
                  pair=st.sampled_from(PAIRS))
def test_labels_match_brute_force_random_keys(seed, split_seed, pair):
  name, split = pair
  space, sampler, _ = CONFIGS[name]
  batch, tables = _sample(name, seed, split, split_seed)
  check_batch(batch, space, sampler, tables, split)


def test_positives_are_capped_and_queries_compacted():
  space, sampler, _ = CONFIGS["per_concept"]
  batch, _ = _sample("per_concept", 5)
  assert sampler.num_concept_queries(space) == 6 and batch.concept_query_mask_Qc.sum() == 6
  # 8 positives + 48 swaps + 16 built candidates exceed the 30 objects: compacted to 30 slots.
  assert sampler.num_object_queries(space) == 30
  space, sampler, _ = CONFIGS["tiny_world"]
  assert sampler.num_object_queries(space) == 9


def _one_concept_swap(query, source, donor):
  """query is `source` with one concept where it differs from `donor` taken from `donor`."""
  changed = np.flatnonzero(query != source)
  return changed.size == 1 and query[changed[0]] == donor[changed[0]]


@pytest.mark.parametrize("mode", ["any", "differing"])
def test_swap_negatives_change_one_concept(mode):
  # One scene per batch and one positive query: every other query is a swap negative of it.
  space = world.ObjectSpace((4, 3, 5), 2)
  sampler = scenes.SamplerConfig(1, max_positive_queries=1, swaps_per_scene=3,
                                 swap_concepts=mode)
  tables = coverage_splits.coverage_split(space, 0.2, 1)    # few objects: many shared values
  batches = jax.tree.map(np.asarray, scenes.sample_batches(
      jax.random.key(0), tables.permutation, tables.num_train, 400, space=space,
      sampler=sampler, split="train"))
  two_object_scenes = degenerate = 0
  for r in range(400):
    objects = batches.objects_BxKxC[r, 0, :batches.num_objects_B[r, 0]]
    queries = [space.object_values(np.array(q))
               for q in batches.object_query_ids_Qo[r][batches.object_query_mask_Qo[r]]]
    if len(objects) == 1:
      assert len(queries) == 1     # the positive; no swap in a one-object scene
      continue
    a, b = objects
    if (a != b).sum() < 2:
      continue                     # a swap of a and b may be b itself, or a
    two_object_scenes += 1
    for query in queries:
      if np.array_equal(query, a) or np.array_equal(query, b):
        continue
      assert _one_concept_swap(query, a, b) or _one_concept_swap(query, b, a), (query, a, b)
    # The positive is a or b; both queried means a swap of a shared concept gave its source.
    degenerate += sum(np.array_equal(q, o) for q in queries for o in (a, b)) == 2
  assert two_object_scenes > 50
  if mode == "differing":
    assert degenerate == 0
  else:
    assert degenerate > 0   # the faithful mode does produce degenerate swaps in this world


def test_counts_and_objects_are_uniform():
  space, sampler, _ = CONFIGS["tiny_world"]     # K=3, 4 training objects of 9, B=16
  tables = _split("tiny_world")
  counts, frequency = np.zeros(4), np.zeros(9)
  for seed in range(200):
    batch, _ = _sample("tiny_world", 1000 + seed)
    counts += np.bincount(batch.num_objects_B, minlength=4)
    frequency += np.bincount(space.object_ids(batch.objects_BxKxC[batch.object_mask_BxK]),
                             minlength=9)
  assert counts[0] == 0 and counts[1:].min() > counts.sum() / 3 * 0.9
  assert frequency[tables.train_ids].min() > frequency.sum() / tables.num_train * 0.9
  assert frequency[tables.heldout_ids].sum() == 0


def test_same_key_same_batch_different_keys_differ():
  first, _ = _sample("c2v20k2", 11)
  again, _ = _sample("c2v20k2", 11)
  other, _ = _sample("c2v20k2", 12)
  chex.assert_trees_all_equal(first, again)
  assert not np.array_equal(first.scene_tokens_BxL, other.scene_tokens_BxL)
  assert not np.array_equal(first.object_query_ids_Qo, other.object_query_ids_Qo)


def test_no_retracing_across_batches_and_replicas():
  space, sampler, _ = CONFIGS["c2v20k2"]
  splits = [coverage_splits.coverage_split(space, coverage, seed)
            for coverage, seed in ((0.1, 0), (0.5, 1), (0.9, 2), (1.0, 3))]
  perms = jnp.stack([s.permutation for s in splits])
  counts = jnp.asarray([s.num_train for s in splits])
  sample = scenes.sampler_for(space, sampler, "train")

  def sample_both_ways(i, split):
    sample(jax.random.key(i), split.permutation, split.num_train)
    sample(jax.random.key(i), jnp.asarray(split.permutation), np.int32(split.num_train))

  sample_both_ways(0, splits[0])    # the first call compiles
  traces = []

  def count_traces(event, duration_secs, **kwargs):
    del duration_secs
    if event == "/jax/core/compile/jaxpr_trace_duration":
      traces.append(kwargs.get("fun_name"))

  jax.monitoring.register_event_duration_secs_listener(count_traces)
  try:
    for i, s in enumerate(splits[1:]):
      sample_both_ways(i, s)
  finally:
    jax.monitoring.unregister_event_duration_listener(count_traces)
  assert not traces

  @jax.jit
  @chex.assert_max_traces(n=1)
  def replicas(keys, perms, counts):
    return jax.vmap(sample)(keys, perms, counts)

  keys = jax.random.split(jax.random.key(0), 4)
  batch = replicas(keys, perms, counts)
  replicas(jax.random.split(jax.random.key(1), 4), perms[::-1], counts[::-1])
  # Each replica's batch is what it would get alone.
  for r, s in enumerate(splits):
    alone = sample(keys[r], s.permutation, s.num_train)
    chex.assert_trees_all_equal(jax.tree.map(lambda x, r=r: x[r], batch), alone)


def test_vmap_over_keys_and_sample_batches():
  space, sampler, _ = CONFIGS["c2v20k2"]
  tables = _split("c2v20k2")
  key = jax.random.key(4)
  batches = scenes.sample_batches(key, tables.permutation, tables.num_train, 3, space=space,
                                  sampler=sampler, split="test")
  assert batches.scene_tokens_BxL.shape == (3, sampler.batch_size, space.scene_length)
  for i in range(3):
    one = jax.tree.map(lambda x, i=i: np.asarray(x[i]), batches)
    check_batch(one, space, sampler, tables, "test")
  assert not np.array_equal(batches.scene_tokens_BxL[0], batches.scene_tokens_BxL[1])
  alone = scenes.sample_batch(jax.random.fold_in(key, 1), tables.permutation, tables.num_train,
                              space=space, sampler=sampler, split="test")
  chex.assert_trees_all_equal(jax.tree.map(lambda x: x[1], batches), alone)
  with pytest.raises(ValueError, match="num_batches must be an integer >= 1"):
    scenes.sample_batches(key, tables.permutation, tables.num_train, 0, space=space,
                          sampler=sampler, split="test")


def test_empty_test_pool_gives_inactive_rows():
  space, sampler, _ = CONFIGS["c2v20k2"]
  tables = coverage_splits.coverage_split(space, 1.0, 0)
  batch = scenes.sample_batch(jax.random.key(0), tables.permutation, tables.num_train,
                              space=space, sampler=sampler, split="test")
  assert (np.asarray(batch.num_objects_B) == 0).all()
  assert not np.asarray(batch.object_active_B).any()
  assert not np.asarray(batch.concept_active_B).any()
  assert (np.asarray(batch.scene_tokens_BxL)[:, 0] == space.eos_token).all()


def test_large_object_space():
  space = world.ObjectSpace.uniform(3, 50, 3)      # |O| = 125,000
  sampler = scenes.SamplerConfig(16, built_negatives_per_positive=1)
  tables = coverage_splits.coverage_split(space, 0.5, 0)
  batch = jax.tree.map(np.asarray, scenes.sample_batch(
      jax.random.key(0), tables.permutation, tables.num_train, space=space, sampler=sampler,
      split="test"))
  check_batch(batch, space, sampler, tables, "test")


def test_argument_errors():
  space, sampler, _ = CONFIGS["tiny_world"]
  tables = _split("tiny_world")
  with pytest.raises(ValueError, match="split must be one of"):
    scenes.sample_batch(jax.random.key(0), tables.permutation, tables.num_train, space=space,
                        sampler=sampler, split="valid")
  with pytest.raises(ValueError, match=r"permutation_O must have shape \(9,\)"):
    scenes.sample_batch(jax.random.key(0), tables.permutation[:5], 3, space=space,
                        sampler=sampler, split="train")
  with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
    scenes.SamplerConfig(0)
  with pytest.raises(ValueError, match="swaps_per_scene"):
    scenes.SamplerConfig(8, swaps_per_scene=-1)
  with pytest.raises(ValueError, match="swap_concepts"):
    scenes.SamplerConfig(8, swap_concepts="some")
  with pytest.raises(ValueError, match="too large"):
    scenes.sampler_for(world.ObjectSpace.uniform(8, 20, 2), sampler, "train")


def test_threefry_matches_jax_and_key_kinds_agree():
  import jax.extend  # pylint: disable=g-import-not-at-top
  key_data = jax.random.key_data(jax.random.key(42))
  counter = jnp.arange(16, dtype=jnp.uint32)
  expected = jax.extend.random.threefry_2x32(key_data,
                                             jnp.concatenate([jnp.zeros_like(counter), counter]))
  high, low = scenes.threefry2x32(key_data[0], key_data[1], jnp.zeros_like(counter), counter)
  np.testing.assert_array_equal(np.concatenate([high, low]), expected)
  # Typed threefry keys and their raw uint32[2] data give the same batch; other PRNG
  # implementations fall back to jax.random.bits.
  space, sampler, _ = CONFIGS["tiny_world"]
  tables = _split("tiny_world")
  sample = scenes.sampler_for(space, sampler, "train")
  typed = sample(jax.random.key(7), tables.permutation, tables.num_train)
  raw = sample(jax.random.key_data(jax.random.key(7)), tables.permutation, tables.num_train)
  chex.assert_trees_all_equal(typed, raw)
  rbg = jax.tree.map(np.asarray, sample(jax.random.key(7, impl="rbg"), tables.permutation,
                                        tables.num_train))
  check_batch(rbg, space, sampler, tables, "train")


@pytest.mark.parametrize("large", [False, True])
def test_distinct_set_helpers_both_branches(large):
  # Small limits take the sort/compare/top_k branches meant for huge object spaces and batches.
  table_limit = 4 if large else distinct_sets.TABLE_LIMIT
  max_index_bits = 2 if large else distinct_sets.MAX_INDEX_BITS
  rng = np.random.RandomState(0)
  ids = rng.randint(-1, 13, size=40).astype(np.int32)      # -1 and 12 (= |O|) are not objects
  first = np.asarray(jax.jit(distinct_sets.first_occurrences, static_argnums=(1, 2))(
      ids, 12, table_limit))
  expected = [0 <= x < 12 and x not in ids[:i] for i, x in enumerate(ids)]
  np.testing.assert_array_equal(first, expected)

  queries = np.array([5, -1, 3, 7, 11, -1], np.int32)
  scene_ids = rng.randint(-1, 12, size=(9, 3)).astype(np.int32)
  labels = np.asarray(jax.jit(distinct_sets.membership_labels, static_argnums=(3, 4))(
      scene_ids, queries, queries >= 0, 12, table_limit))
  expected = np.array([[q >= 0 and q in row for q in queries] for row in scene_ids])
  np.testing.assert_array_equal(labels, expected.astype(np.float32))

  # Random subsets: exactly min(size, kept) distinct kept positions, each equally likely.
  keep = jnp.asarray([True, False, True, True, False, True, True, False])

  @jax.jit
  def subsets(key):
    words = jax.random.bits(key, (4000, 8), jnp.uint32)
    return jax.vmap(lambda w: distinct_sets.random_subset(w, keep, 3, max_index_bits))(words)

  position, valid = jax.tree.map(np.asarray, subsets(jax.random.key(0)))
  assert valid.all()
  assert all(len(set(p)) == 3 and np.asarray(keep)[p].all() for p in position[:50])
  frequency = np.bincount(position.reshape(-1), minlength=8) / 4000
  np.testing.assert_allclose(frequency[np.asarray(keep)], 3 / 5, atol=0.03)
  subset = jax.jit(lambda w: distinct_sets.random_subset(w, keep, 7, max_index_bits))
  position, valid = jax.tree.map(np.asarray, subset(jnp.arange(8, dtype=jnp.uint32)))
  assert valid.sum() == 5 and set(position[valid]) == {0, 2, 3, 5, 6}


def _reference_batch_statistics(rng, space, sampler, tables):
  """docs/sampling.md written literally with Python sets: (#concept queries, #object queries,
  #active)."""
  values = [tuple(v) for v in space.all_objects().tolist()]
  counts = rng.randint(1, space.max_objects + 1, size=sampler.batch_size)
  draws = rng.choice(tables.train_ids, size=(sampler.batch_size, space.max_objects))
  scenes_ = [[values[i] for i in row[:n]] for row, n in zip(draws, counts)]
  tokens = sorted({space.concept_token_offsets[c] + v for s in scenes_ for o in s
                   for c, v in enumerate(o)})
  concept_queries = rng.permutation(tokens)[:sampler.max_concept_queries]
  present = sorted({o for s in scenes_ for o in s})
  positives = [present[i] for i in rng.permutation(len(present))[:sampler.max_positive_queries]]
  negatives = []
  for s in scenes_:
    if len(s) >= 2:
      i, j = rng.choice(len(s), size=2, replace=False)
      c = rng.randint(space.num_concepts)
      swapped = list(s[i])
      swapped[c] = s[j][c]
      negatives.append(tuple(swapped))
  queries = set(positives) | set(negatives)
  active = sum(any(o in queries for o in s) for s in scenes_)
  return len(concept_queries), len(queries), active


def test_query_set_statistics_match_a_literal_reference():
  # 16 positives of ~64 distinct objects: a biased positive subset or a wrong swap rule moves
  # the mean number of queries and of active rows.
  space = CONFIGS["c2v20k2"][0]
  sampler = scenes.SamplerConfig(48, max_positive_queries=16)
  tables = _split("c2v20k2")
  rng = np.random.RandomState(0)
  reference = np.array([_reference_batch_statistics(rng, space, sampler, tables)
                        for _ in range(400)], np.float64)
  sample = jax.jit(lambda key: jax.tree.map(
      lambda m: m.sum(-1), (scenes.sample_batches(key, tables.permutation, tables.num_train, 400,
                                                  space=space, sampler=sampler, split="train"))))
  stats = sample(jax.random.key(0))
  ours = np.stack([stats.concept_query_mask_Qc, stats.object_query_mask_Qo,
                   stats.object_active_B], axis=1).astype(np.float64)
  standard_error = np.sqrt((reference.var(0) + ours.var(0)) / 400)
  np.testing.assert_array_less(np.abs(ours.mean(0) - reference.mean(0)), 4 * standard_error)
  assert (4 * standard_error < 1.0).all()    # sensitive to a shift of one query or active row


def test_train_queries_restricted_to_training_objects():
  """train_queries="train": no held-out object is ever a valid training query; held-out swaps
  are dropped (masked slots), built negatives come from the training objects; "all" keeps them."""
  space = world.ObjectSpace.uniform(2, 6, 2)
  split = coverage_splits.coverage_split(space, 0.5, 0)
  heldout = set(np.asarray(split.heldout_ids).tolist())
  keys = jax.vmap(jax.random.key)(jnp.arange(64))
  found_heldout_in_all = False
  for built in (0, 2):
    restricted = scenes.SamplerConfig(32, built_negatives_per_positive=built,
                                      train_queries="train")
    everything = scenes.SamplerConfig(32, built_negatives_per_positive=built)
    for sampler in (restricted, everything):
      batches = jax.vmap(lambda k, s=sampler: scenes.sample_batch(
          k, split.permutation, split.num_train, space=space, sampler=s, split="train"))(keys)
      ids = np.asarray(batches.object_query_ids_Qo)
      valid = np.asarray(batches.object_query_mask_Qo)
      in_heldout = np.isin(ids, list(heldout)) & valid
      if sampler is restricted:
        assert not in_heldout.any()
        restricted_valid = valid.sum(-1)
        restricted_labels = np.asarray(batches.object_labels_BxQo)
      else:
        found_heldout_in_all |= bool(in_heldout.any())
        # Same scenes and positives; only negatives differ, so "train" never has more queries.
        assert (restricted_valid <= valid.sum(-1)).all()
        np.testing.assert_array_equal(restricted_labels.sum((1, 2)),
                                      np.asarray(batches.object_labels_BxQo).sum((1, 2)))
  assert found_heldout_in_all
  # Test batches query all objects whatever the setting.
  test_batch = scenes.sample_batch(jax.random.key(0), split.permutation, split.num_train,
                                   space=space, sampler=restricted, split="test")
  assert np.isin(np.asarray(test_batch.object_query_ids_Qo)[
      np.asarray(test_batch.object_query_mask_Qo)], list(heldout)).any()
  with pytest.raises(ValueError, match="train_queries"):
    scenes.SamplerConfig(8, train_queries="held_out")
