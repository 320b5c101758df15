"""Soft cross-entropy and set-separation accuracy (SPEC §5), shared by every analysis.

All functions take logits [B,Q] of B rows (scenes) against Q candidates (queries or classes),
multi-hot labels [B,Q], a query mask [Q] for padded candidates and a row mask [B] for rows that
count (active scenes). They are pure and vmappable over any leading axis.
"""
import jax
import jax.numpy as jnp

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
