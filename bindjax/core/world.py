"""Synthetic object world and coverage splits (docs/world.md).

Split files: docs/file_formats.md#split-files.

An object is a tuple of values (v_0, …, v_{C-1}) with v_c < V_c. Its id is mixed-radix
little-endian, `id = Σ_c v_c Π_{c'<c} V_c'` (= Σ_c v_c V^c for equal V). Concept token of value v of
concept c is `offset[c] + v` with `offset[c] = Σ_{c'<c} V_c'` (= c·V + v for equal V); the special
tokens SOO, EOO, EOS, PAD follow the concept tokens.
"""
import dataclasses
import math
import os
import re
import zipfile

import jax
import jax.numpy as jnp
import numpy as np

from bindjax.base import files

# Operations that materialise every object (splits, permutations, presence tables) refuse spaces
# above this size; ids themselves must fit in int32 (jax's default integer).
MAX_ENUMERABLE_OBJECTS = 1 << 24
_MAX_INT32_OBJECTS = (1 << 31) - 1


def _is_jax(x):
  return isinstance(x, jax.Array)


def _xp(*arrays):
  """numpy for numpy/python inputs, jax.numpy as soon as one input is a jax array or tracer."""
  return jnp if any(_is_jax(a) for a in arrays) else np


def _check_positive_int(name, value, minimum=1):
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
    values = tuple(_check_positive_int(f"values_per_concept[{c}] (V_{c})", v)
                   for c, v in enumerate(values))
    object.__setattr__(self, "values_per_concept", values)
    object.__setattr__(self, "max_objects",
                       _check_positive_int("max_objects (K)", self.max_objects))

  @classmethod
  def uniform(cls, num_concepts, num_values, max_objects):
    """C concepts with the same number of values V each."""
    num_concepts = _check_positive_int("num_concepts (C)", num_concepts)
    num_values = _check_positive_int("num_values (V)", num_values)
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


# Coverage splits -----------------------------------------------------------------------------
def ordered_pairs(num_objects):
  """(first_P, second_P): every ordered pair of `num_objects` objects, identical ones included,
  row-major (pair p = first_P[p] * num_objects + second_P[p]); int numpy arrays."""
  return np.divmod(np.arange(num_objects * num_objects), num_objects)


def num_train_objects(num_objects, coverage):
  """min(max(1, int(|O|·ρ)), |O|-1) for ρ < 1; all objects for ρ = 1.

  See docs/world.md#coverage-splits.
  """
  coverage = check_coverage(coverage)
  if coverage == 1.0:
    return num_objects
  if num_objects < 2:
    raise ValueError(f"coverage={coverage} < 1 needs at least 2 objects, |O| = {num_objects}")
  return min(max(1, int(num_objects * coverage)), num_objects - 1)


def check_coverage(coverage):
  """Returns coverage as a float; ValueError unless it is a number in (0, 1]."""
  if isinstance(coverage, bool) or not isinstance(coverage, (int, float, np.number)):
    raise ValueError(f"coverage must be a number in (0, 1], got {coverage!r}")
  coverage = float(coverage)
  if not 0.0 < coverage <= 1.0:
    raise ValueError(f"coverage must lie in (0, 1], got {coverage}")
  return coverage


