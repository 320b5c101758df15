"""Binding-function approximators (docs/complexity.md, "Approximators"): functions of a scene's
concept indices.

A scene of K objects and C concepts has K·C slots; slot s = k·C + c holds the value of concept c
of object k and has its own learned table of E-wide embeddings (init N(0,1)). Families:

  mlp                 concat(e_0..e_{S-1}) -> [ReLU(Linear(w)) for w in widths] -> Linear(D)
  additive            Σ_s e_s -> Linear(D)
  product             (e_0·W) ⊙ e_1 ⊙ … ⊙ e_{S-1} -> Linear(D), W = I or learned
  sum_product         concat(product, Σ_s e'_s) (e' separate tables) -> Linear(D)
  per_object_product  Σ_k Π_c e_{k·C+c} -> Linear(D)
  per_object_sum_product
                      Σ_k (Σ_c a_{k·C+c} + (b_{k·C}·W) ⊙ Π_{c≥1} b_{k·C+c}) -> Linear(D)
                      (a: separate tables; W = I or learned, shared by the objects)

Each `Approximator` is static (hashable) and exposes pure `init(key)` / `apply(params, values)`,
so a batch of models of equal shapes is one `jax.vmap` over stacked params.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp

from bindjax.base import config_values

FAMILIES = ("mlp", "additive", "product", "sum_product", "per_object_product",
            "per_object_sum_product")
# Families with a second set of slot tables (the additive part) and with an optional learned W.
_SUM_TABLES = ("sum_product", "per_object_sum_product")
_HAS_W = ("product", "sum_product", "per_object_sum_product")
# Slot embedding width E of every family unless set; 0 means the embedding width D.
EMBED_DIM = 0


@dataclasses.dataclass(frozen=True)
class Approximator:
  """One approximator's static structure: family, widths and the shapes of its data."""
  family: str
  values_per_concept: tuple
  max_objects: int
  out_dim: int
  widths: tuple = ()          # MLP hidden widths
  embed_dim: int = EMBED_DIM  # slot embedding width E
  learned_w: bool = False     # families with W: learn W (init I) instead of W = I

  def __post_init__(self):
    object.__setattr__(self, "values_per_concept", tuple(int(v) for v in self.values_per_concept))
    object.__setattr__(self, "widths", tuple(int(w) for w in self.widths))
    self.validate()

  def validate(self):
    if self.family not in FAMILIES:
      raise ValueError(f"family={self.family!r}: expected one of {FAMILIES}")
    if not self.values_per_concept or min(self.values_per_concept) < 1:
      raise ValueError(f"values_per_concept={self.values_per_concept}: expected C ≥ 1 positive "
                       f"counts")
    if self.max_objects < 1 or self.out_dim < 1 or self.embed_dim < 0:
      raise ValueError(f"max_objects={self.max_objects}, out_dim={self.out_dim}, embed_dim="
                       f"{self.embed_dim}: expected positive sizes")
    if self.family == "mlp" and (not self.widths or min(self.widths) < 1):
      raise ValueError(f"widths={self.widths}: the mlp family needs ≥ 1 positive hidden width")
    if self.family != "mlp" and self.widths:
      raise ValueError(f"widths={self.widths}: only the mlp family has hidden widths")
    if self.learned_w and self.family not in _HAS_W:
      raise ValueError(f"learned_w=True: only {', '.join(_HAS_W)} have W")

  @property
  def name(self):
    """Short label, e.g. "mlp[1024]", "product", "product(W)"."""
    if self.family == "mlp":
      return f"mlp[{','.join(map(str, self.widths))}]"
    return self.family + ("(W)" if self.learned_w else "")

  @property
  def num_slots(self):
    return self.max_objects * len(self.values_per_concept)

  @property
  def width(self):
    return self.embed_dim or self.out_dim

  def _slot_values(self):
    return self.values_per_concept * self.max_objects

  def _head_in(self):
    e = self.width
    return {"mlp": self.widths[-1] if self.widths else 0, "additive": e, "product": e,
            "sum_product": 2 * e, "per_object_product": e,
            "per_object_sum_product": e}[self.family]

  def init(self, key):
    """Parameters of one model: slot tables N(0,1) [S, max V, E], torch-Linear-style layers."""
    keys = iter(jax.random.split(key, 8 + len(self.widths)))
    v_max = max(self.values_per_concept)
    shape = (self.num_slots, v_max, self.width)
    params = {"tables": jax.random.normal(next(keys), shape, jnp.float32)}
    if self.family in _SUM_TABLES:
      params["sum_tables"] = jax.random.normal(next(keys), shape, jnp.float32)
    if self.learned_w:
      params["w"] = jnp.eye(self.width, dtype=jnp.float32)
    if self.family == "mlp":
      fan_in = self.num_slots * self.width
      params["hidden"] = []
      for w in self.widths:
        params["hidden"].append(_linear(next(keys), fan_in, w))
        fan_in = w
    params["out"] = _linear(next(keys), self._head_in(), self.out_dim)
    return params

  def apply(self, params, values_NxKxC):
    """Predicted embeddings [N, D] for scenes given as value indices [N, K, C]."""
    n = values_NxKxC.shape[0]
    slots_NxS = values_NxKxC.reshape(n, self.num_slots)
    e_NxSxE = _lookup(params["tables"], slots_NxS)
    if self.family == "mlp":
      h = e_NxSxE.reshape(n, -1)
      for layer in params["hidden"]:
        h = jax.nn.relu(h @ layer["kernel"] + layer["bias"])
    elif self.family == "additive":
      h = e_NxSxE.sum(1)
    elif self.family in ("product", "sum_product"):
      first_NxE = e_NxSxE[:, 0] @ params["w"] if self.learned_w else e_NxSxE[:, 0]
      h = first_NxE * jnp.prod(e_NxSxE[:, 1:], axis=1)
      if self.family == "sum_product":
        h = jnp.concatenate([h, _lookup(params["sum_tables"], slots_NxS).sum(1)], axis=-1)
    else:  # per-object families
      e_NxKxCxE = e_NxSxE.reshape(n, self.max_objects, len(self.values_per_concept), -1)
      if self.learned_w:
        e_NxKxCxE = e_NxKxCxE.at[:, :, 0].set(e_NxKxCxE[:, :, 0] @ params["w"])
      h = e_NxKxCxE.prod(axis=2).sum(axis=1)
      if self.family == "per_object_sum_product":
        h = h + _lookup(params["sum_tables"], slots_NxS).sum(1)
    return h @ params["out"]["kernel"] + params["out"]["bias"]

  def num_parameters(self):
    """Learned parameters of one model (padded table rows excluded; fixed W = I not counted)."""
    tables = sum(self._slot_values()) * self.width
    count = tables * (2 if self.family in _SUM_TABLES else 1)
    count += self.width ** 2 if self.learned_w else 0
    fan_in = self.num_slots * self.width
    for w in self.widths:
      count += fan_in * w + w
      fan_in = w
    return count + self._head_in() * self.out_dim + self.out_dim


