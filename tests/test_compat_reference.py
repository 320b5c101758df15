"""bindjax.frozen.compat.reference and `bindjax import`: folders of the original code, without
torch."""
import glob
import json
import os
import pickle
import shutil

import ml_dtypes
import numpy as np
import pytest

from bindjax.commands import main as cli
from bindjax.frozen.compat import reference
from bindjax.frozen.compat import safe_pickle
from bindjax.frozen.compat import torch_format
from bindjax.frozen import embeddings

DATA = os.path.join(os.path.dirname(__file__), "data", "clevr_text")
PT_NAME = os.path.relpath(glob.glob(os.path.join(DATA, "embeddings", "*.pt"))[0], DATA)


def test_clevr_text_folder():
  es = reference.read_reference_folder(DATA)
  assert es.embeddings.shape == (600, 384) and es.embeddings.dtype == np.float32
  np.testing.assert_array_equal(es.embeddings, np.load(os.path.join(DATA, "embeddings.npy")))
  assert es.values_per_concept == (8, 3) and es.max_objects == 2
  assert (es.num_objects[:24] == 1).all() and (es.num_objects[24:] == 2).all()
  assert es.objects[:24, 0].tolist() == [[a, n] for a in range(8) for n in range(3)]
  assert es.objects[25].tolist() == [[0, 0], [0, 1]]  # pairs row-major over a*3+n
  assert es.concept_names == ["attribute", "noun"]
  assert es.value_names[1] == ["cube", "cylinder", "sphere"]
  assert es.captions[0] == "a blue cube" and es.captions[25] == "a blue cube and a blue cylinder"
  assert es.provenance["model"] == "sentence-transformers/all-MiniLM-L6-v2"
  assert es.provenance["embeddings_file"] == "clevr_text_minilm_embeddings.pkl"
  ids, unique = es.object_ids()
  assert unique.shape == (24, 2) and ids[:24, 0].tolist() == list(range(24))
  assert es.two_object_rows().tolist() == list(range(24, 600)) and es.probes == {}


def test_clevr_text_trained_embeddings_with_probes():
  es = reference.read_reference_folder(DATA, embeddings_file=PT_NAME)
  assert es.embeddings.shape == (576, 384) and es.provenance["rows"] == "two_object_scenes"
  np.testing.assert_array_equal(es.embeddings,
                                np.load(os.path.join(DATA, "embeddings.npy"))[24:])
  assert {k: v.shape for k, v in es.probes.items()} == {
      "concept_0": (8, 384), "concept_1": (3, 384), "object": (24, 384)}
  assert es.provenance["similarity"] == "dot" and es.captions[0] == "a blue cube and a blue cube"
  # The probes were fitted on these scenes (briefly): concept probes separate every scene's
  # values from the others; the object probe's best object is one of the scene's (row order).
  ids, _ = es.object_ids()
  for name, labels in [("concept_0", es.objects[:, :, 0]), ("concept_1", es.objects[:, :, 1]),
                       ("object", ids)]:
    logits = es.embeddings @ es.probes[name].T
    positive = np.zeros(logits.shape, bool)
    np.put_along_axis(positive, labels, True, axis=1)
    separated = (np.where(positive, logits, np.inf).min(1) >
                 np.where(positive, -np.inf, logits).max(1))
    top1 = positive[np.arange(len(logits)), logits.argmax(1)]
    assert top1.mean() > 0.95, name
    if name != "object":
      assert separated.all(), name
  # Absolute path and embeddings.npy work the same.
  same = reference.read_reference_folder(DATA, os.path.join(DATA, "embeddings.npy"))
  np.testing.assert_array_equal(same.embeddings, np.load(os.path.join(DATA, "embeddings.npy")))


def _folder(tmp_path, scenes, embeddings_obj, meta=None, name="x_embeddings.pkl",
            torch_save=False, dataset_bytes=None):
  folder = tmp_path / "ref"
  folder.mkdir()
  (folder / "dataset.pkl").write_bytes(dataset_bytes or pickle.dumps(scenes))
  meta = meta or {"num_objects": 2, "num_concepts": 2, "values_per_concept": [3, 2]}
  (folder / "metadata.json").write_text(json.dumps(meta))
  if torch_save:
    torch_format.save(embeddings_obj, folder / name)
  else:
    (folder / name).write_bytes(pickle.dumps(embeddings_obj))
  return folder