@dataclasses.dataclass(frozen=True, eq=False)
class CoverageSplit:
  """Train objects = permutation[:num_train], held-out = permutation[num_train:].

  A permutation plus a count, so splits of any coverage share shapes (one compile).
  """
  permutation: np.ndarray        # int32 [|O|]
  num_train: int
  coverage: float
  seed: int
  values_per_concept: tuple[int, ...] | None = None   # for save() and consistency checks

  def __post_init__(self):
    perm = np.asarray(self.permutation)
    if perm.ndim != 1 or perm.dtype.kind not in "iu":
      raise ValueError(f"permutation must be a 1-D integer array, got {perm.dtype} {perm.shape}")
    n = perm.shape[0]
    if not np.array_equal(np.sort(perm), np.arange(n)):
      raise ValueError(f"permutation must contain each object id 0..{n - 1} exactly once")
    if not 1 <= int(self.num_train) <= n:
      raise ValueError(f"num_train must lie in [1, {n}], got {self.num_train}")
    if self.values_per_concept is not None:
      values = tuple(int(v) for v in self.values_per_concept)
      if math.prod(values) != n:
        raise ValueError(f"inconsistent split: values_per_concept={list(values)} gives "
                         f"{math.prod(values)} objects but the permutation has {n}")
      object.__setattr__(self, "values_per_concept", values)
    object.__setattr__(self, "permutation", perm.astype(np.int32))
    object.__setattr__(self, "num_train", int(self.num_train))
    object.__setattr__(self, "coverage", float(self.coverage))
    object.__setattr__(self, "seed", int(self.seed))

  @property
  def num_objects(self):
    return int(self.permutation.shape[0])

  @property
  def num_heldout(self):
    return self.num_objects - self.num_train

  @property
  def train_ids(self):
    return self.permutation[:self.num_train]

  @property
  def heldout_ids(self):
    return self.permutation[self.num_train:]

  def train_mask(self):
    """bool [|O|]: object id is a training object."""
    mask = np.zeros(self.num_objects, bool)
    mask[self.train_ids] = True
    return mask

  def _space(self, space):
    if space is None:
      if self.values_per_concept is None:
        raise ValueError("this split does not know its values_per_concept: pass space=")
      return ObjectSpace(self.values_per_concept, 1)
    if space.num_objects != self.num_objects:
      raise ValueError(f"space with |O| = {space.num_objects} does not match a split over "
                       f"{self.num_objects} objects")
    return space

  def save(self, path, space=None):
    """Writes the split .npz atomically (temp file in the same directory + rename).

    Format: docs/file_formats.md#split-files.
    """
    space = self._space(space)
    path = os.fspath(path)
    if not path.endswith(".npz"):
      raise ValueError(f"split files end in .npz, got {path!r}")
    arrays = dict(
        train_object_ids=self.train_ids.astype(np.int64),
        test_object_ids=self.heldout_ids.astype(np.int64),
        train_objects=space.object_values(self.train_ids).astype(np.int64),
        test_objects=space.object_values(self.heldout_ids).astype(np.int64),
        seed=np.int64(self.seed), coverage=np.float64(self.coverage),
        num_train=np.int64(self.num_train), num_objects=np.int64(self.num_objects),
        num_concepts=np.int64(space.num_concepts),
        values_per_concept=np.asarray(space.values_per_concept, np.int64))
    with files.atomic_path(path) as tmp:
      np.savez(tmp, **arrays)

  @classmethod
  def load(cls, path, space=None):
    """Reads and validates a split file, ours or the reference code's.

    Format: docs/file_formats.md#split-files.

    values_per_concept comes from the file, else from `space`; seed and coverage from the file's
    scalars, else from the `object_split_seed{S}_frac{F}.npz` file name.
    """
    path = os.fspath(path)
    try:
      with np.load(path, allow_pickle=False) as f:
        data = {k: f[k] for k in f.files}
    except FileNotFoundError:
      raise
    except (OSError, ValueError, zipfile.BadZipFile) as e:
      raise ValueError(f"split file {path}: not a readable .npz file ({e})") from None
    for key in ("train_object_ids", "test_object_ids", "train_objects", "test_objects"):
      if key not in data:
        raise ValueError(f"split file {path}: missing array {key!r} (has {sorted(data)})")
      if data[key].dtype.kind not in "iu":
        raise ValueError(f"split file {path}: {key} must hold integers, got {data[key].dtype}")
    train = np.asarray(data["train_object_ids"]).reshape(-1)
    test = np.asarray(data["test_object_ids"]).reshape(-1)
    values = None
    if "values_per_concept" in data:
      values = tuple(int(v) for v in np.atleast_1d(data["values_per_concept"]))
      num_concepts = int(data["num_concepts"]) if "num_concepts" in data else len(values)
      if len(values) == 1 and num_concepts > 1:     # a single V stored for equal values
        values = values * num_concepts
      if len(values) != num_concepts:
        raise ValueError(f"split file {path}: inconsistent per-concept values: num_concepts="
                         f"{num_concepts} but values_per_concept={list(values)}")
    if space is not None:
      if values is not None and values != space.values_per_concept:
        raise ValueError(f"split file {path}: values_per_concept={list(values)} does not match "
                         f"the space's {list(space.values_per_concept)}")
      values = space.values_per_concept
    if values is None:
      raise ValueError(f"split file {path}: no values_per_concept stored; pass space=")
    space = ObjectSpace(values, 1)
    ids = np.concatenate([train, test])
    if ids.size != space.num_objects or not np.array_equal(np.sort(ids),
                                                           np.arange(space.num_objects)):
      raise ValueError(
          f"split file {path}: train ({train.size}) and test ({test.size}) ids must together "
          f"cover each of the {space.num_objects} object ids exactly once")
    for name, id_array in (("train", train), ("test", test)):
      objects = np.asarray(data[f"{name}_objects"])
      consistent = objects.shape == (id_array.size, space.num_concepts) and (
          (objects >= 0) & (objects < np.asarray(space.values_per_concept))).all()
      if not consistent or not np.array_equal(space.object_ids(objects), id_array):
        raise ValueError(f"split file {path}: {name}_objects do not match {name}_object_ids "
                         f"(shape {objects.shape}, values_per_concept={list(values)})")
    match = re.search(r"seed(-?\d+)_frac([0-9.]+?)\.npz$", os.path.basename(path))
    seed = int(data["seed"]) if "seed" in data else (int(match.group(1)) if match else -1)
    coverage_key = next((k for k in ("coverage", "frac", "fraction") if k in data), None)
    if coverage_key is not None:
      coverage = float(data[coverage_key])
    elif match:
      coverage = float(match.group(2))
    else:
      coverage = train.size / ids.size
    if train.size == 0:
      raise ValueError(f"split file {path}: no training objects")
    return cls(ids.astype(np.int32), int(train.size), coverage, seed, tuple(values))


def split_filename(seed, coverage):
  """The reference code's split file name, `object_split_seed{S}_frac{F:.4f}.npz`."""
  return f"object_split_seed{int(seed)}_frac{float(coverage):.4f}.npz"


def coverage_split(space, coverage, seed):
  """RandomState(seed).permutation(|O|); its first n_train ids are the training objects.

  See docs/world.md#coverage-splits.
  """
  space.check_enumerable("coverage_split")
  coverage = check_coverage(coverage)
  seed = _check_positive_int("seed", seed, minimum=0)
  num_train = num_train_objects(space.num_objects, coverage)
  permutation = np.random.RandomState(seed).permutation(space.num_objects).astype(np.int32)
  return CoverageSplit(permutation, num_train, coverage, seed, space.values_per_concept)
