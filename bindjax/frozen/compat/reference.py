"""Readers for the folders the original PyTorch code writes, without torch
(docs/file_formats.md#reference-folders).


A reference folder holds `dataset.pkl` (list of scenes), `metadata.json`, an embeddings file
(`*_embeddings.pkl`: a pickled torch tensor, numpy array or dict with 'embeddings'; or
`trained_embeddings_*.pt` / `scene_embeddings.pkl`: a dict of embeddings and probe weights),
and optionally `dataset.json` (scenes and captions). Every pickle goes through safe_pickle.
"""
import collections.abc
import glob
import os

import numpy as np

from bindjax.base import files
from bindjax.frozen.compat import safe_pickle
from bindjax.frozen.compat import torch_format
from bindjax.frozen import embedding_set as embeddings_lib


def read_metadata(path):
  """metadata.json -> dict with `values_per_concept` as a list (int or alias accepted).

  Keys read: values_per_concept (list, or an int for every concept; alias
  num_values_per_concept), num_concepts, num_objects (max objects per scene), names.
  """
  meta = files.read_json(path)
  if not isinstance(meta, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(meta).__name__}")
  values = meta.get("values_per_concept", meta.get("num_values_per_concept"))
  if values is None:
    raise ValueError(f"{path}: needs values_per_concept (or num_values_per_concept)")
  if isinstance(values, int):
    if "num_concepts" not in meta:
      raise ValueError(f"{path}: values_per_concept={values} is a single number, so "
                       "num_concepts is needed too")
    values = [values] * int(meta["num_concepts"])
  if (not isinstance(values, list) or not values or
      not all(isinstance(v, int) and v > 0 for v in values)):
    raise ValueError(f"{path}: values_per_concept must be positive integers, got {values!r}")
  if "num_concepts" in meta and int(meta["num_concepts"]) != len(values):
    raise ValueError(f"{path}: num_concepts={meta['num_concepts']} but values_per_concept has "
                     f"{len(values)} entries")
  out = dict(meta)
  out["values_per_concept"] = [int(v) for v in values]
  out["num_concepts"] = len(values)
  return out


def read_dataset(path):
  """dataset.pkl (safe unpickling) or dataset.json -> list of scenes of lists of ints."""
  if path.endswith(".json"):
    data = files.read_json(path)
    scenes = data["scenes"] if isinstance(data, dict) else data
  else:
    scenes = safe_pickle.load(path)
  if isinstance(scenes, np.ndarray) and scenes.dtype != object:
    scenes = scenes.tolist()
  if not isinstance(scenes, (list, tuple, np.ndarray)):
    raise ValueError(f"{path}: expected a list of scenes, got {type(scenes).__name__}")
  out = []
  for i, scene in enumerate(scenes):
    try:
      out.append([[_as_int(v, path, i) for v in obj] for obj in scene])
    except TypeError:
      raise ValueError(f"{path}: scene {i} is not a list of objects: {scene!r}") from None
  return out


def _as_int(value, path, row):
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{path}: scene {row} holds {value!r}; expected integer value indices")
  return int(value)


