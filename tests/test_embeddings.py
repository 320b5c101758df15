"""bindjax.frozen.embeddings.EmbeddingSet and bindjax.frozen.tfds_builder."""
import json
import os
import stat

import numpy as np
import pytest

from bindjax.frozen import embeddings
from bindjax.frozen.embeddings import EmbeddingSet

# Two concepts (V = 3, 2), up to 2 objects; object ids by first appearance: (0,1)=0, (2,0)=1,
# (1,1)=2, (0,0)=3.
SCENES = [[[0, 1]], [[2, 0], [0, 1]], [[1, 1], [2, 0]], [[0, 0], [0, 0]], [[2, 0], [1, 1]]]


def _set(n_dim=4, **kwargs):
  rng = np.random.default_rng(0)
  return EmbeddingSet.from_scenes(rng.normal(size=(len(SCENES), n_dim)), SCENES, (3, 2),
                                  **kwargs)


def test_from_scenes_pads_and_casts():
  es = _set()
  assert es.embeddings.dtype == np.float32 and es.objects.dtype == np.int32
  assert es.objects.shape == (5, 2, 2) and es.num_objects.tolist() == [1, 2, 2, 2, 2]
  assert es.objects[0].tolist() == [[0, 1], [-1, -1]]
  assert es.scenes() == SCENES
  assert (es.num_scenes, es.dim, es.max_objects, es.num_concepts) == (5, 4, 2, 2)


def test_object_ids_first_appearance_order():
  ids, unique = _set().object_ids()
  assert ids.tolist() == [[0, -1], [1, 0], [2, 1], [3, 3], [1, 2]]
  assert unique.tolist() == [[0, 1], [2, 0], [1, 1], [0, 0]]
  assert ids.dtype == np.int32 and unique.dtype == np.int32
  assert _set().two_object_rows().tolist() == [1, 2, 3, 4]


def test_subset_reorders_object_probe():
  es = _set()
  es.probes = {"object": np.arange(16, dtype=np.float32).reshape(4, 4),
               "concept_0": np.ones((3, 4), np.float32)}
  es.captions = [f"s{i}" for i in range(5)]
  es.validate()
  sub = es.subset([4, 3])  # objects (2,0), (1,1), (0,0): old ids 1, 2, 3
  assert sub.scenes() == [SCENES[4], SCENES[3]] and sub.captions == ["s4", "s3"]
  np.testing.assert_array_equal(sub.probes["object"], es.probes["object"][[1, 2, 3]])
  np.testing.assert_array_equal(sub.probes["concept_0"], es.probes["concept_0"])
  sub.validate()
  mask = np.array([False, True, True, False, False])
  assert es.subset(mask).scenes() == SCENES[1:3]
  with pytest.raises(ValueError, match="rows must be in"):
    es.subset([7])


def _bad(**changes):
  es = _set()
  for key, value in changes.items():
    setattr(es, key, value)
  return es


@pytest.mark.parametrize("changes,message", [
    ({"embeddings": np.zeros((4, 4), np.float32)}, r"objects: expected shape \[N=4"),
    ({"embeddings": np.zeros(5, np.float32)}, r"expected a \[N, D\] array"),
    ({"values_per_concept": (2, 2)}, r"value 2 of concept 0 \(scene 1, object 0\) is out of "
                                     r"range 0..1.*rows \[1, 2, 4\]"),
    ({"values_per_concept": (3, 2, 4)}, r"objects: expected shape \[N=5, K, C=3\]"),
    ({"num_objects": np.array([1, 2, 2, 3, 2], np.int32)}, r"rows \[3\] have counts \[3\], "
                                                           r"expected 0..2"),
    ({"num_objects": np.array([1, 1, 2, 2, 2], np.int32)}, r"past num_objects must be -1.*"
                                                           r"rows \[1\]"),
    ({"concept_names": ["a"]}, "concept_names: expected 2 names"),
    ({"value_names": [["a", "b", "c"], ["x"]]}, r"value_names: expected \[3, 2\]"),
    ({"captions": ["x"]}, "captions: expected 5 captions"),
    ({"probes": {"concept_0": np.zeros((3, 5), np.float32)}}, r"\[rows, D=4\]"),
    ({"probes": {"concept_1": np.zeros((3, 4), np.float32)}}, "expected 2 rows, got 3"),
    ({"probes": {"object": np.zeros((5, 4), np.float32)}}, "expected 4 rows, got 5"),
    ({"probes": {"concept_2": np.zeros((3, 4), np.float32)}}, "no concept 2"),
])
def test_validation_errors(changes, message):
  with pytest.raises(ValueError, match=message):
    _bad(**changes).validate()


