"""Soft cross-entropy and set-separation accuracy (docs/objectives.md), shared by every analysis.

All functions take logits [B,Q] of B rows (scenes) against Q candidates (queries or classes),
multi-hot labels [B,Q], a query mask [Q] for padded candidates and a row mask [B] for rows that
count (active scenes). They are pure and vmappable over any leading axis.
"""
import jax
import jax.numpy as jnp
import numpy as np

_TARGET_EPS = 1e-10


def active_rows(labels_BxQ, query_mask_Q):
  """Rows with at least one positive among the valid queries."""
  return jnp.any((labels_BxQ > 0) & query_mask_Q[None, :], axis=-1)


def soft_cross_entropy(logits_BxQ, labels_BxQ, row_mask_B, query_mask_Q):
  """Mean over masked rows of -Σ_q t_q log_softmax(logits)_q, t = labels / (Σ labels + 1e-10).

  Padded queries are removed from the softmax and the targets. Returns 0 when no row counts.
  """
  query_mask_Q = query_mask_Q.astype(bool)
  labels_BxQ = jnp.where(query_mask_Q[None, :], labels_BxQ.astype(jnp.float32), 0.0)
  targets_BxQ = labels_BxQ / (labels_BxQ.sum(-1, keepdims=True) + _TARGET_EPS)
  logits_BxQ = jnp.where(query_mask_Q[None, :], logits_BxQ.astype(jnp.float32), -jnp.inf)
  log_probs_BxQ = jax.nn.log_softmax(logits_BxQ, axis=-1)
  log_probs_BxQ = jnp.where(query_mask_Q[None, :], log_probs_BxQ, 0.0)
  loss_B = -(targets_BxQ * log_probs_BxQ).sum(-1)
  return masked_mean(loss_B, row_mask_B)


def set_separation_correct(logits_BxQ, labels_BxQ, query_mask_Q):
  """Per row: min logit over positives strictly above max logit over negatives.

  Ties count as wrong; a row without negatives is correct (min over no positives is +inf, so a
  row without positives is correct too: mask those rows out with `row_mask`).
  """
  query_mask_Q = query_mask_Q.astype(bool)
  positive_BxQ = (labels_BxQ > 0) & query_mask_Q[None, :]
  negative_BxQ = (labels_BxQ <= 0) & query_mask_Q[None, :]
  logits_BxQ = logits_BxQ.astype(jnp.float32)
  min_positive_B = jnp.min(jnp.where(positive_BxQ, logits_BxQ, jnp.inf), axis=-1)
  max_negative_B = jnp.max(jnp.where(negative_BxQ, logits_BxQ, -jnp.inf), axis=-1)
  return min_positive_B > max_negative_B


def masked_mean(values_B, mask_B):
  """Mean of values over mask; 0 when the mask is empty."""
  mask_B = mask_B.astype(jnp.float32)
  return (values_B * mask_B).sum() / jnp.maximum(mask_B.sum(), 1.0)


def accuracy_by_count(correct_B, row_mask_B, num_objects_B, max_objects):
  """Accuracy over masked rows, overall and for each number of objects 1..max_objects.

  Returns (overall, per_count [max_objects], rows_per_count [max_objects]); a count with no
  rows has accuracy 0 and a row count of 0 so callers can tell it apart.
  """
  correct_B = correct_B.astype(jnp.float32)
  counts_K = jnp.arange(1, max_objects + 1)
  in_count_KxB = (num_objects_B[None, :] == counts_K[:, None]) & row_mask_B[None, :].astype(bool)
  rows_K = in_count_KxB.sum(-1)
  per_count_K = (in_count_KxB * correct_B[None, :]).sum(-1) / jnp.maximum(rows_K, 1)
  return masked_mean(correct_B, row_mask_B), per_count_K, rows_K


