"""Embedding sets as TFDS datasets (array_record files), written and read without TensorFlow.

For sets too large for one array in memory: `write_chunks` streams EmbeddingSet pieces into a
TFDS dataset (one example per scene: row, embedding, objects, num_objects, caption), and
`EmbeddingSource` reads rows back in their original order through `as_data_source` (random
access, no TensorFlow; `tfds.load` / `as_dataset` would need it). Each example stores its row
index: rows are written unshuffled and every read checks the stored indices.

Layout of `out_dir`: `bindjax_embeddings/1.0.0/` holds TFDS's files plus
`bindjax_metadata.json` (values_per_concept, names, provenance, probe names) and
`bindjax_probes.npz`.
"""
import json
import os
import shutil

import numpy as np
import tensorflow_datasets as tfds

from bindjax import embeddings as embeddings_lib

NAME = "bindjax_embeddings"
VERSION = "1.0.0"
METADATA_FILE = "bindjax_metadata.json"
PROBES_FILE = "bindjax_probes.npz"


class BindjaxEmbeddings(tfds.core.GeneratorBasedBuilder):
  """TFDS builder over a stream of EmbeddingSet chunks (one split, "train")."""
  VERSION = tfds.core.Version(VERSION)
  # TFDS looks for a checksums file next to the builder's code through etils.epath's
  # resource_path, which needs the `importlib_resources` package (not a bindjax dependency).
  # This builder downloads nothing, so it has no code path to search.
  code_path = None

  def __init__(self, *, chunks=None, dim=None, max_objects=None, num_concepts=None, **kwargs):
    self._chunks, self._dim = chunks, dim
    self._max_objects, self._num_concepts = max_objects, num_concepts
    super().__init__(**kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, disable_shuffling=True,  # keep rows in order; rows are checked anyway
        description="Frozen scene embeddings (bindjax EmbeddingSet).",
        features=tfds.features.FeaturesDict({
            "row": np.int64,
            "embedding": tfds.features.Tensor(shape=(self._dim,), dtype=np.float32),
            "objects": tfds.features.Tensor(shape=(self._max_objects, self._num_concepts),
                                            dtype=np.int32),
            "num_objects": np.int32,
            "caption": tfds.features.Text(),
        }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    row = 0
    for chunk in self._chunks:
      captions = chunk.captions or [""] * chunk.num_scenes
      for i in range(chunk.num_scenes):
        yield row, {"row": row, "embedding": chunk.embeddings[i], "objects": chunk.objects[i],
                    "num_objects": chunk.num_objects[i], "caption": captions[i]}
        row += 1


def write_chunks(chunks, out_dir, *, values_per_concept, dim, max_objects, concept_names=None,
                 value_names=None, provenance=None, probes=None, overwrite=False):
  """Writes an iterable of EmbeddingSet chunks (rows in order) as a TFDS dataset in `out_dir`.

  Every chunk is validated and must match values_per_concept, dim and max_objects. `probes`
  ({name: [rows, dim]}) are stored beside the records. The dataset is built in a temporary
  directory and renamed into place; an existing `out_dir` is refused unless overwrite=True.
  Returns the dataset's version directory.
  """
  values_per_concept = tuple(int(v) for v in values_per_concept)
  out_dir = os.path.abspath(os.fspath(out_dir))
  if os.path.exists(out_dir) and not overwrite:
    raise FileExistsError(f"{out_dir} exists; pass overwrite=True to replace it")
  probes = {str(k): np.asarray(v, np.float32) for k, v in (probes or {}).items()}
  for name, probe in probes.items():
    if probe.ndim != 2 or probe.shape[1] != dim:
      raise ValueError(f"probes[{name!r}]: expected [rows, {dim}], got {probe.shape}")
  tmp = embeddings_lib.new_temp_dir(out_dir)
  stats = {"rows": 0, "captions": None}

  def checked():
    for i, chunk in enumerate(chunks):
      chunk.validate()
      if (chunk.values_per_concept != values_per_concept or chunk.dim != dim or
          chunk.max_objects != max_objects):
        raise ValueError(
            f"chunk {i}: values_per_concept={list(chunk.values_per_concept)}, dim={chunk.dim}, "
            f"max_objects={chunk.max_objects}; expected {list(values_per_concept)}, {dim}, "
            f"{max_objects}")
      has_captions = chunk.captions is not None
      if stats["captions"] not in (None, has_captions):
        raise ValueError(f"chunk {i}: captions {'present' if has_captions else 'missing'}, "
                         "unlike the chunks before it")
      stats["rows"] += chunk.num_scenes
      stats["captions"] = has_captions
      yield chunk

  try:
    builder = BindjaxEmbeddings(chunks=checked(), dim=dim, max_objects=max_objects,
                                num_concepts=len(values_per_concept), data_dir=tmp,
                                file_format="array_record")
    builder.download_and_prepare(download_dir=os.path.join(tmp, "downloads"))
    shutil.rmtree(os.path.join(tmp, "downloads"), ignore_errors=True)
    version_dir = os.path.join(tmp, NAME, VERSION)
    with open(os.path.join(version_dir, PROBES_FILE), "wb") as f:
      np.savez(f, **probes)
    meta = {"format": "bindjax.embeddings.tfds", "num_scenes": stats["rows"], "dim": dim,
            "max_objects": max_objects, "values_per_concept": list(values_per_concept),
            "concept_names": concept_names, "value_names": value_names,
            "has_captions": bool(stats["captions"]),
            "provenance": embeddings_lib.jsonable(provenance or {}),
            "probes": sorted(probes)}
    with open(os.path.join(version_dir, METADATA_FILE), "w") as f:
      json.dump(meta, f, indent=1)
    embeddings_lib.move_into_place(tmp, out_dir)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)
  return os.path.join(out_dir, NAME, VERSION)


def write_embedding_set(embedding_set, out_dir, overwrite=False, chunk_size=65536):
  """Writes an in-memory EmbeddingSet as a TFDS dataset (see write_chunks)."""
  embedding_set.validate()
  chunks = (embedding_set.subset(np.arange(start, min(start + chunk_size,
                                                      embedding_set.num_scenes)))
            for start in range(0, embedding_set.num_scenes, chunk_size))
  return write_chunks(
      chunks, out_dir, values_per_concept=embedding_set.values_per_concept,
      dim=embedding_set.dim, max_objects=embedding_set.max_objects,
      concept_names=embedding_set.concept_names, value_names=embedding_set.value_names,
      provenance=embedding_set.provenance, probes=embedding_set.probes, overwrite=overwrite)


def find_version_dir(path):
  """The directory holding dataset_info.json + bindjax_metadata.json under `path`, or None."""
  path = os.fspath(path)
  for candidate in (path, os.path.join(path, NAME, VERSION)):
    if (os.path.exists(os.path.join(candidate, "dataset_info.json")) and
        os.path.exists(os.path.join(candidate, METADATA_FILE))):
      return candidate
  return None


class EmbeddingSource:
  """Random access to a TFDS embedding set, rows in original order, TF-free."""

  def __init__(self, path):
    version_dir = find_version_dir(path)
    if version_dir is None:
      raise ValueError(f"{path}: not a bindjax TFDS embedding set (no {NAME}/{VERSION}/"
                       f"{METADATA_FILE})")
    with open(os.path.join(version_dir, METADATA_FILE)) as f:
      self.metadata = json.load(f)
    with np.load(os.path.join(version_dir, PROBES_FILE), allow_pickle=False) as probes:
      self.probes = {k: probes[k] for k in probes.files}
    self._source = tfds.builder_from_directory(version_dir).as_data_source("train")
    if len(self._source) != self.metadata["num_scenes"]:
      raise ValueError(f"{version_dir}: {len(self._source)} records, metadata says "
                       f"{self.metadata['num_scenes']}")
    self._position = None  # row -> record index, built only if records are out of order
    self.values_per_concept = tuple(self.metadata["values_per_concept"])
    self.dim, self.max_objects = self.metadata["dim"], self.metadata["max_objects"]

  def __len__(self):
    return len(self._source)

  def read(self, rows):
    """Arrays {row, embedding, objects, num_objects, caption} for the given row indices."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    records = rows if self._position is None else self._position[rows]
    examples = self._source.__getitems__(records.tolist())
    found = np.asarray([e["row"] for e in examples], dtype=np.int64)
    if self._position is None and not np.array_equal(found, rows):
      self._position = self._row_positions()
      return self.read(rows)
    if not np.array_equal(found, rows):
      raise ValueError(f"TFDS embedding set: asked for rows {rows[:5]}..., records hold "
                       f"{found[:5]}...")
    return {
        "row": found,
        "embedding": np.stack([e["embedding"] for e in examples]).reshape(-1, self.dim),
        "objects": np.stack([e["objects"] for e in examples]).reshape(
            -1, self.max_objects, len(self.values_per_concept)),
        "num_objects": np.asarray([e["num_objects"] for e in examples], dtype=np.int32),
        "caption": [_text(e["caption"]) for e in examples],
    }

  def _row_positions(self):
    position = np.full(len(self), -1, dtype=np.int64)
    for start in range(0, len(self), 4096):
      indices = list(range(start, min(start + 4096, len(self))))
      for index, example in zip(indices, self._source.__getitems__(indices)):
        position[example["row"]] = index
    if (position < 0).any():
      raise ValueError("TFDS embedding set: row indices are not 0..N-1")
    return position

  def iter_chunks(self, chunk_size=4096):
    """Yields EmbeddingSet chunks of consecutive rows, in order (probes not attached)."""
    for start in range(0, len(self), chunk_size):
      arrays = self.read(np.arange(start, min(start + chunk_size, len(self))))
      yield self._embedding_set(arrays, probes={})

  def to_embedding_set(self):
    """The whole set in memory, with probes."""
    return self._embedding_set(self.read(np.arange(len(self))), probes=self.probes)

  def _embedding_set(self, arrays, probes):
    meta = self.metadata
    out = embeddings_lib.EmbeddingSet(
        arrays["embedding"], arrays["objects"], arrays["num_objects"], self.values_per_concept,
        concept_names=meta.get("concept_names"), value_names=meta.get("value_names"),
        captions=arrays["caption"] if meta.get("has_captions") else None,
        provenance=dict(meta.get("provenance") or {}), probes=dict(probes))
    return out.validate()


def read_embedding_set(path):
  """Reads a whole TFDS embedding set into an EmbeddingSet."""
  return EmbeddingSource(path).to_embedding_set()


def _text(value):
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)