def test_nan_and_inf_rows_are_named():
  es = _set()
  es.embeddings[1, 2] = np.nan
  es.embeddings[3, 0] = np.inf
  with pytest.raises(ValueError, match=r"2 rows contain NaN or inf: rows \[1, 3\]"):
    es.validate()


def test_from_scenes_errors():
  with pytest.raises(ValueError, match=r"scene 1, object 0: expected 2 integer values"):
    EmbeddingSet.from_scenes(np.zeros((2, 3)), [[[0, 1]], [[0, 1, 1]]], (2, 2))
  with pytest.raises(ValueError, match=r"scene 0, object 0: expected 2 integer values"):
    EmbeddingSet.from_scenes(np.zeros((1, 3)), [[[0.5, 1]]], (2, 2))
  with pytest.raises(ValueError, match=r"does not match the 2 scenes"):
    EmbeddingSet.from_scenes(np.zeros((3, 3)), [[[0, 1]], [[1, 1]]], (2, 2))
  with pytest.raises(ValueError, match="more than max_objects=1"):
    EmbeddingSet.from_scenes(np.zeros((1, 3)), [[[0, 1], [1, 1]]], (2, 2), max_objects=1)


def test_save_load_round_trip_and_overwrite(tmp_path):
  es = _set(concept_names=["color", "shape"], value_names=[["r", "g", "b"], ["cube", "ball"]],
            captions=[f"c{i}" for i in range(5)], provenance={"model": "m", "n": np.int64(3)},
            probes={"object": np.ones((4, 4)), "concept_1": np.zeros((2, 4))})
  target = tmp_path / "set"
  es.save(target)
  assert sorted(os.listdir(target)) == ["embeddings.npz", "metadata.json"]
  assert os.listdir(tmp_path) == ["set"]  # no temporary directories left
  assert stat.S_IMODE(os.stat(target).st_mode) & 0o055  # not private like mkdtemp's
  back = EmbeddingSet.load(target)
  np.testing.assert_array_equal(back.embeddings, es.embeddings)
  np.testing.assert_array_equal(back.objects, es.objects)
  assert back.values_per_concept == (3, 2) and back.captions == es.captions
  assert back.concept_names == ["color", "shape"] and back.value_names == es.value_names
  assert back.provenance == {"model": "m", "n": 3}
  assert sorted(back.probes) == ["concept_1", "object"]
  assert embeddings.read_embeddings(target).num_scenes == 5
  with pytest.raises(FileExistsError, match="overwrite"):
    es.save(target)
  es.subset([0, 1]).save(target, overwrite=True)
  assert EmbeddingSet.load(target).num_scenes == 2
  assert os.listdir(tmp_path) == ["set"]


def test_save_refuses_invalid_set_and_leaves_nothing(tmp_path):
  es = _set()
  es.embeddings[0, 0] = np.nan
  with pytest.raises(ValueError, match="NaN"):
    es.save(tmp_path / "x")
  assert not os.listdir(tmp_path)


def test_load_errors_name_the_file(tmp_path):
  with pytest.raises(ValueError, match="metadata.json missing"):
    EmbeddingSet.load(tmp_path)
  _set().save(tmp_path / "s")
  meta_path = tmp_path / "s" / "metadata.json"
  meta = json.loads(meta_path.read_text())
  meta["values_per_concept"] = [2, 2]
  meta_path.write_text(json.dumps(meta))
  with pytest.raises(ValueError, match=r"s: objects: value 2 of concept 0"):
    EmbeddingSet.load(tmp_path / "s")
  meta["format"] = "other"
  meta_path.write_text(json.dumps(meta))
  with pytest.raises(ValueError, match="format 'other'"):
    EmbeddingSet.load(tmp_path / "s")
  with pytest.raises(ValueError, match="not an embedding set"):
    embeddings.read_embeddings(tmp_path)