def _linear(key, fan_in, fan_out):
  bound = 1.0 / math.sqrt(fan_in)
  k_key, b_key = jax.random.split(key)
  return {"kernel": jax.random.uniform(k_key, (fan_in, fan_out), jnp.float32, -bound, bound),
          "bias": jax.random.uniform(b_key, (fan_out,), jnp.float32, -bound, bound)}


def _lookup(tables_SxVxE, slots_NxS):
  return tables_SxVxE[jnp.arange(tables_SxVxE.shape[0])[None, :], slots_NxS]


def make(family, values_per_concept, max_objects, out_dim, widths=(), embed_dim=EMBED_DIM,
         learned_w=False):
  """Approximator from plain values (config-friendly)."""
  return Approximator(family=family, values_per_concept=tuple(values_per_concept),
                      max_objects=int(max_objects), out_dim=int(out_dim),
                      widths=tuple(widths or ()), embed_dim=int(embed_dim or 0),
                      learned_w=bool(learned_w))


def parse_models(spec, values_per_concept, max_objects, out_dim, embed_dim=EMBED_DIM):
  """Approximators from a tuple of names (or a comma list) such as
  ("mlp:1024", "mlp:512x512", "additive", "product:W").

  Items: mlp:W1xW2.. (hidden widths), or a family name with an optional ":W" (learned W).
  Raises ValueError naming the bad item.
  """
  models = []
  for item in config_values.names(spec, "models"):
    family, _, option = item.partition(":")
    try:
      if family == "mlp":
        widths = tuple(int(w) for w in option.split("x")) if option else ()
        models.append(make("mlp", values_per_concept, max_objects, out_dim, widths, embed_dim))
      else:
        if option not in ("", "W"):
          raise ValueError(f"option {option!r}: only ':W' (learned W) is known")
        models.append(make(family, values_per_concept, max_objects, out_dim, (), embed_dim,
                           learned_w=option == "W"))
    except ValueError as e:
      raise ValueError(f"models item {item!r}: {e}") from None
  if not models:
    raise ValueError(f"models={spec!r}: expected at least one approximator")
  return models


def one_hot_slots(values_NxKxC, values_per_concept):
  """[N, Σ_slots V] one-hot features of every slot (for tree approximators)."""
  n, k, c = values_NxKxC.shape
  parts = [jax.nn.one_hot(values_NxKxC[:, i, j], values_per_concept[j])
           for i in range(k) for j in range(c)]
  return jnp.concatenate(parts, axis=-1)
