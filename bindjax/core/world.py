"""Synthetic object world (docs/world.md): the object space, its ids and token layout. Its
coverage splits are `bindjax.core.coverage_splits`'.

An object is a tuple of values (v_0, …, v_{C-1}) with v_c < V_c. Its id is mixed-radix
little-endian, `id = Σ_c v_c Π_{c'<c} V_c'` (= Σ_c v_c V^c for equal V). Concept token of value v of
concept c is `offset[c] + v` with `offset[c] = Σ_{c'<c} V_c'` (= c·V + v for equal V); the special
tokens SOO, EOO, EOS, PAD follow the concept tokens.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

# Operations that materialise every object (splits, permutations, presence tables) refuse spaces
# above this size; ids themselves must fit in int32 (jax's default integer).
MAX_ENUMERABLE_OBJECTS = 1 << 24
_MAX_INT32_OBJECTS = (1 << 31) - 1


def _is_jax(x):
  return isinstance(x, jax.Array)


def _xp(*arrays):
  """numpy for numpy/python inputs, jax.numpy as soon as one input is a jax array or tracer."""
  return jnp if any(_is_jax(a) for a in arrays) else np


def check_positive_int(name, value, minimum=1):
  """int(value); ValueError naming `name` unless it is an integer >= minimum."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


