"""Coverage splits of an object space (docs/world.md#coverage-splits): training objects are the
first n_train of a seeded permutation of every object id, the rest are held out.

Split files: docs/file_formats.md#split-files.
"""
import dataclasses
import math
import os
import re
import zipfile

import numpy as np

from bindjax.base import files
from bindjax.core import world


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
      return world.ObjectSpace(self.values_per_concept, 1)
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
    data = _read_split_arrays(path)
    train = np.asarray(data["train_object_ids"]).reshape(-1)
    test = np.asarray(data["test_object_ids"]).reshape(-1)
    values = _values_per_concept(data, space, path)
    space = world.ObjectSpace(values, 1)
    ids = np.concatenate([train, test])
    _check_split_ids(data, space, train, test, path)
    seed, coverage = _seed_and_coverage(data, path, train.size / ids.size)
    if train.size == 0:
      raise ValueError(f"split file {path}: no training objects")
    return cls(ids.astype(np.int32), int(train.size), coverage, seed, tuple(values))


def _read_split_arrays(path):
  """{name: array} of a split file, with its four id and object arrays checked present and
  integer."""
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
  return data


def _values_per_concept(data, space, path):
  """The split's values per concept: the file's (checked against `space` when given), else
  the space's."""
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
  return values


def _check_split_ids(data, space, train, test, path):
  """ValueError unless the train and test ids cover every object id once and the stored
  objects (value tuples) are those ids'."""
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
                       f"(shape {objects.shape}, "
                       f"values_per_concept={list(space.values_per_concept)})")


def _seed_and_coverage(data, path, train_share):
  """(seed, coverage) from the file's scalars, else from its name, else (-1, train_share)."""
  match = re.search(r"seed(-?\d+)_frac([0-9.]+?)\.npz$", os.path.basename(path))
  seed = int(data["seed"]) if "seed" in data else (int(match.group(1)) if match else -1)
  coverage_key = next((k for k in ("coverage", "frac", "fraction") if k in data), None)
  if coverage_key is not None:
    coverage = float(data[coverage_key])
  elif match:
    coverage = float(match.group(2))
  else:
    coverage = train_share
  return seed, coverage


def split_filename(seed, coverage):
  """The reference code's split file name, `object_split_seed{S}_frac{F:.4f}.npz`."""
  return f"object_split_seed{int(seed)}_frac{float(coverage):.4f}.npz"


def coverage_split(space, coverage, seed):
  """RandomState(seed).permutation(|O|); its first n_train ids are the training objects.

  See docs/world.md#coverage-splits.
  """
  space.check_enumerable("coverage_split")
  coverage = check_coverage(coverage)
  seed = world.check_positive_int("seed", seed, minimum=0)
  num_train = num_train_objects(space.num_objects, coverage)
  permutation = np.random.RandomState(seed).permutation(space.num_objects).astype(np.int32)
  return CoverageSplit(permutation, num_train, coverage, seed, space.values_per_concept)
