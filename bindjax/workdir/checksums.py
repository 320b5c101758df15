"""Checksums of arrays, computed on the devices where the arrays live.

Two wrapping uint32 sums per array, of its 32-bit words (smaller types widened, 64-bit ones
split): the plain sum and the sum weighted by position (2p + 1 for word p), so that any single
flipped bit and any swap of words changes them; and the same two sums of each row along the
leading axis, so that one row (a replica) can be verified alone. Only the sums come to the host,
so sharded, multi-host states are checked without gathering them.
"""
import jax
import jax.numpy as jnp
import numpy as np

from bindjax.runtime import parallel


def _words(x):
  """The array's contents as uint32 words (smaller types widened, 64-bit ones split)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32).ravel()
  size = x.dtype.itemsize
  if size >= 4:
    return jax.lax.bitcast_convert_type(x, jnp.uint32).ravel()
  narrow = jnp.uint16 if size == 2 else jnp.uint8
  return jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32).ravel()


def _pair(w):
  """[..., 2]: the sum and the position-weighted sum of the words along the last axis."""
  position = jnp.arange(w.shape[-1], dtype=jnp.uint32) * 2 + 1
  return jnp.stack([w.sum(-1, dtype=jnp.uint32), (w * position).sum(-1, dtype=jnp.uint32)], -1)


def _view_shape(x):
  """[rows, words per row] of an array's `_words` (a scalar is one row)."""
  rows = x.shape[0] if x.ndim else 1
  # A word per element, two for 64-bit types; a PRNG key's itemsize is that of its key data.
  words = max(1, x.dtype.itemsize // 4)
  return rows, (x.size // rows if rows else 0) * words


def _groups(leaves):
  """Leaf indices grouped by `_view_shape`, groups in order of first appearance."""
  groups = {}
  for i, x in enumerate(leaves):
    groups.setdefault(_view_shape(x), []).append(i)
  return list(groups.values())


# One program per tree, as one reduction per distinct leaf shape: leaves of one shape (a layer's
# kernel in every layer and optimiser copy) are stacked and summed together, so the program's
# compile barely grows with depth, where one reduction per leaf made it grow with every layer.
# Stacking along a new axis keeps each leaf's row sharding: no rows move between devices.
@jax.jit
def _row_pairs(leaves):
  """[[n, rows, 2] per group of `_groups`]: the `_pair` of every row of every leaf."""
  # The words of one row are contiguous (row-major), whatever their dtype's width.
  return [_pair(jnp.stack([_words(leaves[i]).reshape(_view_shape(leaves[i]))
                           for i in group]))
          for group in _groups(leaves)]


def _whole(pairs_Rx2, words_per_row):
  """The `_pair` of a whole array from those of its rows: word p = r·n + j of row r weighs
  2p + 1 = (2j + 1) + 2·r·n, so the weighted sum is Σ_r (weighted_r + 2·r·n·sum_r), mod 2³²."""
  pairs = pairs_Rx2.astype(np.uint64)
  offset = 2 * np.arange(len(pairs), dtype=np.uint64) * np.uint64(words_per_row)
  total = pairs[:, 0].sum() % 2**32
  weighted = (pairs[:, 1] + (offset % 2**32) * pairs[:, 0] % 2**32).sum() % 2**32
  return [int(total), int(weighted)]


def of_leaves(flat):
  """({name: [sum, weighted sum]}, {name of a leaf of rank >= 1: that pair of each row}) of
  [(name, array)], from one jitted pass on the devices."""
  leaves = [jnp.asarray(x) for _, x in flat]
  per_leaf = [None] * len(flat)
  for group, pairs_NxRx2 in zip(_groups(leaves), parallel.to_host(_row_pairs(leaves))):
    for i, pairs_Rx2 in zip(group, pairs_NxRx2):
      per_leaf[i] = pairs_Rx2
  arrays = {name: _whole(pairs, _view_shape(x)[1])
            for (name, _), x, pairs in zip(flat, leaves, per_leaf)}
  rows = {name: pairs.tolist() for (name, _), x, pairs in zip(flat, leaves, per_leaf) if x.ndim}
  return arrays, rows