SCENES = [[[np.int64(0), np.int64(1)]], [[2, 0], [0, 1]], [[1, 1], [2, 0]]]


@pytest.mark.parametrize("kind", ["numpy", "dict", "torch16", "bf16", "npy"])
def test_embedding_file_kinds_and_metadata_forms(tmp_path, kind):
  values = np.arange(12, dtype=np.float32).reshape(3, 4) / 8
  meta = {"num_objects": 2, "num_concepts": 2, "num_values_per_concept": [3, 2]}
  name, torch_save, obj = "x_embeddings.pkl", False, values
  if kind == "dict":
    obj = {"embeddings": values, "extra": "ignored"}
    meta = {"num_objects": 2, "num_concepts": 2, "values_per_concept": 3}
  elif kind == "torch16":
    obj, torch_save = {"embeddings": values.astype(np.float16)}, True
  elif kind == "bf16":
    obj, torch_save = values.astype(ml_dtypes.bfloat16), True
  folder = _folder(tmp_path, SCENES, obj, meta, name=name, torch_save=torch_save)
  if kind == "npy":
    os.remove(folder / name)
    np.save(folder / "embeddings.npy", values)
  es = reference.read_reference_folder(folder)
  np.testing.assert_array_equal(es.embeddings, values)  # exact in float16 and bfloat16 too
  assert es.embeddings.dtype == np.float32
  assert es.values_per_concept == ((3, 3) if kind == "dict" else (3, 2))
  assert es.scenes() == [[[0, 1]], [[2, 0], [0, 1]], [[1, 1], [2, 0]]]


def test_state_dict_probes_and_bias_checks(tmp_path):
  rng = np.random.default_rng(0)
  obj = {"embeddings": rng.normal(size=(2, 4)).astype(np.float32),
         "probes_single_concept": {"0": {"weight": np.ones((3, 4), np.float32),
                                         "bias": np.zeros(3, np.float32)},
                                   "1": np.ones((2, 4), np.float32)},
         "probes_object": {"1": {"weight": np.ones((3, 4), np.float32)}}}
  folder = _folder(tmp_path, SCENES, obj, name="scene_embeddings.pkl", torch_save=True)
  es = reference.read_reference_folder(folder)
  assert es.provenance["rows"] == "two_object_scenes" and es.num_scenes == 2
  assert {k: v.shape for k, v in es.probes.items()} == {"concept_0": (3, 4), "concept_1": (2, 4),
                                                        "object": (3, 4)}
  obj["probes_single_concept"]["0"]["bias"] = np.ones(3, np.float32)
  torch_format.save(obj, folder / "scene_embeddings.pkl")
  with pytest.raises(ValueError, match="non-zero bias"):
    reference.read_reference_folder(folder)


@pytest.mark.parametrize("case,message", [
    ("rows", r"5 embedding rows, but .*dataset.pkl has 3 scenes \(2 with two objects\)"),
    ("range", r"value 2 of concept 1 \(scene 2, object 0\) is out of range 0..1"),
    ("ragged", r"scene 1, object 1: expected 2 integer values"),
    ("too_many", r"scene 1 has 3 objects, more than max_objects=2"),
    ("probe_dim", r"probe 'concept_0' has input width 5 but the embeddings are 4-d"),
    ("object_probe_rows", r"probes\['object'\]: expected 3 rows, got 4"),
    ("nan", r"rows contain NaN or inf: rows \[1\]"),
    ("meta", r"num_concepts=3 but values_per_concept has 2 entries"),
    ("meta_int", r"num_concepts is needed"),
    ("refused", r"refusing to load global 'posix.system'"),
    ("dict", r"dict without an 'embeddings' entry"),
])
def test_reference_errors(tmp_path, case, message):
  scenes = [list(map(list, s)) for s in SCENES]
  values = np.zeros((3, 4), np.float32)
  meta, obj, dataset_bytes = None, values, None
  if case == "rows":
    obj = np.zeros((5, 4), np.float32)
  elif case == "range":
    scenes[2][0] = [1, 2]
  elif case == "ragged":
    scenes[1][1] = [0, 1, 1]
  elif case == "too_many":
    scenes[1].append([0, 0])
  elif case == "probe_dim":
    obj = {"embeddings": values, "probes_single_concept": {"0": np.zeros((3, 5), np.float32)}}
  elif case == "object_probe_rows":
    obj = {"embeddings": values, "probes_object": {"1": np.zeros((4, 4), np.float32)}}
  elif case == "nan":
    values[1, 3] = np.nan
  elif case == "meta":
    meta = {"num_objects": 2, "num_concepts": 3, "values_per_concept": [3, 2]}
  elif case == "meta_int":
    meta = {"num_objects": 2, "values_per_concept": 3}
  elif case == "refused":
    dataset_bytes = b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00trueq\x85R."
  elif case == "dict":
    obj = {"embedding": values}
  folder = _folder(tmp_path, scenes, obj, meta, dataset_bytes=dataset_bytes)
  error = safe_pickle.RefusedGlobalError if case == "refused" else ValueError
  with pytest.raises(error, match=message):
    reference.read_reference_folder(folder)


