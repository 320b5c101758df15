"""Binding-function approximators: the families' forms, shapes and batching."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bindjax.complexity import families

VALUES = (3, 3)


def scenes(num, values=VALUES, max_objects=2, seed=0):
  rng = np.random.default_rng(seed)
  return jnp.asarray(np.stack([rng.integers(0, v, size=(num, max_objects)) for v in values], -1))


def reference_hidden(model, params, values_NxKxC):
  """The family's formula written out with numpy loops over slots."""
  p = jax.tree_util.tree_map(np.asarray, params)
  v = np.asarray(values_NxKxC)
  n, k, c = v.shape
  e = np.stack([p["tables"][i * c + j][v[:, i, j]] for i in range(k) for j in range(c)], 1)
  if model.family == "additive":
    return e.sum(1)
  if model.family == "mlp":
    h = e.reshape(n, -1)
    for layer in p["hidden"]:
      h = np.maximum(h @ layer["kernel"] + layer["bias"], 0)
    return h
  if model.family in ("per_object_product", "per_object_sum_product"):
    out = 0
    for i in range(k):
      prod = e[:, i * c] @ p["w"] if model.learned_w else e[:, i * c]
      for j in range(1, c):
        prod = prod * e[:, i * c + j]
      out = out + prod
    if model.family == "per_object_sum_product":
      out = out + sum(p["sum_tables"][i * c + j][v[:, i, j]] for i in range(k) for j in range(c))
    return out
  first = e[:, 0] @ p["w"] if model.learned_w else e[:, 0]
  prod = first * np.prod(e[:, 1:], axis=1)
  if model.family == "product":
    return prod
  sums = sum(p["sum_tables"][i * c + j][v[:, i, j]] for i in range(k) for j in range(c))
  return np.concatenate([prod, sums], -1)


@pytest.mark.parametrize("family,widths,learned_w", [
    ("mlp", (16, 8), False), ("additive", (), False), ("product", (), False),
    ("product", (), True), ("sum_product", (), True), ("per_object_product", (), False),
    ("per_object_sum_product", (), False), ("per_object_sum_product", (), True)])
def test_family_formula_and_parameter_count(family, widths, learned_w):
  values, max_objects = (2, 4, 3), 3  # any K and C: 3 objects of 3 concepts, unequal V_c
  model = families.make(family, values, max_objects, out_dim=5, widths=widths, embed_dim=6,
                       learned_w=learned_w)
  params = model.init(jax.random.PRNGKey(0))
  if learned_w:  # W starts at I; move it so the test sees it act
    params["w"] = params["w"] + 0.3 * jax.random.normal(jax.random.PRNGKey(1), (6, 6))
  x = scenes(7, values, max_objects)
  y = model.apply(params, x)
  assert y.shape == (7, 5)
  h = reference_hidden(model, params, x)
  expected = h @ np.asarray(params["out"]["kernel"]) + np.asarray(params["out"]["bias"])
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
  # Slot tables N(0,1): std near 1 over all (unpadded) rows.
  assert 0.7 < float(jnp.std(params["tables"][0, :values[0]])) < 1.4
  padded_rows = sum(max(values) - v for v in values) * max_objects
  tables = (2 if family in ("sum_product", "per_object_sum_product") else 1) * padded_rows * 6
  leaves = sum(np.size(x) for x in jax.tree_util.tree_leaves(params))
  assert model.num_parameters() == leaves - tables


def test_batch_of_models_is_one_vmap():
  model = families.make("sum_product", VALUES, 2, out_dim=4, embed_dim=3)
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  stacked = jax.vmap(model.init)(keys)
  x = scenes(5)
  batched = jax.jit(jax.vmap(model.apply, in_axes=(0, None)))(stacked, x)
  for m in range(3):
    np.testing.assert_allclose(batched[m], model.apply(model.init(keys[m]), x), rtol=1e-5,
                               atol=1e-5)
  assert not np.allclose(batched[0], batched[1])


def test_additive_and_per_object_forms_are_what_they_claim():
  x = scenes(6)
  swapped = x[:, ::-1]
  # Per-object product with shared tables across objects is order-invariant; additive over
  # slots cannot tell which value belongs to which object.
  model = families.make("per_object_product", VALUES, 2, out_dim=3, embed_dim=4)
  params = model.init(jax.random.PRNGKey(2))
  params["tables"] = params["tables"].at[2:].set(params["tables"][:2])
  np.testing.assert_allclose(model.apply(params, x), model.apply(params, swapped), rtol=1e-5)
  additive = families.make("additive", VALUES, 2, out_dim=3, embed_dim=4)
  p = additive.init(jax.random.PRNGKey(3))
  p["tables"] = p["tables"].at[1].set(p["tables"][3]).at[0].set(p["tables"][2])
  recombined = jnp.stack([x[:, :, 0], x[:, ::-1, 1]], -1)  # swap concept-1 values between objects
  np.testing.assert_allclose(additive.apply(p, x), additive.apply(p, recombined), rtol=1e-5)


def test_invalid_models_raise():
  with pytest.raises(ValueError, match="family"):
    families.make("tree", VALUES, 2, 4)
  with pytest.raises(ValueError, match="widths"):
    families.make("mlp", VALUES, 2, 4)
  with pytest.raises(ValueError, match="widths"):
    families.make("additive", VALUES, 2, 4, widths=(8,))
  with pytest.raises(ValueError, match="learned_w"):
    families.make("per_object_product", VALUES, 2, 4, learned_w=True)
  assert families.make("mlp", VALUES, 2, 4, widths=(8, 2)).name == "mlp[8,2]"
  assert families.make("product", VALUES, 2, 4, learned_w=True).name == "product(W)"


def test_one_hot_slots():
  x = jnp.asarray([[[0, 2], [1, 0]]])
  np.testing.assert_array_equal(families.one_hot_slots(x, (2, 3)),
                                [[1, 0, 0, 0, 1, 0, 1, 1, 0, 0]])
