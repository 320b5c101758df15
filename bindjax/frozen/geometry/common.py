"""Shared pieces of the geometry analyses: scene index, object banks, retrieval, files.

Semantics: docs/geometry.md. Object indices are those of `EmbeddingSet.object_ids()`
(first-appearance order, docs/frozen.md#object-ids). Banks hold one vector per object (obj-avg,
single-object) or one per slot and object (pos-avg).
"""
import dataclasses
import os

import numpy as np

from bindjax.base import config_values
from bindjax.base import errors

BANKS = ("obj-avg", "pos-avg", "single-object")
# How obj-avg weighs a scene holding the same object twice: twice ("occurrences", the original
# code's average over slot occurrences, the default) or once ("scenes").
OBJ_AVG_COUNTINGS = ("occurrences", "scenes")
OBJ_AVG_COUNTING = OBJ_AVG_COUNTINGS[0]
# Which concept the analyses edit as the "attribute" and which they keep as the "shape"
# (clevr_text: colour, then shape).
ATTRIBUTE_CONCEPT, SHAPE_CONCEPT = 0, 1
# Cosines within this of the best one count as a tie in retrieval.
TIE_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class SceneIndex:
  """Scene structure of an embedding set, in object indices.

  rows_N: rows of the set holding exactly 2 objects; ids_Nx2: their object indices (slot order);
  single_rows_S / single_ids_S: rows with exactly 1 object and its index; unique_UxC: object values.
  """
  rows_N: np.ndarray
  ids_Nx2: np.ndarray
  single_rows_S: np.ndarray
  single_ids_S: np.ndarray
  unique_UxC: np.ndarray
  scene_ids_AxK: np.ndarray   # every row of the set, -1 padded

  @property
  def num_objects(self):
    return int(self.unique_UxC.shape[0])

  @property
  def has_single_objects(self):
    return self.single_rows_S.size > 0


def scene_index(embedding_set):
  """SceneIndex of `embedding_set`; ValueError when it has no 2-object scenes."""
  scene_ids_AxK, unique_UxC = embedding_set.object_ids()
  scene_ids_AxK = np.asarray(scene_ids_AxK, np.int64)
  unique_UxC = np.asarray(unique_UxC, np.int64)
  num_objects_A = np.asarray(embedding_set.num_objects)
  rows_N = np.flatnonzero(num_objects_A == 2)
  if rows_N.size == 0:
    raise ValueError(f"embedding set has no 2-object scenes (num_objects values: "
                     f"{sorted(set(num_objects_A.tolist()))}); the geometry analyses need them")
  single_rows_S = np.flatnonzero(num_objects_A == 1)
  return SceneIndex(rows_N=rows_N, ids_Nx2=scene_ids_AxK[rows_N, :2],
                    single_rows_S=single_rows_S, single_ids_S=scene_ids_AxK[single_rows_S, 0],
                    unique_UxC=unique_UxC, scene_ids_AxK=scene_ids_AxK)


@dataclasses.dataclass(frozen=True)
class ObjectBank:
  """Object estimates: vectors_SxUxD with S = 1 (position-free) or 2 (per slot); present_SxU."""
  name: str
  vectors_SxUxD: np.ndarray
  present_SxU: np.ndarray

  def slot(self, slot):
    """The table used for an object in `slot` (position-free banks share one table)."""
    s = slot if self.vectors_SxUxD.shape[0] > 1 else 0
    return self.vectors_SxUxD[s], self.present_SxU[s]


def _means(member_UxN, values_NxD):
  counts_U = member_UxN.sum(1)
  sums_UxD = member_UxN.astype(np.float64) @ values_NxD
  return sums_UxD / np.maximum(counts_U, 1)[:, None], counts_U > 0


def object_bank(name, index, embeddings_AxD, obj_avg_counting=OBJ_AVG_COUNTING):
  """Bank `name` (one of BANKS) from the rows of `embeddings_AxD` (all rows of the set).

  obj-avg: mean of the 2-object scenes containing the object, over its slot occurrences (a
  scene holding it twice counts twice) or, with obj_avg_counting="scenes", over scenes;
  pos-avg: mean of the 2-object scenes holding it in each slot; single-object: its
  single-object scene(s). Raises ValueError for single-object on a set without such scenes.
  """
  if obj_avg_counting not in OBJ_AVG_COUNTINGS:
    raise ValueError(f"obj_avg_counting={obj_avg_counting!r}: expected one of "
                     f"{OBJ_AVG_COUNTINGS}")
  embeddings_AxD = np.asarray(embeddings_AxD, np.float64)
  num_u = index.num_objects
  two_NxD = embeddings_AxD[index.rows_N]
  objects_U = np.arange(num_u)
  if name == "obj-avg":
    in_slot_2xUxN = index.ids_Nx2.T[:, None, :] == objects_U[None, :, None]
    member_UxN = (in_slot_2xUxN.sum(0) if obj_avg_counting == "occurrences"
                  else in_slot_2xUxN.any(0))
    vectors_UxD, present_U = _means(member_UxN, two_NxD)
    return ObjectBank(name, vectors_UxD[None], present_U[None])
  if name == "pos-avg":
    tables = [_means(index.ids_Nx2[None, :, s] == objects_U[:, None], two_NxD) for s in (0, 1)]
    return ObjectBank(name, np.stack([t[0] for t in tables]), np.stack([t[1] for t in tables]))
  if name == "single-object":
    if not index.has_single_objects:
      raise ValueError("bank 'single-object' needs single-object scenes, but the embedding set "
                       "has none; use 'obj-avg' or 'pos-avg'")
    member_UxS = index.single_ids_S[None, :] == objects_U[:, None]
    vectors_UxD, present_U = _means(member_UxS, embeddings_AxD[index.single_rows_S])
    return ObjectBank(name, vectors_UxD[None], present_U[None])
  raise ValueError(f"unknown object bank {name!r}; expected one of {BANKS}")