def test_choosing_the_embeddings_file(tmp_path):
  folder = _folder(tmp_path, SCENES, np.zeros((3, 4), np.float32))
  (folder / "y_embeddings.pkl").write_bytes(pickle.dumps(np.ones((3, 4), np.float32)))
  with pytest.raises(ValueError, match="several embeddings files"):
    reference.read_reference_folder(folder)
  assert reference.read_reference_folder(folder, "y_embeddings.pkl").embeddings.sum() == 12
  with pytest.raises(ValueError, match="nope.pkl not found"):
    reference.read_reference_folder(folder, "nope.pkl")
  with pytest.raises(ValueError, match="metadata.json missing"):
    reference.read_reference_folder(tmp_path)


def test_import_command(tmp_path, capsys):
  out = tmp_path / "native"
  assert cli.main(["import", f"--reference={DATA}", f"--out={out}", f"--embeddings={PT_NAME}"]) == 0
  assert "576 scenes x 384 dims" in capsys.readouterr().out
  es = embeddings.EmbeddingSet.load(out)
  expected = reference.read_reference_folder(DATA, PT_NAME)
  np.testing.assert_array_equal(es.embeddings, expected.embeddings)
  np.testing.assert_array_equal(es.probes["object"], expected.probes["object"])
  assert es.captions == expected.captions and es.provenance == expected.provenance
  with pytest.raises(SystemExit) as e:   # a non-empty --out is a usage error
    cli.main(["import", f"--reference={DATA}", f"--out={out}"])
  assert e.value.code == 2 and "--overwrite" in capsys.readouterr().err
  assert cli.main(["import", f"--reference={DATA}", f"--out={out}", "--overwrite"]) == 0
  assert embeddings.read_embeddings(out).num_scenes == 600
  with pytest.raises(SystemExit) as e:   # bad input data
    cli.main(["import", f"--reference={tmp_path}", f"--out={tmp_path / 'o'}"])
  assert e.value.code == 1 and "metadata.json missing" in capsys.readouterr().err
  with pytest.raises(SystemExit) as e:
    cli.main(["import", f"--out={out}"])
  assert e.value.code == 2


def test_import_command_tfds(tmp_path):
  folder = tmp_path / "ref"
  shutil.copytree(DATA, folder)
  os.remove(folder / "embeddings.npy")
  assert cli.main(["import", f"--reference={folder}", f"--out={tmp_path / 'tf'}", "--tfds"]) == 0
  es = embeddings.read_embeddings(tmp_path / "tf")
  np.testing.assert_array_equal(es.embeddings, np.load(os.path.join(DATA, "embeddings.npy")))
  assert es.num_scenes == 600 and es.captions[599].startswith("a yellow sphere and")


def test_names_from_metadata_names_dict(tmp_path):
  meta = {"num_objects": 2, "values_per_concept": [3, 2],
          "names": {"color": ["r", "g", "b"], "shape": ["cube", "ball"]}}
  folder = _folder(tmp_path, SCENES, np.zeros((3, 4), np.float32), meta)
  es = reference.read_reference_folder(folder)
  assert es.concept_names == ["color", "shape"] and es.value_names[1] == ["cube", "ball"]
  assert es.captions is None and "EmbeddingSet(N=3, D=4" in repr(es)