def read_embeddings_file(path):
  """An embeddings file -> (embeddings float32 [N, D], probes {name: [rows, D]}, info dict).

  Accepts .npy / .npz, pickled torch tensors (float32/16, bfloat16), numpy arrays, and dicts
  with 'embeddings' and optional probes_single_concept / probes_object (whole torch Linear
  modules, state dicts or weight arrays; weights [out, in], biases must be absent or zero).
  """
  if path.endswith((".npy", ".npz")):
    obj = files.read_arrays(path)
  else:
    obj = torch_format.load(path)
  info, probes = {}, {}
  if isinstance(obj, collections.abc.Mapping):
    if "embeddings" not in obj:
      raise ValueError(f"{path}: dict without an 'embeddings' entry (keys: {sorted(obj)})")
    for key in ("similarity", "sim_scale"):
      if key in obj and isinstance(obj[key], (str, int, float)):
        info[key] = obj[key]
    for key, value in _linear_weights(obj.get("probes_single_concept"), path).items():
      probes[f"concept_{key}"] = value
    objects = _linear_weights(obj.get("probes_object"), path)
    if objects:
      main = "1" if "1" in objects else (next(iter(objects)) if len(objects) == 1 else None)
      for key, value in objects.items():
        probes["object" if key == main else f"object_{key}"] = value
    obj = obj["embeddings"]
  array = np.asarray(obj)
  if array.dtype == object or not np.issubdtype(array.dtype, np.number):
    raise ValueError(f"{path}: embeddings of dtype {array.dtype}; expected a float array")
  if array.ndim != 2:
    raise ValueError(f"{path}: embeddings of shape {array.shape}; expected [N, D]")
  for name, probe in probes.items():
    if probe.shape[1] != array.shape[1]:
      raise ValueError(f"{path}: probe {name!r} has input width {probe.shape[1]} but the "
                       f"embeddings are {array.shape[1]}-d")
  return array.astype(np.float32), probes, info


def _linear_weights(obj, path):
  """{key: weight [out, in]} from a ModuleDict / dict of Linear modules, state dicts or arrays."""
  if obj is None:
    return {}
  if isinstance(obj, safe_pickle.ModuleState):
    flat = obj.state_dict()
  elif isinstance(obj, collections.abc.Mapping):
    flat = {}
    for key, value in obj.items():
      if isinstance(value, safe_pickle.ModuleState):
        flat.update({f"{key}.{k}": v for k, v in value.state_dict().items()})
      elif isinstance(value, collections.abc.Mapping):
        flat.update({f"{key}.{k}": v for k, v in value.items()})
      else:
        flat[f"{key}.weight"] = value
  else:
    raise ValueError(f"{path}: probes of type {type(obj).__name__}; expected a dict of Linear "
                     "layers")
  weights = {}
  for name, value in flat.items():
    prefix, _, leaf = name.rpartition(".")
    if leaf == "bias":
      if value is not None and np.any(np.asarray(value) != 0):
        raise ValueError(f"{path}: probe {prefix!r} has a non-zero bias; bindjax probes are "
                         "bias-free (docs/probes.md#heads)")
    elif leaf == "weight":
      weight = np.asarray(value, dtype=np.float32)
      if weight.ndim != 2:
        raise ValueError(f"{path}: probe {prefix!r} weight of shape {weight.shape}; expected "
                         "[out, in]")
      weights[prefix] = weight
  return weights


def find_embeddings_file(directory):
  """The embeddings file of a reference folder when there is exactly one candidate."""
  for pattern in ("*_embeddings.pkl", "scene_embeddings.pkl", "embeddings.npy",
                  "embeddings/trained_embeddings_*.pt", "trained_embeddings_*.pt"):
    found = sorted(glob.glob(os.path.join(directory, pattern)))
    if len(found) == 1:
      return found[0]
    if len(found) > 1:
      names = ", ".join(os.path.relpath(f, directory) for f in found)
      raise ValueError(f"{directory}: several embeddings files ({names}); choose one with "
                       "embeddings_file / --embeddings")
  raise ValueError(f"{directory}: no embeddings file (*_embeddings.pkl, scene_embeddings.pkl, "
                   "embeddings.npy or trained_embeddings_*.pt)")