def bank_names(value, field):
  """The bank names of a setting (a tuple, or a comma list): () for every bank the set supports,
  which an empty value or "auto" asks for."""
  banks = config_values.names(value, field)
  return () if banks == ("auto",) else banks


def banks_to_run(banks, index):
  """The banks a run computes: `banks` (checked), or for () every bank the set supports."""
  if banks:
    return check_banks(banks, index)
  return tuple(b for b in BANKS if b != "single-object" or index.has_single_objects)


def check_banks(banks, index):
  """Validates bank names up front (so commands fail before writing anything)."""
  banks = tuple(banks)
  if not banks:
    raise errors.ConfigError("banks: expected at least one of " + ", ".join(BANKS))
  for name in banks:
    if name not in BANKS:
      raise errors.ConfigError(f"banks: unknown bank {name!r}; expected one of {BANKS}")
    if name == "single-object" and not index.has_single_objects:
      raise ValueError("banks: 'single-object' requested but the embedding set has no "
                       "single-object scenes (num_objects == 1); drop it or use a set with them")
  return banks


def r_squared(y_NxD, prediction_NxD):
  """Pooled R² = 1 − SSE/SST over all entries, SST around the per-dimension mean of y."""
  y_NxD = np.asarray(y_NxD, np.float64)
  sse = np.sum((y_NxD - prediction_NxD) ** 2)
  sst = np.sum((y_NxD - y_NxD.mean(0, keepdims=True)) ** 2)
  return float(1.0 - sse / sst) if sst > 0 else float("nan")


def normalize(x_NxD):
  x_NxD = np.asarray(x_NxD, np.float64)
  return x_NxD / np.maximum(np.linalg.norm(x_NxD, axis=-1, keepdims=True), 1e-12)


def top1_retrieval(queries_QxD, pool_NxD, target_key_Q, pool_key_N, target_set_key_Q,
                   pool_set_key_N, tie_tolerance=TIE_TOLERANCE, chunk=1024):
  """Top-1 cosine retrieval of each query among the pool rows.

  Keys identify scenes: `*_key` an ordered scene, `*_set_key` the unordered object multiset. The
  top set is every pool row within `tie_tolerance` of the best cosine. Returns dict of bool [Q]:
  hit (every top row is the target scene, so exact duplicates of the target are not ties), tie
  (the target is in the top set together with another scene: counted as a miss), and
  order_insensitive_hit (every top row holds the target's objects, in any order); plus top_row
  (int [Q], first best row).
  """
  pool_hat_NxD = normalize(pool_NxD)
  out = {k: [] for k in ("hit", "tie", "order_insensitive_hit", "top_row")}
  for start in range(0, len(queries_QxD), chunk):
    sims_QxN = normalize(queries_QxD[start:start + chunk]) @ pool_hat_NxD.T
    best_Q = sims_QxN.max(1)
    top_QxN = sims_QxN >= best_Q[:, None] - tie_tolerance
    key_Q = target_key_Q[start:start + chunk]
    set_key_Q = target_set_key_Q[start:start + chunk]
    is_target_QxN = pool_key_N[None, :] == key_Q[:, None]
    same_set_QxN = pool_set_key_N[None, :] == set_key_Q[:, None]
    hit_Q = ~np.any(top_QxN & ~is_target_QxN, axis=1)
    out["hit"].append(hit_Q)
    out["tie"].append(np.any(top_QxN & is_target_QxN, axis=1) & ~hit_Q)
    out["order_insensitive_hit"].append(~np.any(top_QxN & ~same_set_QxN, axis=1))
    out["top_row"].append(sims_QxN.argmax(1))
  return {k: np.concatenate(v) if v else np.zeros((0,), bool) for k, v in out.items()}


def scene_keys(ids_NxK):
  """Integer keys of ordered scenes and of their unordered multisets (rows of object ids)."""
  ids_NxK = np.asarray(ids_NxK)
  _, ordered_N = np.unique(ids_NxK, axis=0, return_inverse=True)
  _, unordered_N = np.unique(np.sort(ids_NxK, axis=1), axis=0, return_inverse=True)
  return ordered_N.reshape(-1), unordered_N.reshape(-1)


def value_name(embedding_set, concept, value):
  names = getattr(embedding_set, "value_names", None)
  if names and concept < len(names) and value < len(names[concept]):
    return str(names[concept][value])
  return str(int(value))


def refuse_existing(paths, overwrite):
  """ValueError when an output exists and overwriting was not asked for."""
  existing = [p for p in paths if os.path.exists(p)]
  if existing and not overwrite:
    raise ValueError(f"output already exists: {existing[0]}; pass overwrite=True "
                     "(--overwrite) to replace it")
