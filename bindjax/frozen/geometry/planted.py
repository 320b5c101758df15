"""Synthetic embedding sets with a planted binding structure, for tests and sanity checks.

Scenes: optionally every object alone (first), then every ordered pair of objects including
identical ones, row-major over objects in bindjax.core.world's id order (object index =
Σ_c v_c Π_{c'<c} V_c', docs/world.md).
Kinds of 2-object embeddings (a shared offset vector is added to every scene):
- "position_dependent":   z = u_0[o1] + u_1[o2]        (object vectors per slot)
- "position_independent": z = u[o1] + u[o2]            (the two orders of a scene coincide)
- "concept_additive":     z = Σ_slot Σ_c T_{slot,c}[v]  (no object-specific part)
- "product":              z = u_0[o1] ⊙ u_1[o2]        (binding by elementwise product)
Single-object scenes embed as the object's slot-0 vector (its concept sum for concept_additive).
"""
import numpy as np

from bindjax.core import coverage_splits
from bindjax.core import world
from bindjax.frozen import embeddings

KINDS = ("position_dependent", "position_independent", "concept_additive", "product")


def planted_set(kind, values_per_concept=(4, 3), dim=32, noise=0.0, single_objects=True, seed=0,
                offset_scale=1.0):
  """An EmbeddingSet of `kind` (see module docstring); `noise` is the std of added N(0, σ²)."""
  if kind not in KINDS:
    raise ValueError(f"planted kind {kind!r}: expected one of {KINDS}")
  rng = np.random.RandomState(seed)
  values_per_concept = tuple(int(v) for v in values_per_concept)
  objects_UxC = world.ObjectSpace(values_per_concept, 2).all_objects()
  num_u = len(objects_UxC)
  u_2xUxD = rng.normal(size=(2, num_u, dim))
  if kind == "position_independent":
    u_2xUxD[1] = u_2xUxD[0]
  if kind == "concept_additive":
    tables = [rng.normal(size=(2, v, dim)) for v in values_per_concept]
    u_2xUxD = sum(t[:, objects_UxC[:, c]] for c, t in enumerate(tables))
  offset_D = offset_scale * rng.normal(size=dim)
  pairs_Px2 = np.stack(coverage_splits.ordered_pairs(num_u), axis=1)
  if kind == "product":
    two_PxD = u_2xUxD[0, pairs_Px2[:, 0]] * u_2xUxD[1, pairs_Px2[:, 1]]
  else:
    two_PxD = u_2xUxD[0, pairs_Px2[:, 0]] + u_2xUxD[1, pairs_Px2[:, 1]]
  scenes = [[objects_UxC[a].tolist(), objects_UxC[b].tolist()] for a, b in pairs_Px2]
  rows = [two_PxD]
  if single_objects:
    scenes = [[o.tolist()] for o in objects_UxC] + scenes
    rows = [u_2xUxD[0]] + rows
  z_NxD = np.concatenate(rows) + offset_D
  if noise:
    z_NxD = z_NxD + noise * rng.normal(size=z_NxD.shape)
  return embeddings.EmbeddingSet.from_scenes(
      z_NxD.astype(np.float32), scenes, values_per_concept, max_objects=2,
      value_names=[[f"c{c}v{v}" for v in range(n)] for c, n in enumerate(values_per_concept)],
      provenance={"source": "planted", "kind": kind, "noise": noise, "seed": seed})
