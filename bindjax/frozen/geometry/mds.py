"""MDS geometry of attribute/shape quadruples (docs/geometry.md#mds).

A quadruple names two attributes a, b and two shapes x, y. Its points, all from the centred
2-object embeddings (mean of the 2-object scenes removed): attribute means (scenes holding the
attribute), shape means, the object estimates of a-x, b-y, a-y, b-x from an object bank (pos-avg:
the slot each object takes in its composite), both composites (scenes [a-x, b-y] and its binding
swap [a-y, b-x]) and their additive sums (sum of the two object estimates). Metric MDS to 3-D on
the cosine distances (scikit-learn, precomputed dissimilarities, fixed random_state).
"""
import dataclasses
import inspect

import numpy as np
from sklearn import manifold

from bindjax.frozen.geometry import common

KINDS = ("attribute", "shape", "object", "composite", "sum")


@dataclasses.dataclass(frozen=True)
class MdsConfig:
  """Settings of the quadruple MDS."""
  quadruples: tuple = ()      # "a,b,x,y" specs, for a run given no quadruple of its own
  bank: str = "pos-avg"       # the bank of the object estimates
  random_state: int = 0
  n_init: int = 4             # MDS initialisations; the lowest stress is kept
  attribute_concept: int = common.ATTRIBUTE_CONCEPT
  shape_concept: int = common.SHAPE_CONCEPT


@dataclasses.dataclass(frozen=True)
class Quadruple:
  attributes: tuple   # (a, b) values of the attribute concept
  shapes: tuple       # (x, y) values of the shape concept

  def label(self, embedding_set, attribute_concept, shape_concept):
    names = [common.value_name(embedding_set, attribute_concept, v) for v in self.attributes]
    names += [common.value_name(embedding_set, shape_concept, v) for v in self.shapes]
    return "-".join(names)


def _value(embedding_set, concept, token, role):
  num_values = int(embedding_set.values_per_concept[concept])
  names = list((getattr(embedding_set, "value_names", None) or [[]] * (concept + 1))[concept] or [])
  token = str(token).strip()
  if token in names:
    return names.index(token)
  if token.lstrip("-").isdigit() and 0 <= int(token) < num_values:
    return int(token)
  known = names if names else list(range(num_values))
  raise ValueError(f"quadruple {role} {token!r}: the embedding set has no such value of concept "
                   f"{concept}; expected one of {known}")


def parse_quadruple(embedding_set, spec, config=MdsConfig()):
  """Quadruple from "a,b,x,y" (value names or indices) or a 4-sequence; the attribute and shape
  concepts are the config's."""
  parts = spec.split(",") if isinstance(spec, str) else list(spec)
  if len(parts) != 4:
    raise ValueError(f"quadruple {spec!r}: expected 4 values 'attribute_a,attribute_b,shape_x,"
                     "shape_y'")
  a, b = (_value(embedding_set, config.attribute_concept, p, "attribute") for p in parts[:2])
  x, y = (_value(embedding_set, config.shape_concept, p, "shape") for p in parts[2:])
  if a == b or x == y:
    raise ValueError(f"quadruple {spec!r}: expected two different attributes and two different "
                     "shapes")
  return Quadruple((a, b), (x, y))


@dataclasses.dataclass(frozen=True)
class Context:
  """What every quadruple of one set and config needs (build once with `context`)."""
  embedding_set: object
  config: MdsConfig
  values_Nx2xC: np.ndarray
  centred_NxD: np.ndarray
  bank_vectors: common.ObjectBank
  bank_centre_D: np.ndarray
  object_of: dict
  scene_row: dict


def context(embedding_set, config=MdsConfig()):
  """Validates the set and the config's bank and concepts for quadruples and precomputes the
  shared pieces."""
  if len(embedding_set.values_per_concept) != 2:
    raise ValueError(f"MDS quadruples need objects of exactly 2 concepts (attribute, shape); the "
                     f"set has values_per_concept={tuple(embedding_set.values_per_concept)}")
  if sorted((config.attribute_concept, config.shape_concept)) != [0, 1]:
    raise ValueError(f"attribute_concept={config.attribute_concept}, shape_concept="
                     f"{config.shape_concept}: expected 0 and 1 in some order")
  bank = config.bank
  index = common.scene_index(embedding_set)
  common.check_banks([bank], index)
  embeddings_AxD = np.asarray(embedding_set.embeddings, np.float64)
  mean_D = embeddings_AxD[index.rows_N].mean(0)
  centre_D = (embeddings_AxD[index.single_rows_S].mean(0) if bank == "single-object" else mean_D)
  return Context(
      embedding_set=embedding_set, config=config, values_Nx2xC=index.unique_UxC[index.ids_Nx2],
      centred_NxD=embeddings_AxD[index.rows_N] - mean_D,
      bank_vectors=common.object_bank(bank, index, embeddings_AxD), bank_centre_D=centre_D,
      object_of={tuple(int(t) for t in u): i for i, u in enumerate(index.unique_UxC)},
      scene_row={tuple(int(i) for i in ids): n for n, ids in enumerate(index.ids_Nx2)})