@dataclasses.dataclass(frozen=True)
class ObjectSpace:
  """C concepts with V_c values each and up to K objects per scene. Hashable (static jit arg)."""
  values_per_concept: tuple[int, ...]
  max_objects: int

  def __post_init__(self):
    values = self.values_per_concept
    if isinstance(values, (int, np.integer)) or not hasattr(values, "__iter__"):
      raise ValueError(
          f"values_per_concept must be a sequence of per-concept value counts, got {values!r} "
          "(use ObjectSpace.uniform(num_concepts, num_values, max_objects) for equal V)")
    values = tuple(values)
    if not values:
      raise ValueError("values_per_concept must name at least one concept (C >= 1), got ()")
    values = tuple(check_positive_int(f"values_per_concept[{c}] (V_{c})", v)
                   for c, v in enumerate(values))
    object.__setattr__(self, "values_per_concept", values)
    object.__setattr__(self, "max_objects",
                       check_positive_int("max_objects (K)", self.max_objects))

  @classmethod
  def uniform(cls, num_concepts, num_values, max_objects):
    """C concepts with the same number of values V each."""
    num_concepts = check_positive_int("num_concepts (C)", num_concepts)
    num_values = check_positive_int("num_values (V)", num_values)
    return cls((num_values,) * num_concepts, max_objects)

  @classmethod
  def create(cls, values_per_concept, max_objects, num_concepts=None):
    """From an int (equal V; needs num_concepts) or a per-concept sequence, checked against C."""
    if isinstance(values_per_concept, (int, np.integer)):
      if num_concepts is None:
        raise ValueError(
            f"values_per_concept={values_per_concept} is a single V: num_concepts is required")
      return cls.uniform(num_concepts, values_per_concept, max_objects)
    values = tuple(values_per_concept)
    if num_concepts is not None and len(values) != num_concepts:
      raise ValueError(
          f"inconsistent per-concept values: num_concepts={num_concepts} but values_per_concept="
          f"{list(values)} has {len(values)} entries")
    return cls(values, max_objects)

  # Sizes -------------------------------------------------------------------------------------
  @property
  def num_concepts(self):
    return len(self.values_per_concept)

  @property
  def num_objects(self):
    """|O| = Π V_c."""
    return math.prod(self.values_per_concept)

  @property
  def num_concept_tokens(self):
    return sum(self.values_per_concept)

  @property
  def concept_token_offsets(self):
    """Token of value v of concept c is offsets[c] + v."""
    return tuple(int(o) for o in np.cumsum((0,) + self.values_per_concept[:-1]))

  @property
  def soo_token(self):
    return self.num_concept_tokens

  @property
  def eoo_token(self):
    return self.num_concept_tokens + 1

  @property
  def eos_token(self):
    return self.num_concept_tokens + 2

  @property
  def pad_token(self):
    return self.num_concept_tokens + 3

  @property
  def vocab_size(self):
    return self.num_concept_tokens + 4

  @property
  def object_length(self):
    """Tokens per object in a scene: SOO, C concept tokens, EOO."""
    return self.num_concepts + 2

  @property
  def scene_length(self):
    """L = (C+2)·K + 1."""
    return self.object_length * self.max_objects + 1

  @property
  def query_length(self):
    """Lq = C + 3 (an object query: SOO, C tokens, EOO, EOS)."""
    return self.num_concepts + 3

  @property
  def radix(self):
    """Π_{c'<c} V_c' for each concept c (little-endian mixed radix)."""
    return tuple(int(r) for r in np.cumprod((1,) + self.values_per_concept[:-1]))

  def check_enumerable(self, operation, limit=MAX_ENUMERABLE_OBJECTS):
    """Raises ValueError when |O| is too large to materialise for `operation`."""
    if self.num_objects > limit:
      raise ValueError(
          f"object space too large for {operation}: |O| = {self.num_objects:,} objects "
          f"(values_per_concept={list(self.values_per_concept)}) exceeds the limit of {limit:,}")

  def _check_ids_fit(self, operation):
    self.check_enumerable(operation, _MAX_INT32_OBJECTS)

  # Ids <-> values ----------------------------------------------------------------------------
  def object_values(self, ids):
    """Object ids [...] -> values [..., C] (int32; numpy in, numpy out; jax in, jax out)."""
    self._check_ids_fit("object ids")
    xp = _xp(ids)
    ids = xp.asarray(ids)
    if xp is np:
      if ids.dtype.kind not in "iu":
        raise ValueError(f"object ids must be integers, got dtype {ids.dtype}")
      if ids.size and (ids.min() < 0 or ids.max() >= self.num_objects):
        raise ValueError(f"object ids must lie in [0, {self.num_objects}), got range "
                         f"[{ids.min()}, {ids.max()}]")
    radix = xp.asarray(self.radix, dtype=xp.int32)
    values = xp.asarray(self.values_per_concept, dtype=xp.int32)
    return ((ids.astype(xp.int32)[..., None] // radix) % values).astype(xp.int32)

  def object_ids(self, values):
    """Values [..., C] -> object ids [...] (int32)."""
    self._check_ids_fit("object ids")
    xp = _xp(values)
    values = xp.asarray(values)
    if values.shape[-1:] != (self.num_concepts,):
      raise ValueError(f"object values must have a last axis of size C={self.num_concepts}, "
                       f"got shape {values.shape}")
    if xp is np:
      if values.dtype.kind not in "iu":
        raise ValueError(f"object values must be integers, got dtype {values.dtype}")
      bad = (values < 0) | (values >= np.asarray(self.values_per_concept))
      if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"object value {int(values[where])} at index {where} is outside [0, V_c) for "
            f"values_per_concept={list(self.values_per_concept)}")
    radix = xp.asarray(self.radix, dtype=xp.int32)
    return (values.astype(xp.int32) * radix).sum(-1).astype(xp.int32)

  def all_objects(self):
    """Values of every object in id order, [|O|, C] int32 (numpy)."""
    self.check_enumerable("all_objects")
    return self.object_values(np.arange(self.num_objects, dtype=np.int32))

  # Token sequences ---------------------------------------------------------------------------
  def concept_tokens(self, values):
    """Values [..., C] -> concept tokens [..., C]."""
    xp = _xp(values)
    offsets = xp.asarray(self.concept_token_offsets, dtype=xp.int32)
    return (xp.asarray(values).astype(xp.int32) + offsets).astype(xp.int32)

  def scene_tokens(self, objects, num_objects):
    """Objects [..., K, C] (values) and counts [...] -> scene tokens [..., L].

    Each of the first `num_objects` objects becomes [SOO, tok_0, …, tok_{C-1}, EOO]; then EOS,
    then PAD up to L. Slots at or beyond the count are ignored (they may hold anything, e.g. -1).
    """
    xp = _xp(objects, num_objects)
    objects = xp.asarray(objects)
    num_objects = xp.asarray(num_objects)
    k, c = self.max_objects, self.num_concepts
    if objects.shape[-2:] != (k, c):
      raise ValueError(f"scene objects must have trailing shape (K, C) = ({k}, {c}), "
                       f"got {objects.shape}")
    lead = objects.shape[:-2]
    concept_toks = self.concept_tokens(xp.maximum(objects, 0))
    soo = xp.full(lead + (k, 1), self.soo_token, dtype=xp.int32)
    eoo = xp.full(lead + (k, 1), self.eoo_token, dtype=xp.int32)
    body = xp.concatenate([soo, concept_toks, eoo], axis=-1).reshape(lead + (k * (c + 2),))
    body = xp.concatenate([body, xp.full(lead + (1,), self.pad_token, xp.int32)], axis=-1)
    position = xp.arange(self.scene_length, dtype=xp.int32)
    end = (num_objects.astype(xp.int32) * (c + 2))[..., None]
    tokens = xp.where(position < end, body,
                      xp.where(position == end, self.eos_token, self.pad_token))
    return tokens.astype(xp.int32)

  def object_query_tokens(self, ids):
    """Object ids [N] -> object queries [N, Lq]: [SOO, tok_0, …, tok_{C-1}, EOO, EOS]."""
    xp = _xp(ids)
    toks = self.concept_tokens(self.object_values(ids))
    lead = toks.shape[:-1]
    return xp.concatenate([
        xp.full(lead + (1,), self.soo_token, xp.int32), toks,
        xp.full(lead + (1,), self.eoo_token, xp.int32),
        xp.full(lead + (1,), self.eos_token, xp.int32)], axis=-1).astype(xp.int32)

  def concept_query_tokens(self):
    """Every concept token as a query [Σ V_c, Lq]: [tok, EOS, PAD, …], concept-major (numpy)."""
    out = np.full((self.num_concept_tokens, self.query_length), self.pad_token, np.int32)
    out[:, 0] = np.arange(self.num_concept_tokens)
    out[:, 1] = self.eos_token
    return out

  def token_concepts(self):
    """(concept, value) of each concept token, two int32 arrays [Σ V_c]."""
    concept = np.repeat(np.arange(self.num_concepts), self.values_per_concept).astype(np.int32)
    value = (np.arange(self.num_concept_tokens) -
             np.asarray(self.concept_token_offsets)[concept]).astype(np.int32)
    return concept, value

  def decode_scene(self, tokens):
    """Scene tokens [L] -> object values [n, C] (numpy); raises ValueError on malformed input."""
    tokens = np.asarray(tokens)
    if tokens.shape != (self.scene_length,):
      raise ValueError(f"scene tokens must have shape ({self.scene_length},), got {tokens.shape}")
    c = self.num_concepts
    objects = []
    pos = 0
    while pos < self.scene_length and tokens[pos] == self.soo_token:
      chunk = tokens[pos:pos + c + 2]
      if len(chunk) != c + 2 or chunk[-1] != self.eoo_token:
        raise ValueError(f"malformed object at position {pos} of scene {tokens.tolist()}")
      values = chunk[1:-1] - np.asarray(self.concept_token_offsets)
      if (values < 0).any() or (values >= np.asarray(self.values_per_concept)).any():
        raise ValueError(f"concept token out of place at position {pos} of {tokens.tolist()}")
      objects.append(values)
      pos += c + 2
    if pos >= self.scene_length or tokens[pos] != self.eos_token:
      raise ValueError(f"expected EOS at position {pos} of scene {tokens.tolist()}")
    if (tokens[pos + 1:] != self.pad_token).any():
      raise ValueError(f"expected PAD after EOS in scene {tokens.tolist()}")
    return np.asarray(objects, np.int32).reshape(len(objects), c)