def test_tfds_round_trip_in_order_without_tensorflow(tmp_path):
  import sys  # pylint: disable=g-import-not-at-top
  from bindjax.frozen import tfds_builder  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  scenes = [SCENES[i % 5] for i in range(23)]
  es = EmbeddingSet.from_scenes(rng.normal(size=(23, 6)), scenes, (3, 2),
                                captions=[f"scene {i}" for i in range(23)],
                                value_names=[["a", "b", "c"], ["x", "y"]],
                                provenance={"source": "test"},
                                probes={"concept_0": rng.normal(size=(3, 6))})
  path = tfds_builder.write_embedding_set(es, tmp_path / "tf", rows_per_example=4)
  assert path.endswith(os.path.join("tf", "bindjax_embeddings", "1.0.0"))
  assert "tensorflow" not in sys.modules
  assert sorted(os.listdir(tmp_path)) == ["tf"]
  back = embeddings.read_embeddings(tmp_path / "tf")
  np.testing.assert_array_equal(back.embeddings, es.embeddings)
  np.testing.assert_array_equal(back.objects, es.objects)
  np.testing.assert_array_equal(back.num_objects, es.num_objects)
  np.testing.assert_array_equal(back.probes["concept_0"], es.probes["concept_0"].astype(
      np.float32))
  assert back.captions == es.captions and back.value_names == es.value_names
  assert back.provenance == {"source": "test"}
  source = tfds_builder.EmbeddingSource(path)
  assert len(source) == 23
  assert [c.num_scenes for c in source.iter_chunks(10)] == [10, 10, 3]
  np.testing.assert_array_equal(source.read([5, 2])["embedding"], es.embeddings[[5, 2]])
  assert source.read([9, 3, 9])["caption"] == ["scene 9", "scene 3", "scene 9"]
  # Records out of order (as shuffled TFDS writes would be): blocks are found by row index.
  records = source._source  # pylint: disable=protected-access
  assert len(records) == 6  # 23 rows in blocks of 4
  order = rng.permutation(6)

  class Shuffled:
    def __len__(self):
      return 6

    def __getitem__(self, index):
      return records[int(order[index])]

    def __getitems__(self, indices):
      return records.__getitems__([int(order[i]) for i in indices])

  source._source = Shuffled()  # pylint: disable=protected-access
  got = source.read([0, 22, 7, 8])
  np.testing.assert_array_equal(got["embedding"], es.embeddings[[0, 22, 7, 8]])
  np.testing.assert_array_equal(got["objects"], es.objects[[0, 22, 7, 8]])
  with pytest.raises(FileExistsError):
    tfds_builder.write_embedding_set(es, tmp_path / "tf")


def test_tfds_write_chunks_checks_chunks(tmp_path):
  from bindjax.frozen import tfds_builder  # pylint: disable=g-import-not-at-top
  good = _set()
  other = EmbeddingSet.from_scenes(np.zeros((1, 5)), [[[0, 1]]], (3, 2), max_objects=2)
  with pytest.raises(ValueError, match=r"chunk 1: .*dim=5.*expected \[3, 2\], 4, 2"):
    tfds_builder.write_chunks([good, other], tmp_path / "x", values_per_concept=(3, 2), dim=4,
                              max_objects=2)
  assert not os.listdir(tmp_path)
  # Chunk and block boundaries do not line up: rows still come back in order.
  chunks = [good.subset([0, 1]), good.subset([2]), good.subset([3, 4]), good.subset([])]
  tfds_builder.write_chunks(chunks, tmp_path / "y", values_per_concept=(3, 2), dim=4,
                            max_objects=2, rows_per_example=3)
  back = tfds_builder.read_embedding_set(tmp_path / "y")
  np.testing.assert_array_equal(back.embeddings, good.embeddings)
  assert back.scenes() == SCENES and back.captions is None


def test_tfds_empty_and_bad_reads(tmp_path):
  from bindjax.frozen import tfds_builder  # pylint: disable=g-import-not-at-top
  path = tfds_builder.write_embedding_set(_set(), tmp_path / "tf")
  source = tfds_builder.EmbeddingSource(path)
  assert source.read([])["embedding"].shape == (0, 4)
  with pytest.raises(ValueError, match=r"rows must be in \[0, 5\)"):
    source.read([5])
  with pytest.raises(ValueError, match="not a bindjax TFDS embedding set"):
    tfds_builder.EmbeddingSource(tmp_path)
