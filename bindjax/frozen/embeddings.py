"""Embedding sets: the `EmbeddingSet` type and `read_embeddings`, which opens any stored set.

Semantics: docs/frozen.md. Formats: docs/file_formats.md.
"""
import os

from bindjax.base import files
from bindjax.frozen.compat import reference
from bindjax.frozen.embedding_set import EmbeddingSet  # noqa: F401  (re-exported: the public name)
from bindjax.frozen.embedding_set import FORMAT
from bindjax.frozen.embedding_set import METADATA_FILE


def read_embeddings(path):
  """Opens an embedding set: a native directory, a TFDS-built directory or a reference folder."""
  path = os.fspath(path)
  meta = os.path.join(path, METADATA_FILE)
  if os.path.exists(meta):
    found = files.read_json(meta)
    if isinstance(found, dict) and found.get("format") == FORMAT:
      return EmbeddingSet.load(path)
  if os.path.exists(os.path.join(path, "dataset.pkl")) or os.path.exists(
      os.path.join(path, "dataset.json")):
    return reference.read_reference_folder(path)
  if any(os.path.exists(os.path.join(path, *sub, "bindjax_metadata.json"))
         for sub in ((), ("bindjax_embeddings", "1.0.0"))):
    # Imported here because it imports tensorflow_datasets, slow to load and rarely needed.
    from bindjax.frozen import tfds_builder  # pylint: disable=g-import-not-at-top
    return tfds_builder.read_embedding_set(path)
  raise ValueError(f"{path}: not an embedding set (expected {METADATA_FILE} with format "
                   f"{FORMAT!r}, a reference folder with dataset.pkl, or a TFDS dataset)")
