"""EmbeddingSet: frozen scene embeddings with their scenes, validation and a native format.

Import it through `bindjax.frozen.embeddings`, which also opens every kind of embedding source; this
module sits below the readers of other formats (bindjax.frozen.compat.reference,
bindjax.frozen.tfds_builder), which build EmbeddingSets. Semantics: docs/frozen.md; format:
docs/file_formats.md#native-format.

Native format: a directory holding `embeddings.npz` (arrays: embeddings, objects, num_objects and
probe_<name> for each probe) and `metadata.json` (values_per_concept, names, captions,
provenance, probe names). Written to a temporary directory next to the target, then renamed.
"""
import dataclasses
import os
import shutil
import tempfile

import numpy as np

from bindjax.base import files

FORMAT = "bindjax.frozen.embeddings"
FORMAT_VERSION = 1
ARRAYS_FILE = "embeddings.npz"
METADATA_FILE = "metadata.json"


@dataclasses.dataclass(eq=False)  # arrays have no single truth value; compare fields
class EmbeddingSet:
  """Embeddings of N scenes: row i embeds the scene objects[i, :num_objects[i]].

  embeddings: float32 [N, D]; objects: int32 [N, K, C], value index per concept, -1 padded;
  num_objects: int32 [N]; values_per_concept: V_c per concept. probes: optional probe vectors,
  "concept_{c}" [V_c, D] and "object" [U, D] with rows in `object_ids()` order.
  """
  embeddings: np.ndarray
  objects: np.ndarray
  num_objects: np.ndarray
  values_per_concept: tuple
  concept_names: list | None = None
  value_names: list | None = None
  captions: list | None = None
  provenance: dict = dataclasses.field(default_factory=dict)
  probes: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    self.embeddings = np.asarray(self.embeddings)
    if self.embeddings.dtype != np.float32 and np.issubdtype(self.embeddings.dtype, np.floating):
      self.embeddings = self.embeddings.astype(np.float32)
    self.objects = np.asarray(self.objects)
    self.num_objects = np.asarray(self.num_objects)
    if np.issubdtype(self.objects.dtype, np.integer):
      self.objects = self.objects.astype(np.int32)
    if np.issubdtype(self.num_objects.dtype, np.integer):
      self.num_objects = self.num_objects.astype(np.int32)
    self.values_per_concept = tuple(int(v) for v in np.atleast_1d(self.values_per_concept))
    self.probes = {str(k): np.asarray(v, dtype=np.float32) for k, v in self.probes.items()}
    self.provenance = dict(self.provenance or {})

  def __repr__(self):
    probes = {k: list(v.shape) for k, v in self.probes.items()}
    return (f"EmbeddingSet(N={self.embeddings.shape[0] if self.embeddings.ndim else '?'}, "
            f"D={self.embeddings.shape[-1] if self.embeddings.ndim else '?'}, "
            f"objects={list(self.objects.shape)}, values_per_concept="
            f"{list(self.values_per_concept)}, probes={probes})")

  # ---------------------------------------------------------------- sizes
  @property
  def num_scenes(self):
    return self.embeddings.shape[0]

  @property
  def dim(self):
    return self.embeddings.shape[1]

  @property
  def max_objects(self):
    return self.objects.shape[1]

  @property
  def num_concepts(self):
    return len(self.values_per_concept)

  # ---------------------------------------------------------------- construction
  @classmethod
  def from_scenes(cls, embeddings, scenes, values_per_concept, max_objects=None, **kwargs):
    """Builds a set from a list of scenes (each a list of objects, each C value indices).

    Raises ValueError for ragged scenes (objects with a different number of values), row
    counts that differ, or more objects than `max_objects`. The result is validated.
    """
    objects, num_objects = scenes_to_arrays(scenes, len(tuple(values_per_concept)),
                                            max_objects)
    embeddings = np.asarray(embeddings)
    if embeddings.ndim != 2 or embeddings.shape[0] != len(num_objects):
      raise ValueError(f"embeddings: shape {embeddings.shape} does not match the {len(num_objects)}"
                       f" scenes (expected [{len(num_objects)}, D])")
    out = cls(embeddings, objects, num_objects, tuple(values_per_concept), **kwargs)
    out.validate()
    return out

  # ---------------------------------------------------------------- validation
  def validate(self):
    """Checks shapes, dtypes, finiteness, value ranges, padding, names and probes.

    Raises ValueError naming the field, the offending value and what was expected.
    """
    self._validate_arrays()
    self._validate_names()
    self._validate_probes()
    if not isinstance(self.provenance, dict):
      raise ValueError(f"provenance: expected a dict, got {type(self.provenance).__name__}")
    return self

  def _validate_arrays(self):
    """`validate` of the embeddings, objects and counts."""
    e, o, n = self.embeddings, self.objects, self.num_objects
    if e.ndim != 2 or e.shape[1] < 1:
      raise ValueError(f"embeddings: expected a [N, D] array, got shape {e.shape}")
    if e.dtype != np.float32:
      raise ValueError(f"embeddings: expected float32, got {e.dtype}")
    num = e.shape[0]
    if not self.values_per_concept or min(self.values_per_concept) < 1:
      raise ValueError(f"values_per_concept: expected positive counts, got "
                       f"{self.values_per_concept}")
    c = len(self.values_per_concept)
    if o.ndim != 3 or o.shape[0] != num or o.shape[2] != c:
      raise ValueError(f"objects: expected shape [N={num}, K, C={c}], got {o.shape}")
    if not np.issubdtype(o.dtype, np.integer) or not np.issubdtype(n.dtype, np.integer):
      raise ValueError(f"objects / num_objects: expected integers, got {o.dtype} / {n.dtype}")
    if n.shape != (num,):
      raise ValueError(f"num_objects: expected shape ({num},), got {n.shape}")
    k = o.shape[1]
    bad = np.flatnonzero((n < 0) | (n > k))
    if bad.size:
      raise ValueError(f"num_objects: rows {_rows(bad)} have counts {n[bad[:5]].tolist()}, "
                       f"expected 0..{k}")
    bad_rows = np.flatnonzero(~np.isfinite(e).all(axis=1))
    if bad_rows.size:
      raise ValueError(f"embeddings: {bad_rows.size} rows contain NaN or inf: rows "
                       f"{_rows(bad_rows)}")
    self._validate_objects()

  def _validate_objects(self):
    """`validate` of the object slots: -1 past each scene's count, values in range below it."""
    o, n = self.objects, self.num_objects
    present = np.arange(o.shape[1])[None, :] < n[:, None]  # [N, K]
    if np.any(o[~present] != -1):
      rows = np.flatnonzero(np.any((o != -1) & ~present[:, :, None], axis=(1, 2)))
      raise ValueError(f"objects: slots past num_objects must be -1 (padding); rows "
                       f"{_rows(rows)} are not")
    limits = np.asarray(self.values_per_concept)
    out_of_range = present[:, :, None] & ((o < 0) | (o >= limits))
    if out_of_range.any():
      row, slot, concept = np.argwhere(out_of_range)[0]
      rows = np.flatnonzero(out_of_range.any(axis=(1, 2)))
      raise ValueError(
          f"objects: value {o[row, slot, concept]} of concept {concept} (scene {row}, object "
          f"{slot}) is out of range 0..{limits[concept] - 1} given values_per_concept="
          f"{list(self.values_per_concept)}; rows {_rows(rows)}")

  def _validate_names(self):
    """`validate` of the concept and value names and the captions."""
    c, num = len(self.values_per_concept), self.embeddings.shape[0]
    if self.concept_names is not None and len(self.concept_names) != c:
      raise ValueError(f"concept_names: expected {c} names, got {len(self.concept_names)}")
    if self.value_names is not None:
      lengths = [len(v) for v in self.value_names]
      if lengths != list(self.values_per_concept):
        raise ValueError(f"value_names: expected {list(self.values_per_concept)} names per "
                         f"concept, got {lengths}")
    if self.captions is not None and len(self.captions) != num:
      raise ValueError(f"captions: expected {num} captions (one per scene), got "
                       f"{len(self.captions)}")

  def _validate_probes(self):
    """`validate` of the probes: [rows, D], finite, one row per value or distinct object."""
    c, dim = len(self.values_per_concept), self.embeddings.shape[1]
    num_unique = None
    for name, probe in self.probes.items():
      if probe.ndim != 2 or probe.shape[1] != dim:
        raise ValueError(f"probes[{name!r}]: expected [rows, D={dim}] (the embedding width), "
                         f"got shape {probe.shape}")
      if not np.isfinite(probe).all():
        raise ValueError(f"probes[{name!r}]: contains NaN or inf")
      expected = None
      if name.startswith("concept_") and name[8:].isdigit():
        concept = int(name[8:])
        if concept >= c:
          raise ValueError(f"probes[{name!r}]: no concept {concept} (C={c})")
        expected = self.values_per_concept[concept]
      elif name == "object":
        if num_unique is None:
          num_unique = self.object_ids()[1].shape[0]
        expected = num_unique
      if expected is not None and probe.shape[0] != expected:
        raise ValueError(f"probes[{name!r}]: expected {expected} rows, got {probe.shape[0]}")

  # ---------------------------------------------------------------- objects
  def object_ids(self):
    """Object ids per scene slot and the distinct objects, in first-appearance order.

    See docs/frozen.md#object-ids.

    Returns (scene_object_ids [N, K] int32 with -1 padding, unique_objects [U, C] int32): ids
    number distinct objects by first appearance scanning scenes in order, slot 0 before slot 1.
    """
    n, k, c = self.objects.shape
    flat = self.objects.reshape(n * k, c)
    valid = (np.arange(k)[None, :] < self.num_objects[:, None]).reshape(-1)
    codes = np.zeros(n * k, dtype=np.int64)
    for concept in reversed(range(c)):  # mixed radix, any order works for uniqueness
      codes = codes * self.values_per_concept[concept] + np.maximum(flat[:, concept], 0)
    positions = np.flatnonzero(valid)
    _, first, inverse = np.unique(codes[positions], return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # unique codes sorted by first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    ids = np.full(n * k, -1, dtype=np.int32)
    ids[positions] = rank[inverse.reshape(-1)]
    unique_objects = flat[positions[first[order]]].astype(np.int32).reshape(-1, c)
    return ids.reshape(n, k), unique_objects

  def two_object_rows(self):
    """Indices of the scenes with exactly two objects."""
    return np.flatnonzero(self.num_objects == 2)

  def scenes(self):
    """The scenes as lists of objects (lists of value indices), as in dataset.pkl."""
    return [[list(map(int, obj)) for obj in row[:count]]
            for row, count in zip(self.objects.tolist(), self.num_objects.tolist())]

  def subset(self, rows):
    """The set restricted to `rows` (indices or a boolean mask), in that order.

    The object probe's rows are re-ordered to the subset's object_ids() order; objects absent
    from the subset are dropped from it.
    """
    rows = np.asarray(rows)
    if rows.dtype == bool:
      if rows.shape != (self.num_scenes,):
        raise ValueError(f"subset: boolean mask of shape {rows.shape}, expected "
                         f"({self.num_scenes},)")
      rows = np.flatnonzero(rows)
    rows = rows.astype(np.int64).reshape(-1)
    if rows.size and (rows.min() < -self.num_scenes or rows.max() >= self.num_scenes):
      raise ValueError(f"subset: rows must be in [0, {self.num_scenes}), got "
                       f"{rows.min()}..{rows.max()}")
    probes = dict(self.probes)
    out = dataclasses.replace(
        self, embeddings=self.embeddings[rows], objects=self.objects[rows],
        num_objects=self.num_objects[rows],
        captions=None if self.captions is None else [self.captions[i] for i in rows.tolist()],
        provenance=dict(self.provenance), probes={})
    if "object" in probes:
      old_ids, _ = self.object_ids()
      new_ids, _ = out.object_ids()
      mapping = {}
      valid = new_ids >= 0
      for new, old in zip(new_ids[valid].tolist(), old_ids[rows][valid].tolist()):
        mapping.setdefault(new, old)
      probes["object"] = probes["object"][[mapping[i] for i in range(len(mapping))]]
    out.probes = probes
    return out

  # ---------------------------------------------------------------- native format
  def save(self, directory, overwrite=False):
    """Writes the native format to `directory` (any `etils.epath` path); returns its path.

    Locally the directory is new and published atomically (one rename). Elsewhere (gs://, ...)
    there is no rename of a folder: its two files are written one by one, each whole, the
    metadata last. Refuses an existing directory unless overwrite=True.
    """
    self.validate()
    directory = files.as_path(directory)
    if directory.exists() and not overwrite:
      raise FileExistsError(f"{directory} exists; pass overwrite=True to replace it")
    if not files.is_local(directory):
      self._write_files(directory)
      return os.fspath(directory)
    tmp = new_temp_dir(directory)
    try:
      self._write_files(files.as_path(tmp))
      move_into_place(tmp, directory)
    finally:
      if os.path.exists(tmp):
        shutil.rmtree(tmp)
    return os.fspath(directory)

  def _write_files(self, directory):
    """Writes the arrays, then the metadata, into `directory`."""
    arrays = {"embeddings": self.embeddings, "objects": self.objects,
              "num_objects": self.num_objects}
    arrays.update({f"probe_{name}": probe for name, probe in self.probes.items()})
    with files.atomic_path(directory / ARRAYS_FILE) as tmp:
      np.savez(tmp, **arrays)
    files.write_atomic(directory / METADATA_FILE, files.dumps(self._metadata(), indent=1))

  def _metadata(self):
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "num_scenes": self.num_scenes, "dim": self.dim, "max_objects": self.max_objects,
        "values_per_concept": list(self.values_per_concept),
        "concept_names": self.concept_names, "value_names": self.value_names,
        "captions": self.captions, "provenance": files.to_jsonable(self.provenance),
        "probes": sorted(self.probes),
    }

  @classmethod
  def load(cls, directory):
    """Reads a directory written by `save`; validates it."""
    directory = files.as_path(directory)
    meta_path = directory / METADATA_FILE
    arrays_path = directory / ARRAYS_FILE
    for path in (meta_path, arrays_path):
      if not path.exists():
        raise ValueError(f"{directory}: not a bindjax embedding set ({path.name} missing)")
    meta = files.read_json(meta_path)
    if not isinstance(meta, dict):
      raise ValueError(f"{meta_path}: expected a JSON object, got {type(meta).__name__}")
    if meta.get("format") != FORMAT:
      raise ValueError(f"{meta_path}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if meta.get("format_version", 0) > FORMAT_VERSION:
      raise ValueError(f"{meta_path}: format_version {meta['format_version']} is newer than "
                       f"this bindjax reads ({FORMAT_VERSION})")
    data = files.read_arrays(arrays_path)
    for key in ("embeddings", "objects", "num_objects"):
      if key not in data:
        raise ValueError(f"{arrays_path}: array {key!r} missing")
    probes = {name: data[f"probe_{name}"] for name in meta.get("probes", [])}
    out = cls(data["embeddings"], data["objects"], data["num_objects"],
              tuple(meta["values_per_concept"]), concept_names=meta.get("concept_names"),
              value_names=meta.get("value_names"), captions=meta.get("captions"),
              provenance=meta.get("provenance") or {}, probes=probes)
    try:
      out.validate()
    except ValueError as e:
      raise ValueError(f"{directory}: {e}") from None
    return out


def scenes_to_arrays(scenes, num_concepts, max_objects=None):
  """(objects int32 [N, K, C] padded with -1, num_objects int32 [N]) from a list of scenes.

  Accepts ints or numpy integers. Raises ValueError for ragged objects or non-integer values.
  """
  counts = []
  for i, scene in enumerate(scenes):
    try:
      counts.append(len(scene))
    except TypeError:
      raise ValueError(f"scene {i}: expected a list of objects, got {scene!r}") from None
  k = max(counts, default=0) if max_objects is None else int(max_objects)
  if counts and max(counts) > k:
    row = int(np.argmax(counts))
    raise ValueError(f"scene {row} has {counts[row]} objects, more than max_objects={k}")
  objects = np.full((len(counts), k, num_concepts), -1, dtype=np.int32)
  for i, scene in enumerate(scenes):
    for j, obj in enumerate(scene):
      values = np.asarray(obj)
      if values.shape != (num_concepts,) or not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"scene {i}, object {j}: expected {num_concepts} integer values (one "
                         f"per concept), got {obj!r}")
      objects[i, j] = values
  return objects, np.asarray(counts, dtype=np.int32)


def new_temp_dir(target):
  """A new empty directory next to `target` (same file system, so a rename can publish it)."""
  parent = os.path.dirname(os.path.abspath(target))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp", dir=parent)
  mask = os.umask(0o022)
  os.umask(mask)
  os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes it private; results are shared like any file
  return tmp


def move_into_place(tmp, target):
  """Renames directory `tmp` to `target`, replacing an existing `target` last."""
  if not os.path.exists(target):
    os.replace(tmp, target)
    return
  old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old",
                         dir=os.path.dirname(os.path.abspath(target)))
  os.replace(target, os.path.join(old, "previous"))
  os.replace(tmp, target)
  shutil.rmtree(old)


def _rows(indices, limit=10):
  indices = [int(i) for i in np.asarray(indices).reshape(-1)]
  more = f" ... ({len(indices)} in all)" if len(indices) > limit else ""
  return f"{indices[:limit]}{more}"


