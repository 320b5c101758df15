"""Embedding sets as TFDS datasets (array_record files), written and read without TensorFlow.

For sets too large for one array in memory: `write_chunks` streams EmbeddingSet pieces into a
TFDS dataset, and `EmbeddingSource` reads rows back in their original order through
`as_data_source` (random access, no TensorFlow; `tfds.load` / `as_dataset` would need it).

One example holds a block of `rows_per_example` consecutive scenes (embeddings as raw bytes,
objects, counts, captions) and the index of its first row; the last block is padded and says
how many rows are real. TFDS's per-example cost (~0.3 ms here) makes one example per scene
~100x slower to write and read. Blocks are written unshuffled, and every read checks the stored
row index (falling back to a lookup table if the records were ever reordered).

Layout of `out_dir`: `bindjax_embeddings/1.0.0/` holds TFDS's files plus
`bindjax_metadata.json` (values_per_concept, names, provenance, probe names, block size) and
`bindjax_probes.npz`.
"""
import json
import os
import shutil

import numpy as np
import tensorflow_datasets as tfds

from bindjax.base import files
from bindjax.frozen import embedding_set as embeddings_lib

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

  def __init__(self, *, chunks=None, dim=None, max_objects=None, num_concepts=None,
               rows_per_example=None, **kwargs):
    self._chunks, self._dim, self._block = chunks, dim, rows_per_example
    self._max_objects, self._num_concepts = max_objects, num_concepts
    super().__init__(**kwargs)

  def _info(self):
    block, k, c = self._block, self._max_objects, self._num_concepts
    raw = tfds.features.Encoding.BYTES  # raw bytes instead of one proto field per number
    return tfds.core.DatasetInfo(
        builder=self, disable_shuffling=True,  # keep blocks in order; reads check anyway
        description="Frozen scene embeddings (bindjax EmbeddingSet), blocks of rows.",
        features=tfds.features.FeaturesDict({
            "row": np.int64,  # index of the block's first scene
            "num_rows": np.int32,
            "embeddings": tfds.features.Tensor(shape=(block, self._dim), dtype=np.float32,
                                               encoding=raw),
            "objects": tfds.features.Tensor(shape=(block, k, c), dtype=np.int32, encoding=raw),
            "num_objects": tfds.features.Tensor(shape=(block,), dtype=np.int32, encoding=raw),
            "captions": tfds.features.Text(),  # JSON list of the block's captions
        }))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    for index, (row, arrays) in enumerate(_blocks(self._chunks, self._block)):
      yield index, {"row": row, **arrays}


def _blocks(chunks, block):
  """(first row, example dict) for consecutive blocks of `block` rows from EmbeddingSet chunks."""
  rest, row = None, 0  # rows of earlier chunks not yet written (fewer than a block)
  for chunk in chunks:
    captions = chunk.captions if chunk.captions is not None else [None] * chunk.num_scenes
    part = [chunk.embeddings, chunk.objects, chunk.num_objects, list(captions)]
    if rest is not None:
      part = [np.concatenate([r, p]) for r, p in zip(rest[:3], part[:3])] + [rest[3] + part[3]]
    full = len(part[2]) // block * block
    for start in range(0, full, block):
      yield row, _example([p[start:start + block] for p in part], block)
      row += block
    rest = [p[full:] for p in part]
  if rest is not None and len(rest[2]):
    yield row, _example(rest, block)


def _example(part, block):
  embeddings, objects, num_objects, captions = part
  pad = block - len(num_objects)
  return {
      "num_rows": len(num_objects),
      "embeddings": np.pad(embeddings, ((0, pad), (0, 0))),
      "objects": np.pad(objects, ((0, pad), (0, 0), (0, 0)), constant_values=-1),
      "num_objects": np.pad(num_objects, (0, pad)),
      "captions": json.dumps(None if captions and captions[0] is None else captions),
  }


def _checked_chunks(chunks, stats, values_per_concept, dim, max_objects):
  """Yields the chunks, each validated against the set's shape and the captions of the chunks
  before it; counts rows and notes captions in `stats` as it goes."""
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


