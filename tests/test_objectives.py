"""Soft cross-entropy and set-separation accuracy (docs/objectives.md) on hand-made rows."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bindjax.core import objectives
from bindjax.core import world


def _correct(logits, labels, query_mask=None):
  logits = jnp.asarray(logits, jnp.float32)
  labels = jnp.asarray(labels, jnp.float32)
  if query_mask is None:
    query_mask = jnp.ones(logits.shape[-1], bool)
  return np.asarray(objectives.set_separation_correct(logits, labels, jnp.asarray(query_mask)))


def test_ties_between_positive_and_negative_are_wrong():
  assert _correct([[1.0, 1.0, 0.0]], [[1, 0, 0]]).tolist() == [False]
  assert _correct([[1.0, 0.9999, 0.0]], [[1, 0, 0]]).tolist() == [True]


def test_min_positive_must_beat_max_negative():
  # Two positives, one below a negative: wrong; both above: correct.
  assert _correct([[3.0, 0.5, 1.0]], [[1, 1, 0]]).tolist() == [False]
  assert _correct([[3.0, 2.0, 1.0]], [[1, 1, 0]]).tolist() == [True]


def test_duplicate_positives_count_once():
  # A scene holding the same object twice has label 2 (or 1) for it: still one positive.
  assert _correct([[2.0, 1.0, 0.0]], [[2, 0, 0]]).tolist() == [True]
  loss2 = objectives.soft_cross_entropy(jnp.array([[2.0, 1.0, 0.0]]), jnp.array([[2.0, 0, 0]]),
                                        jnp.array([True]), jnp.ones(3, bool))
  loss1 = objectives.soft_cross_entropy(jnp.array([[2.0, 1.0, 0.0]]), jnp.array([[1.0, 0, 0]]),
                                        jnp.array([True]), jnp.ones(3, bool))
  np.testing.assert_allclose(loss2, loss1, rtol=1e-6)


def test_all_positive_row_is_correct_and_padding_ignored():
  assert _correct([[0.0, -5.0]], [[1, 1]]).tolist() == [True]
  # The only negative is a padded query: the row has no valid negative.
  assert _correct([[0.0, 9.0]], [[1, 0]], [True, False]).tolist() == [True]
  # A padded query never counts as a positive either.
  assert _correct([[0.0, 1.0, -9.0]], [[0, 1, 1]], [True, True, False]).tolist() == [True]


def test_active_rows_and_exclusion_from_loss_and_accuracy():
  logits = jnp.array([[2.0, 0.0], [0.0, 2.0], [5.0, 0.0]])
  labels = jnp.array([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
  query_mask = jnp.array([True, True])
  active = objectives.active_rows(labels, query_mask)
  assert np.asarray(active).tolist() == [True, True, False]
  # Positive only in a padded query: inactive.
  assert np.asarray(objectives.active_rows(jnp.array([[0.0, 1.0]]),
                                           jnp.array([True, False]))).tolist() == [False]
  correct = objectives.set_separation_correct(logits, labels, query_mask)
  overall, per_count, rows = objectives.accuracy_by_count(
      correct, active, jnp.array([1, 2, 2]), max_objects=2)
  assert float(overall) == 0.5  # row 2 (inactive) is excluded, else it would be 1/3 or 2/3
  np.testing.assert_allclose(per_count, [1.0, 0.0])
  assert np.asarray(rows).tolist() == [1, 1]
  # The inactive row contributes nothing to the loss, whatever its logits.
  loss = objectives.soft_cross_entropy(logits, labels, active, query_mask)
  loss_first_two = objectives.soft_cross_entropy(logits[:2], labels[:2], active[:2], query_mask)
  np.testing.assert_allclose(loss, loss_first_two, rtol=1e-6)


def test_soft_cross_entropy_hand_computed():
  # Row 0: one positive of three: -log softmax([1,0,0])_0 = log(e+2) - 1.
  # Row 1: two positives, targets 1/2 each: -(1/2)(log p0 + log p2) with logits [0, 1, 2].
  logits = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 2.0]])
  labels = jnp.array([[1.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
  row0 = math.log(math.e + 2) - 1
  log_z1 = math.log(1 + math.e + math.e ** 2)
  row1 = -0.5 * ((0 - log_z1) + (2 - log_z1))
  loss = objectives.soft_cross_entropy(logits, labels, jnp.array([True, True]), jnp.ones(3, bool))
  np.testing.assert_allclose(loss, (row0 + row1) / 2, rtol=1e-6)
  # Padding the last query removes it from the softmax: row 0 becomes log(e+1) - 1; row 1 has
  # target 1 on query 0: -log softmax([0,1])_0 = log(1+e).
  loss = objectives.soft_cross_entropy(logits, labels, jnp.array([True, True]),
                                       jnp.array([True, True, False]))
  np.testing.assert_allclose(loss, ((math.log(math.e + 1) - 1) + math.log(1 + math.e)) / 2,
                             rtol=1e-6)
  # Target normalisation uses Σ labels + 1e-10 (not exactly 1), as the reference does.
  one = objectives.soft_cross_entropy(jnp.array([[0.0, 0.0]]), jnp.array([[1.0, 0.0]]),
                                      jnp.array([True]), jnp.ones(2, bool))
  np.testing.assert_allclose(one, math.log(2) / (1 + 1e-10), rtol=1e-6)


def test_no_active_rows_gives_zero_loss_and_gradient():
  logits = jnp.array([[1.0, 2.0]])
  grad = jax.grad(lambda x: objectives.soft_cross_entropy(
      x, jnp.zeros((1, 2)), jnp.array([False]), jnp.ones(2, bool)))(logits)
  assert float(objectives.soft_cross_entropy(logits, jnp.zeros((1, 2)), jnp.array([False]),
                                             jnp.ones(2, bool))) == 0.0
  assert np.all(np.isfinite(grad)) and np.all(grad == 0)


def test_accuracy_by_count_counts_with_no_rows():
  overall, per_count, rows = objectives.accuracy_by_count(
      jnp.array([True, False, True]), jnp.array([True, True, True]), jnp.array([1, 1, 1]), 3)
  np.testing.assert_allclose(overall, 2 / 3, rtol=1e-6)
  np.testing.assert_allclose(per_count, [2 / 3, 0.0, 0.0], rtol=1e-6)
  assert np.asarray(rows).tolist() == [3, 0, 0]


@pytest.mark.parametrize("batch_shape", [(4,), (2, 3)])
def test_vmappable_over_leading_axes(batch_shape):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=batch_shape + (5, 6)).astype(np.float32)
  labels = (rng.random(batch_shape + (5, 6)) < 0.3).astype(np.float32)
  mask = np.ones(6, bool)
  fn = lambda lg, lb: objectives.soft_cross_entropy(lg, lb, objectives.active_rows(lb, mask), mask)
  for _ in batch_shape:
    fn = jax.vmap(fn)
  out = fn(jnp.asarray(logits), jnp.asarray(labels))
  flat_logits = logits.reshape(-1, 5, 6)
  flat_labels = labels.reshape(-1, 5, 6)
  expected = [fn_one for fn_one in (
      objectives.soft_cross_entropy(lg, lb, objectives.active_rows(lb, mask), mask)
      for lg, lb in zip(flat_logits, flat_labels))]
  np.testing.assert_allclose(np.asarray(out).reshape(-1), np.array(expected), rtol=1e-5)


def test_two_object_binding_kinds_bag_and_bind():
  space = world.ObjectSpace((3, 3), max_objects=2)
  ids = lambda *objects: [int(space.object_ids(np.array(o))) for o in objects]  # noqa: E731
  amb = np.array([[0, 0], [1, 1]])          # cross pair (0, 1), (1, 0)
  positives, cross = ids((0, 0), (1, 1)), ids((0, 1), (1, 0))
  other = ids((2, 2))[0]
  objects = np.array([amb, amb, amb, [[0, 0], [0, 1]], [[2, 2], [2, 2]], [[1, 2], [-1, -1]]])
  num_objects = np.array([2, 2, 2, 2, 2, 1])
  logits = np.zeros((6, 9), np.float32)
  logits[:3, positives] = 5.0
  logits[0, cross] = 5.0                      # cross objects tie with the positives: no binding
  logits[1, cross] = 4.0                      # binds
  logits[2, cross], logits[2, other] = 4.0, 6.0   # binds, but another object beats a positive
  labels = np.zeros((6, 9), np.float32)
  for row, scene in enumerate(objects):
    for obj in scene[:num_objects[row]]:
      labels[row, ids(obj)[0]] = 1.0
  query_ids = np.arange(9)
  query_mask = np.ones(9, bool)
  out = {k: np.asarray(v).tolist() for k, v in objectives.two_object_binding(
      jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(query_mask), jnp.asarray(query_ids),
      jnp.asarray(objects), jnp.asarray(num_objects), space).items()}
  assert out["ambiguous"] == [True, True, True, False, False, False]
  assert out["share"] == [False, False, False, True, False, False]
  assert out["same"] == [False, False, False, False, True, False]
  assert out["bag"] == [True, True, False, False, False, False]
  assert out["bind"] == [False, True, True, False, False, False]
  assert out["cross_queried"] == [True, True, True, False, False, False]
  query_mask[cross[0]] = False                # a cross object that is not a query
  out = objectives.two_object_binding(
      jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(query_mask), jnp.asarray(query_ids),
      jnp.asarray(objects), jnp.asarray(num_objects), space)
  assert np.asarray(out["cross_queried"]).tolist() == [False] * 6
  assert np.asarray(out["bind"]).tolist() == [False] * 6
  with pytest.raises(ValueError, match="C = 2"):
    objectives.two_object_binding(logits, labels, query_mask, query_ids,
                                  np.zeros((6, 2, 3), int), num_objects, space)
