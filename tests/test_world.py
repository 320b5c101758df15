"""Tests for bindjax.core.world: ids, tokens, coverage splits (docs/world.md), split files."""
import os

import hypothesis
from hypothesis import strategies as st
import jax.numpy as jnp
import numpy as np
import pytest

from bindjax.core import coverage_splits
from bindjax.core import world

values_strategy = st.lists(st.integers(1, 6), min_size=1, max_size=4).map(tuple)


def test_reference_split_values():
  space = world.ObjectSpace.uniform(2, 20, 2)
  split = coverage_splits.coverage_split(space, 0.8, 0)
  assert (split.num_train, split.num_heldout) == (320, 80)
  np.testing.assert_array_equal(split.train_ids[:5], [132, 309, 341, 196, 246])
  np.testing.assert_array_equal(split.permutation, np.random.RandomState(0).permutation(400))
  assert split.permutation.dtype == np.int32
  assert not set(split.train_ids) & set(split.heldout_ids)


@pytest.mark.parametrize("num_objects,coverage,expected", [
    (400, 0.8, 320), (400, 0.001, 1), (400, 0.9999, 399), (10, 0.55, 5), (2, 0.5, 1),
    (400, 1.0, 400), (1, 1.0, 1)])
def test_num_train_formula(num_objects, coverage, expected):
  assert coverage_splits.num_train_objects(num_objects, coverage) == expected


def test_full_coverage_has_no_heldout():
  split = coverage_splits.coverage_split(world.ObjectSpace.uniform(2, 5, 2), 1.0, 3)
  assert split.num_train == 25 and split.heldout_ids.size == 0


@pytest.mark.parametrize("coverage", [0.0, -0.1, 1.5, float("nan"), "0.5", True, None])
def test_bad_coverage(coverage):
  space = world.ObjectSpace.uniform(2, 5, 2)
  with pytest.raises(ValueError, match="coverage"):
    coverage_splits.coverage_split(space, coverage, 0)


def test_bad_space_arguments():
  with pytest.raises(ValueError, match=r"num_values \(V\).*got 0"):
    world.ObjectSpace.uniform(2, 0, 2)
  with pytest.raises(ValueError, match=r"num_concepts \(C\).*got 0"):
    world.ObjectSpace.uniform(0, 5, 2)
  with pytest.raises(ValueError, match=r"max_objects \(K\).*got 0"):
    world.ObjectSpace.uniform(2, 5, 0)
  with pytest.raises(ValueError, match=r"values_per_concept\[1\] \(V_1\).*got -3"):
    world.ObjectSpace((4, -3), 2)
  with pytest.raises(ValueError, match="at least one concept"):
    world.ObjectSpace((), 2)
  with pytest.raises(ValueError, match="sequence"):
    world.ObjectSpace(5, 2)
  with pytest.raises(ValueError, match="inconsistent per-concept values"):
    world.ObjectSpace.create([3, 4], 2, num_concepts=3)
  with pytest.raises(ValueError, match="num_concepts is required"):
    world.ObjectSpace.create(3, 2)
  assert world.ObjectSpace.create(3, 2, num_concepts=2) == world.ObjectSpace((3, 3), 2)
  assert world.ObjectSpace.create([3, 4], 2) == world.ObjectSpace((3, 4), 2)


def test_too_large_to_enumerate():
  space = world.ObjectSpace.uniform(10, 20, 2)   # 20^10 objects: fine to describe
  assert space.vocab_size == 204
  with pytest.raises(ValueError, match="too large for coverage_split"):
    coverage_splits.coverage_split(space, 0.5, 0)
  with pytest.raises(ValueError, match="too large for all_objects"):
    space.all_objects()
  with pytest.raises(ValueError, match="too large for object ids"):
    space.object_ids(np.zeros((1, 10), np.int32))