def write_chunks(chunks, out_dir, *, values_per_concept, dim, max_objects, concept_names=None,
                 value_names=None, provenance=None, probes=None, rows_per_example=1024,
                 overwrite=False):
  """Writes an iterable of EmbeddingSet chunks (rows in order) as a TFDS dataset in `out_dir`.

  Every chunk is validated and must match values_per_concept, dim and max_objects; captions
  must be present in all chunks or in none. `probes` ({name: [rows, dim]}) are stored beside
  the records. The dataset is built in a temporary directory and renamed into place; an
  existing `out_dir` is refused unless overwrite=True. Returns the version directory.
  """
  values_per_concept = tuple(int(v) for v in values_per_concept)
  rows_per_example = int(rows_per_example)
  if rows_per_example < 1:
    raise ValueError(f"rows_per_example must be >= 1, got {rows_per_example}")
  out_dir = os.path.abspath(os.fspath(out_dir))
  if os.path.exists(out_dir) and not overwrite:
    raise FileExistsError(f"{out_dir} exists; pass overwrite=True to replace it")
  probes = {str(k): np.asarray(v, np.float32) for k, v in (probes or {}).items()}
  for name, probe in probes.items():
    if probe.ndim != 2 or probe.shape[1] != dim:
      raise ValueError(f"probes[{name!r}]: expected [rows, {dim}], got {probe.shape}")
  stats = {"rows": 0, "captions": None}
  tmp = embeddings_lib.new_temp_dir(out_dir)
  try:
    checked = _checked_chunks(chunks, stats, values_per_concept, dim, max_objects)
    builder = BindjaxEmbeddings(chunks=checked, dim=dim, max_objects=max_objects,
                                num_concepts=len(values_per_concept),
                                rows_per_example=rows_per_example, data_dir=tmp,
                                file_format="array_record")
    builder.download_and_prepare(download_dir=os.path.join(tmp, "downloads"))
    shutil.rmtree(os.path.join(tmp, "downloads"), ignore_errors=True)
    version_dir = os.path.join(tmp, NAME, VERSION)
    with open(os.path.join(version_dir, PROBES_FILE), "wb") as f:
      np.savez(f, **probes)
    meta = {"format": "bindjax.frozen.embeddings.tfds", "num_scenes": stats["rows"], "dim": dim,
            "max_objects": max_objects, "values_per_concept": list(values_per_concept),
            "rows_per_example": rows_per_example,
            "concept_names": concept_names, "value_names": value_names,
            "has_captions": bool(stats["captions"]),
            "provenance": files.to_jsonable(provenance or {}),
            "probes": sorted(probes)}
    with open(os.path.join(version_dir, METADATA_FILE), "w") as f:
      f.write(files.dumps(meta, indent=1))
    embeddings_lib.move_into_place(tmp, out_dir)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)
  return os.path.join(out_dir, NAME, VERSION)


def write_embedding_set(embedding_set, out_dir, overwrite=False, rows_per_example=1024):
  """Writes an in-memory EmbeddingSet as a TFDS dataset (see write_chunks)."""
  embedding_set.validate()
  block = max(1, min(rows_per_example, embedding_set.num_scenes))
  return write_chunks(
      [embedding_set], out_dir, values_per_concept=embedding_set.values_per_concept,
      dim=embedding_set.dim, max_objects=embedding_set.max_objects,
      concept_names=embedding_set.concept_names, value_names=embedding_set.value_names,
      provenance=embedding_set.provenance, probes=embedding_set.probes,
      rows_per_example=block, overwrite=overwrite)


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
    self.values_per_concept = tuple(self.metadata["values_per_concept"])
    self.dim, self.max_objects = self.metadata["dim"], self.metadata["max_objects"]
    self.rows_per_example = self.metadata["rows_per_example"]
    self._num_rows = self.metadata["num_scenes"]
    expected = -(-self._num_rows // self.rows_per_example)
    if len(self._source) != expected:
      raise ValueError(f"{version_dir}: {len(self._source)} records, expected {expected} for "
                       f"{self._num_rows} rows in blocks of {self.rows_per_example}")
    self._record_of_block = None  # built only if records are found out of order

  def __len__(self):
    return self._num_rows

  def _fetch_blocks(self, blocks):
    records = blocks if self._record_of_block is None else self._record_of_block[blocks]
    examples = self._source.__getitems__([int(r) for r in records])
    found = np.asarray([e["row"] for e in examples], dtype=np.int64)
    if not np.array_equal(found, blocks * self.rows_per_example):
      if self._record_of_block is not None:
        raise ValueError(f"TFDS embedding set: blocks {blocks[:5]}... hold rows {found[:5]}...")
      self._record_of_block = self._block_lookup()
      return self._fetch_blocks(blocks)
    return examples

  def _block_lookup(self):
    lookup = np.full(len(self._source), -1, dtype=np.int64)
    for index in range(len(self._source)):
      lookup[self._source[index]["row"] // self.rows_per_example] = index
    if (lookup < 0).any():
      raise ValueError("TFDS embedding set: block row indices are not 0, B, 2B, ...")
    return lookup

  def read(self, rows):
    """Arrays {row, embedding, objects, num_objects, caption} for the given row indices."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    if rows.size and (rows.min() < 0 or rows.max() >= len(self)):
      raise ValueError(f"rows must be in [0, {len(self)}), got {rows.min()}..{rows.max()}")
    blocks, where = np.unique(rows // self.rows_per_example, return_inverse=True)
    offsets = rows % self.rows_per_example
    order = np.argsort(where, kind="stable")  # the requested rows grouped by block
    bounds = np.searchsorted(where[order], np.arange(blocks.size + 1))
    c = len(self.values_per_concept)
    embedding = np.zeros((rows.size, self.dim), np.float32)
    objects = np.zeros((rows.size, self.max_objects, c), np.int32)
    num_objects = np.zeros(rows.size, np.int32)
    captions = [""] * rows.size
    for first in range(0, blocks.size, 64):  # a few blocks at a time bounds the memory
      examples = self._fetch_blocks(blocks[first:first + 64])
      for b, example in enumerate(examples, start=first):
        mine = order[bounds[b]:bounds[b + 1]]
        embedding[mine] = example["embeddings"][offsets[mine]]
        objects[mine] = example["objects"][offsets[mine]]
        num_objects[mine] = example["num_objects"][offsets[mine]]
        block_captions = json.loads(_text(example["captions"]))
        if block_captions is not None:
          for i in mine.tolist():
            captions[i] = block_captions[offsets[i]]
    return {"row": rows, "embedding": embedding, "objects": objects,
            "num_objects": num_objects, "caption": captions}

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
