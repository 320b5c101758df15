"""Distinct sets of object ids at static sizes, for the scene sampler (bindjax.core.scenes).

First occurrences through a table indexed by object id (a scatter-min; a sort above
`TABLE_LIMIT` objects); random subsets by one sort of random priorities given to first
occurrences; labels by scattering each scene's objects into the columns of their queries.
"""
import jax
import jax.numpy as jnp

# Tables indexed by object id (scatter/gather, O(n)) are used up to this
# many objects; above it, sorts and comparisons (independent of |O|).
TABLE_LIMIT = 1 << 20
# Random subsets sort uint32 keys with the position in this many low bits at most (top_k above).
MAX_INDEX_BITS = 20


def first_occurrences(ids_N, num_objects, table_limit=TABLE_LIMIT):
  """bool [N]: entry holds a valid id (in [0, num_objects)) seen at no earlier position; by a
  table indexed by id up to `table_limit` objects, by a sort above (a lower `table_limit` takes
  the sort with fewer objects)."""
  n = ids_N.shape[0]
  position_N = jnp.arange(n, dtype=jnp.int32)
  valid_N = (ids_N >= 0) & (ids_N < num_objects)
  ids_N = jnp.where(valid_N, ids_N, num_objects)
  if num_objects <= table_limit:
    first_O = jnp.full((num_objects + 1,), n, jnp.int32).at[ids_N].min(position_N)
    return valid_N & (first_O[ids_N] == position_N)
  order_N = jnp.argsort(ids_N, stable=True)
  sorted_N = ids_N[order_N]
  starts_N = jnp.concatenate([jnp.ones((1,), bool), sorted_N[1:] != sorted_N[:-1]])
  return valid_N & jnp.zeros((n,), bool).at[order_N].set(starts_N)


def random_subset(words_N, keep_N, size, max_index_bits=MAX_INDEX_BITS):
  """A uniformly random subset of at most `size` kept positions: (positions [size], valid);
  `words_N` holds one random uint32 per position; top_k when a position needs more than
  `max_index_bits` bits.

  One single-operand sort of uint32 keys (random priority in the high bits, position in the low
  bits), which on CPU is several times cheaper than top_k's key-value sort. Equal priorities are
  broken by position, which only matters at the cut-off and is itself random when positions are.
  """
  n = keep_N.shape[0]
  index_bits = max(1, (n - 1).bit_length())
  if index_bits > max_index_bits:
    priority_N = jnp.where(keep_N, (words_N >> 1).astype(jnp.int32), -1)
    top, position = jax.lax.top_k(priority_N, size)
    return position, top >= 0
  position_N = jnp.arange(n, dtype=jnp.uint32)
  high_N = ((words_N >> index_bits) | 1) << index_bits     # never 0 for kept positions
  sort_key_N = jnp.where(keep_N, high_N | position_N, position_N)
  top = jnp.sort(sort_key_N)[::-1][:size]
  position = (top & ((1 << index_bits) - 1)).astype(jnp.int32)
  return position, (top >> index_bits) > 0


def compact(ids_N, keep_N, size, fill):
  """The kept ids moved to the front of a [size] array (size >= number kept), rest `fill`."""
  target_N = jnp.where(keep_N, jnp.cumsum(keep_N) - 1, size)
  return jnp.full((size,), fill, ids_N.dtype).at[target_N].set(ids_N, mode="drop")


def scatter_rows(columns_BxN, num_columns, dtype):
  """[B, num_columns] with a one at (b, columns[b, n]); columns >= num_columns are dropped."""
  rows_BxN = jnp.broadcast_to(
      jnp.arange(columns_BxN.shape[0], dtype=jnp.int32)[:, None], columns_BxN.shape)
  return jnp.zeros((columns_BxN.shape[0], num_columns), dtype).at[rows_BxN, columns_BxN].set(
      1, mode="drop")


def membership_labels(ids_BxK, query_ids_Q, query_mask_Q, num_objects, table_limit=TABLE_LIMIT):
  """float32 [B, Q]: 1 where masked-in query q is one of the objects of scene b (ids < 0 are
  empty slots); by a table indexed by id up to `table_limit` objects, by comparisons above."""
  q = query_ids_Q.shape[0]
  if num_objects > table_limit:
    hits_BxQ = jnp.any(ids_BxK[:, :, None] == query_ids_Q[None, None, :], axis=1)
    return (hits_BxQ & query_mask_Q[None, :]).astype(jnp.float32)
  # Column of each object id among the queries (q: none), then one scatter per scene slot.
  column_O = jnp.full((num_objects + 1,), q, jnp.int32).at[
      jnp.where(query_mask_Q, query_ids_Q, num_objects)].set(jnp.arange(q, dtype=jnp.int32))
  column_O = column_O.at[num_objects].set(q)
  column_BxK = column_O[jnp.where(ids_BxK >= 0, ids_BxK, num_objects)]
  return scatter_rows(column_BxK, q, jnp.float32)