def test_tokens_match_spec_for_equal_values():
  space = world.ObjectSpace.uniform(2, 20, 2)
  assert space.concept_token_offsets == (0, 20)
  assert (space.soo_token, space.eoo_token, space.eos_token, space.pad_token) == (40, 41, 42, 43)
  assert space.vocab_size == 44 and space.scene_length == 9 and space.query_length == 5
  objects = np.array([[[3, 7], [19, 0]], [[5, 5], [-1, -1]]])
  tokens = space.scene_tokens(objects, np.array([2, 1]))
  np.testing.assert_array_equal(tokens, [[40, 3, 27, 41, 40, 19, 20, 41, 42],
                                         [40, 5, 25, 41, 42, 43, 43, 43, 43]])
  np.testing.assert_array_equal(space.object_query_tokens(np.array([3 + 7 * 20])),
                                [[40, 3, 27, 41, 42]])
  concept_queries = space.concept_query_tokens()
  assert concept_queries.shape == (40, 5)
  np.testing.assert_array_equal(concept_queries[21], [21, 42, 43, 43, 43])
  assert space.object_ids(np.array([3, 7])) == 3 + 7 * 20


def test_per_concept_values_tokens():
  space = world.ObjectSpace((3, 5, 2), 2)
  assert space.num_objects == 30 and space.num_concept_tokens == 10
  assert space.concept_token_offsets == (0, 3, 8)
  assert space.radix == (1, 3, 15)
  assert space.object_ids(np.array([2, 4, 1])) == 2 + 4 * 3 + 1 * 15
  np.testing.assert_array_equal(space.object_query_tokens(np.array([29])),
                                [[10, 2, 7, 9, 11, 12]])
  concept, value = space.token_concepts()
  np.testing.assert_array_equal(concept, [0, 0, 0, 1, 1, 1, 1, 1, 2, 2])
  np.testing.assert_array_equal(value, [0, 1, 2, 0, 1, 2, 3, 4, 0, 1])


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(values=values_strategy)
def test_ids_values_roundtrip(values):
  space = world.ObjectSpace(values, 3)
  ids = np.arange(space.num_objects)
  objects = space.object_values(ids)
  assert objects.shape == (space.num_objects, len(values))
  assert len({tuple(o) for o in objects}) == space.num_objects       # a bijection
  assert (objects < np.asarray(values)).all() and (objects >= 0).all()
  np.testing.assert_array_equal(space.object_ids(objects), ids)
  np.testing.assert_array_equal(space.all_objects(), objects)


@pytest.mark.parametrize("values", [(20, 20), (3, 5, 2)])
def test_jax_arrays_match_numpy(values):
  space = world.ObjectSpace(values, 2)
  ids = np.random.RandomState(0).randint(0, space.num_objects, size=(3, 2))
  objects = space.object_values(ids)
  jax_objects = space.object_values(jnp.asarray(ids))
  assert isinstance(jax_objects, jnp.ndarray)
  np.testing.assert_array_equal(np.asarray(jax_objects), objects)
  np.testing.assert_array_equal(np.asarray(space.object_ids(jnp.asarray(objects))), ids)
  counts = np.array([2, 1, 1])
  np.testing.assert_array_equal(
      np.asarray(space.scene_tokens(jnp.asarray(objects), jnp.asarray(counts))),
      space.scene_tokens(objects, counts))
  np.testing.assert_array_equal(np.asarray(space.object_query_tokens(jnp.asarray(ids[:, 0]))),
                                space.object_query_tokens(ids[:, 0]))


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(values=values_strategy, k=st.integers(1, 4), data=st.data())
def test_scene_tokens_decode_back(values, k, data):
  space = world.ObjectSpace(values, k)
  n = data.draw(st.integers(1, k))
  ids = data.draw(st.lists(st.integers(0, space.num_objects - 1), min_size=k, max_size=k))
  objects = space.object_values(np.asarray(ids))
  objects[n:] = -1
  tokens = space.scene_tokens(objects, n)
  assert tokens.shape == (space.scene_length,)
  np.testing.assert_array_equal(space.decode_scene(tokens), objects[:n])
  queries = space.object_query_tokens(np.asarray(ids))
  assert queries.shape == (k, space.query_length)
  assert (queries[:, -1] == space.eos_token).all()
  np.testing.assert_array_equal(queries[:n, :-1], tokens[:n * (len(values) + 2)].reshape(n, -1))


def test_decode_rejects_malformed_scene():
  space = world.ObjectSpace.uniform(2, 4, 2)
  tokens = space.scene_tokens(np.array([[1, 2], [0, 0]]), 2)
  bad = tokens.copy()
  bad[2] = 1          # a concept-0 token in concept 1's place
  with pytest.raises(ValueError, match="concept token out of place"):
    space.decode_scene(bad)
  bad = tokens.copy()
  bad[-1] = space.pad_token
  with pytest.raises(ValueError, match="expected EOS"):
    space.decode_scene(bad)