def cross_objects(a_BxC, b_BxC):
  """Values [B, 2^C − 2, C] of the objects that mix the values of objects a and b.

  Mix m takes concept c from b where bit c of m is set, else from a; the two unmixed objects
  (a itself and b itself) are left out. For C = 2 these are (a0, b1) and (b0, a1).
  """
  c = a_BxC.shape[-1]
  bits_MxC = (np.arange(1, 2 ** c - 1)[:, None] >> np.arange(c)[None, :]) & 1
  return jnp.where(jnp.asarray(bits_MxC, bool)[None], b_BxC[:, None, :], a_BxC[:, None, :])


def binding_scenes(objects_BxKxC, num_objects_B):
  """bool [B]: 2-object scenes whose objects differ in every concept (binding decides them)."""
  a_BxC, b_BxC = objects_BxKxC[:, 0], objects_BxKxC[:, 1]
  return (num_objects_B == 2) & jnp.all(a_BxC != b_BxC, axis=-1)


def binding_correct(positive_logits_BxP, cross_logits_BxX):
  """bool [B]: every positive (the scene's objects) strictly above every cross object."""
  return positive_logits_BxP.min(-1) > cross_logits_BxX.max(-1)


def two_object_binding(logits_BxQ, labels_BxQ, query_mask_Q, query_ids_Q, objects_BxKxC,
                       num_objects_B, space):
  """Which 2-object scenes need binding, and whether the logits bind them (C = 2 concepts).

  A scene {(a0, a1), (b0, b1)} with a0 ≠ b0 and a1 ≠ b1 is "ambiguous": its cross pair
  {(a0, b1), (b0, a1)} holds the same concept values, so only binding tells the two apart.
  Otherwise the objects "share" one value or are the "same" object twice. Returns bools [B],
  False on rows that are not 2-object scenes: same, share, ambiguous; for ambiguous scenes
  "bag" (both positives above every negative except the cross objects: right up to binding),
  "cross_queried" (both cross objects are valid queries) and "bind" (those rows with both
  positives above both cross objects). query_ids_Q are object ids of `space` (an ObjectSpace).
  """
  if objects_BxKxC.shape[-1] != 2:
    raise ValueError(f"two_object_binding: objects have {objects_BxKxC.shape[-1]} concepts; "
                     "the cross pair is defined for C = 2")
  two_B = num_objects_B == 2
  a_BxC, b_BxC = objects_BxKxC[:, 0], objects_BxKxC[:, 1]
  num_equal_B = (a_BxC == b_BxC).sum(-1)
  ambiguous_B = two_B & (num_equal_B == 0)
  cross_Bx2 = jnp.stack([space.object_ids(jnp.stack([a_BxC[:, 0], b_BxC[:, 1]], -1).clip(0)),
                         space.object_ids(jnp.stack([b_BxC[:, 0], a_BxC[:, 1]], -1).clip(0))],
                        -1)
  query_mask_Q = query_mask_Q.astype(bool)
  cross_BxQ = (query_ids_Q[None, :, None] == cross_Bx2[:, None, :]).any(-1) & query_mask_Q
  positive_BxQ = (labels_BxQ > 0) & query_mask_Q
  negative_BxQ = (labels_BxQ <= 0) & query_mask_Q
  logits_BxQ = logits_BxQ.astype(jnp.float32)
  min_positive_B = jnp.min(jnp.where(positive_BxQ, logits_BxQ, jnp.inf), -1)
  max_other_B = jnp.max(jnp.where(negative_BxQ & ~cross_BxQ, logits_BxQ, -jnp.inf), -1)
  max_cross_B = jnp.max(jnp.where(negative_BxQ & cross_BxQ, logits_BxQ, -jnp.inf), -1)
  cross_queried_B = ambiguous_B & (cross_BxQ.sum(-1) == 2)
  return {"same": two_B & (num_equal_B == 2), "share": two_B & (num_equal_B == 1),
          "ambiguous": ambiguous_B, "bag": ambiguous_B & (min_positive_B > max_other_B),
          "cross_queried": cross_queried_B,
          "bind": cross_queried_B & (min_positive_B > max_cross_B)}