def read_reference_folder(directory, embeddings_file=None):
  """Reads a folder of the original code into a validated EmbeddingSet.

  Embedding rows belong to the dataset's scenes in order; a file with one row per 2-object
  scene (trained_embeddings_*.pt) is matched to those scenes. Probe weights in the file become
  probes "concept_{c}" [V_c, D] and "object" [U, D]. Names come from metadata.json
  (concept_names, concept_values / value_names) and captions from dataset.json.
  """
  directory = os.fspath(directory)
  if not os.path.isdir(directory):
    raise ValueError(f"{directory}: not a directory")
  meta_path = os.path.join(directory, "metadata.json")
  if not os.path.exists(meta_path):
    raise ValueError(f"{directory}: metadata.json missing")
  meta = read_metadata(meta_path)
  dataset_path = os.path.join(directory, "dataset.pkl")
  json_path = os.path.join(directory, "dataset.json")
  if not os.path.exists(dataset_path):
    dataset_path = json_path
  if not os.path.exists(dataset_path):
    raise ValueError(f"{directory}: dataset.pkl (or dataset.json) missing")
  scenes = read_dataset(dataset_path)
  values = meta["values_per_concept"]
  try:
    objects, num_objects = embeddings_lib.scenes_to_arrays(scenes, len(values),
                                                          meta.get("num_objects"))
  except ValueError as e:
    raise ValueError(f"{dataset_path} (with {meta_path}): {e}") from None
  path = _embeddings_path(directory, embeddings_file)
  array, probes, info = read_embeddings_file(path)
  rows, row_kind = _match_rows(array.shape[0], num_objects, path, dataset_path)
  captions = _captions(json_path, len(scenes), dataset_path)
  concept_names, value_names = _names(meta)
  provenance = {
      "source": "reference", "folder": os.path.abspath(directory),
      "embeddings_file": os.path.relpath(os.path.abspath(path), os.path.abspath(directory)),
      "dataset_file": os.path.basename(dataset_path), "rows": row_kind,
      "scene_rows": None if rows is None else rows.tolist(),
  }
  if "model" in meta:
    provenance["model"] = meta["model"]
  provenance.update(info)
  full = embeddings_lib.EmbeddingSet(
      np.zeros((len(scenes), 1), np.float32), objects, num_objects, tuple(values),
      concept_names=concept_names, value_names=value_names, captions=captions,
      provenance=provenance)
  out = full if rows is None else full.subset(rows)
  out.embeddings = array
  out.probes = probes
  try:
    out.validate()
  except ValueError as e:
    raise ValueError(f"{directory} ({os.path.basename(path)}, "
                     f"{os.path.basename(dataset_path)}, metadata.json): {e}") from None
  return out


def _embeddings_path(directory, embeddings_file):
  """The embeddings file to read: the folder's one candidate, or `embeddings_file` relative to
  the folder first, then to the working directory."""
  if embeddings_file is None:
    return find_embeddings_file(directory)
  path = os.fspath(embeddings_file)
  if not os.path.isabs(path) and os.path.exists(os.path.join(directory, path)):
    path = os.path.join(directory, path)
  if not os.path.exists(path):
    raise ValueError(f"embeddings file {embeddings_file} not found (also looked in "
                     f"{directory})")
  return path


def _captions(json_path, num_scenes, dataset_path):
  """The captions of dataset.json, one per scene; None when it has none."""
  if not os.path.exists(json_path):
    return None
  data = files.read_json(json_path)
  if not (isinstance(data, dict) and isinstance(data.get("captions"), list)):
    return None
  if len(data["captions"]) != num_scenes:
    raise ValueError(f"{json_path}: {len(data['captions'])} captions for {num_scenes} "
                     f"scenes in {dataset_path}")
  return [str(c) for c in data["captions"]]


def _names(meta):
  """(concept_names, value_names) from metadata: concept_names + concept_values / value_names,
  or names = {concept: [value names]}."""
  concept_names = meta.get("concept_names")
  value_names = meta.get("value_names", meta.get("concept_values"))
  names = meta.get("names")
  if isinstance(names, dict) and all(isinstance(v, list) for v in names.values()):
    concept_names = concept_names or list(names)
    value_names = value_names or list(names.values())
  return concept_names, value_names


def _match_rows(num_rows, num_objects, path, dataset_path):
  """Which scenes the embedding rows belong to: all, or the 2-object scenes."""
  if num_rows == num_objects.shape[0]:
    return None, "all"
  two = np.flatnonzero(num_objects == 2)
  if num_rows == two.size:
    return two, "two_object_scenes"
  raise ValueError(f"{path}: {num_rows} embedding rows, but {dataset_path} has "
                   f"{num_objects.shape[0]} scenes ({two.size} with two objects); expected "
                   "one row per scene or per 2-object scene")