def test_invalid_ids_and_values():
  space = world.ObjectSpace((3, 4), 2)
  with pytest.raises(ValueError, match=r"\[0, 12\)"):
    space.object_values(np.array([12]))
  with pytest.raises(ValueError, match="outside"):
    space.object_ids(np.array([[0, 4]]))
  with pytest.raises(ValueError, match="last axis of size C=2"):
    space.object_ids(np.array([[0, 1, 2]]))


def test_split_save_load_roundtrip(tmp_path):
  space = world.ObjectSpace((4, 5, 3), 2)
  split = coverage_splits.coverage_split(space, 0.3, 7)
  path = tmp_path / coverage_splits.split_filename(7, 0.3)
  assert path.name == "object_split_seed7_frac0.3000.npz"
  split.save(path)
  assert os.listdir(tmp_path) == [path.name]          # no temp file left behind
  with np.load(path) as f:
    assert {"train_object_ids", "test_object_ids", "train_objects", "test_objects"} <= set(f.files)
    np.testing.assert_array_equal(f["train_objects"], space.object_values(split.train_ids))
  loaded = coverage_splits.CoverageSplit.load(path)
  np.testing.assert_array_equal(loaded.permutation, split.permutation)
  assert (loaded.num_train, loaded.coverage, loaded.seed) == (split.num_train, 0.3, 7)
  assert loaded.values_per_concept == (4, 5, 3)


def test_load_reference_style_file(tmp_path):
  # The reference files may hold only the four arrays: scalars come from the name, V from space.
  space = world.ObjectSpace.uniform(2, 6, 2)
  split = coverage_splits.coverage_split(space, 0.5, 2)
  path = tmp_path / "object_split_seed2_frac0.5000.npz"
  np.savez(path, train_object_ids=split.train_ids.astype(np.int64),
           test_object_ids=split.heldout_ids.astype(np.int64),
           train_objects=space.object_values(split.train_ids),
           test_objects=space.object_values(split.heldout_ids))
  with pytest.raises(ValueError, match="pass space="):
    coverage_splits.CoverageSplit.load(path)
  loaded = coverage_splits.CoverageSplit.load(path, space=space)
  np.testing.assert_array_equal(loaded.permutation, split.permutation)
  assert (loaded.seed, loaded.coverage, loaded.num_train) == (2, 0.5, 18)


def test_load_validates(tmp_path):
  space = world.ObjectSpace.uniform(2, 6, 2)
  split = coverage_splits.coverage_split(space, 0.5, 2)
  good = dict(train_object_ids=split.train_ids, test_object_ids=split.heldout_ids,
              train_objects=space.object_values(split.train_ids),
              test_objects=space.object_values(split.heldout_ids),
              values_per_concept=np.array([6, 6]))
  cases = {
      "missing array 'test_objects'": {k: v for k, v in good.items() if k != "test_objects"},
      "exactly once": {**good, "test_object_ids": split.heldout_ids[:-1],
                       "test_objects": space.object_values(split.heldout_ids[:-1])},
      "train_objects do not match": {**good, "train_objects": good["train_objects"][::-1]},
      "does not match the space": {**good, "values_per_concept": np.array([4, 9])},
  }
  for message, arrays in cases.items():
    path = tmp_path / "split.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=message):
      coverage_splits.CoverageSplit.load(path, space=space)
  with pytest.raises(ValueError, match="end in .npz"):
    split.save(tmp_path / "split.txt")


def test_split_object_validates():
  with pytest.raises(ValueError, match="exactly once"):
    coverage_splits.CoverageSplit(np.array([0, 0, 1]), 1, 0.5, 0)
  with pytest.raises(ValueError, match="num_train must lie in"):
    coverage_splits.CoverageSplit(np.array([0, 2, 1]), 0, 0.5, 0)
  with pytest.raises(ValueError, match="inconsistent split"):
    coverage_splits.CoverageSplit(np.array([0, 2, 1]), 1, 0.5, 0, (2, 2))


def test_load_rejects_unreadable_file(tmp_path):
  path = tmp_path / "split.npz"
  path.write_bytes(b"not a zip file")
  with pytest.raises(ValueError, match="not a readable .npz"):
    coverage_splits.CoverageSplit.load(path)
  with pytest.raises(FileNotFoundError):
    coverage_splits.CoverageSplit.load(tmp_path / "missing.npz")