def quadruple_points(embedding_set, quadruple, config=MdsConfig(), ctx=None):
  """(labels, kinds, vectors [12, D]) of a quadruple; ValueError naming anything the set lacks.

  Pass `ctx=context(...)` to reuse the precomputed pieces across quadruples (its config is used).
  """
  ctx = ctx or context(embedding_set, config)
  attr_c, shape_c = ctx.config.attribute_concept, ctx.config.shape_concept
  (a, b), (x, y) = quadruple.attributes, quadruple.shapes
  name = lambda c, v: common.value_name(ctx.embedding_set, c, v)
  labels, kinds, vectors = [], [], []

  def mean_of(concept, value, role):
    rows = np.any(ctx.values_Nx2xC[:, :, concept] == value, axis=1)
    if not rows.any():
      raise ValueError(f"quadruple {role} {name(concept, value)!r}: no 2-object scene holds it")
    return ctx.centred_NxD[rows].mean(0)

  for v in (a, b):
    labels.append(name(attr_c, v)); kinds.append("attribute")
    vectors.append(mean_of(attr_c, v, "attribute"))
  for v in (x, y):
    labels.append(name(shape_c, v)); kinds.append("shape")
    vectors.append(mean_of(shape_c, v, "shape"))

  def object_id(attribute, shape):
    values = [0, 0]
    values[attr_c], values[shape_c] = attribute, shape
    oid = ctx.object_of.get(tuple(values))
    if oid is None:
      raise ValueError(f"quadruple object {name(attr_c, attribute)} {name(shape_c, shape)}: "
                       "not in the embedding set")
    return oid

  composites = [((a, x), (b, y)), ((a, y), (b, x))]
  estimates = {}
  for pair in composites:
    for slot, (attribute, shape) in enumerate(pair):
      oid = object_id(attribute, shape)
      table_UxD, present_U = ctx.bank_vectors.slot(slot)
      if not present_U[oid]:
        raise ValueError(f"quadruple object {name(attr_c, attribute)} {name(shape_c, shape)}: "
                         f"bank {ctx.config.bank!r} has no estimate for it in slot {slot}")
      estimates[(attribute, shape)] = table_UxD[oid] - ctx.bank_centre_D
  for attribute, shape in (pair[s] for pair in composites for s in (0, 1)):
    labels.append(f"{name(attr_c, attribute)} {name(shape_c, shape)}")
    kinds.append("object")
    vectors.append(estimates[(attribute, shape)])
  sums = []
  for pair in composites:
    ids = tuple(object_id(*obj) for obj in pair)
    text = " + ".join(f"{name(attr_c, o[0])} {name(shape_c, o[1])}" for o in pair)
    if ids not in ctx.scene_row:
      raise ValueError(f"quadruple composite scene [{text}]: not among the 2-object scenes")
    labels.append(text); kinds.append("composite")
    vectors.append(ctx.centred_NxD[ctx.scene_row[ids]])
    sums.append((f"sum({text})", estimates[pair[0]] + estimates[pair[1]]))
  for label, vector in sums:
    labels.append(label); kinds.append("sum"); vectors.append(vector)
  return labels, kinds, np.stack(vectors)


def cosine_distances(vectors_PxD):
  """1 − cosine similarity, symmetric, zero diagonal, clipped at 0."""
  hat_PxD = common.normalize(vectors_PxD)
  distances_PxP = np.clip(1.0 - hat_PxD @ hat_PxD.T, 0.0, 2.0)
  distances_PxP = 0.5 * (distances_PxP + distances_PxP.T)
  np.fill_diagonal(distances_PxP, 0.0)
  return distances_PxP


def metric_mds(distances_PxP, random_state, n_init, dims=3, max_iter=300):
  """Metric MDS of precomputed dissimilarities: (coords [P, dims], raw stress, Stress-1)."""
  params = inspect.signature(manifold.MDS).parameters
  kwargs = dict(n_components=dims, n_init=n_init, max_iter=max_iter, random_state=random_state)
  if "metric_mds" in params:   # scikit-learn ≥ 1.8 renamed dissimilarity -> metric
    kwargs.update(metric_mds=True, metric="precomputed", init="random", normalized_stress=False)
  else:
    kwargs.update(metric=True, dissimilarity="precomputed", normalized_stress=False)
  mds = manifold.MDS(**kwargs)
  coords_PxK = mds.fit_transform(distances_PxP)
  fitted_PxP = np.linalg.norm(coords_PxK[:, None] - coords_PxK[None], axis=-1)
  upper = np.triu_indices(len(distances_PxP), 1)
  denom = np.sum(distances_PxP[upper] ** 2)
  stress_1 = float(np.sqrt(np.sum((fitted_PxP[upper] - distances_PxP[upper]) ** 2) / denom)
                   if denom > 0 else 0.0)
  return coords_PxK, float(mds.stress_), stress_1


def run_mds(embedding_set, quadruple, config=MdsConfig(), ctx=None):
  """Points, cosine distances, 3-D coordinates and stress of one quadruple (JSON-ready dict).

  Pass `ctx=context(...)` to reuse the precomputed pieces across quadruples (its config is used).
  """
  ctx = ctx or context(embedding_set, config)
  config = ctx.config
  labels, kinds, vectors = quadruple_points(embedding_set, quadruple, ctx=ctx)
  distances = cosine_distances(vectors)
  coords, stress, stress_1 = metric_mds(distances, config.random_state, config.n_init)
  composite_rows = [i for i, k in enumerate(kinds) if k == "composite"]
  sum_rows = [i for i, k in enumerate(kinds) if k == "sum"]
  return {
      "quadruple": quadruple.label(embedding_set, config.attribute_concept,
                                   config.shape_concept),
      "attributes": list(quadruple.attributes), "shapes": list(quadruple.shapes),
      "bank": config.bank, "random_state": config.random_state,
      "points": [{"label": l, "kind": k, "coords": c.tolist()}
                 for l, k, c in zip(labels, kinds, coords)],
      "lines": [[s, c] for s, c in zip(sum_rows, composite_rows)],
      "sum_to_composite_cosine_distance": [float(distances[s, c])
                                           for s, c in zip(sum_rows, composite_rows)],
      "distances": distances.tolist(),
      "stress": stress, "stress_1": stress_1,
  }
