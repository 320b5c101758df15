"""bindjax.frozen.compat.torch_format / torch_random: torch files and randperm without torch."""
import glob
import io
import os
import pickle
import struct
import zipfile

import numpy as np
import pytest

from bindjax.frozen.compat import safe_pickle
from bindjax.frozen.compat import torch_format
from bindjax.frozen.compat import torch_random

DATA = os.path.join(os.path.dirname(__file__), "data", "clevr_text")
PT_FILE = glob.glob(os.path.join(DATA, "embeddings", "trained_embeddings_*.pt"))[0]
_G = torch_format._Global  # pylint: disable=protected-access


class _View:
  """A tensor view (offset/size/stride) on a storage array, for hand-written test files."""

  def __init__(self, storage, offset, size, stride, rebuild="_rebuild_tensor_v2"):
    self.storage, self.offset, self.size, self.stride = storage, offset, size, stride
    self.rebuild = rebuild


class _Writer(pickle._Pickler):  # pylint: disable=protected-access
  """Writes torch-style pickles: zip (5-tuple pids) or legacy (6-tuple pids)."""

  def __init__(self, file, legacy, storage_name="FloatStorage"):
    super().__init__(file, protocol=2)
    self.legacy, self.storage_name, self.storages = legacy, storage_name, []

  def persistent_id(self, obj):
    if isinstance(obj, _StorageBox):
      if obj not in self.storages:
        self.storages.append(obj)
      pid = ("storage", _G("torch", self.storage_name), obj.key, "cpu", obj.array.size)
      return pid + (None,) if self.legacy else pid
    return None

  def reducer_override(self, obj):
    if isinstance(obj, _View):
      box = _StorageBox(str(len(self.storages)), obj.storage)
      args = (box, obj.offset, obj.size, obj.stride)
      if obj.rebuild == "_rebuild_tensor_v2":
        args += (False, torch_format._OrderedDictLiteral())  # pylint: disable=protected-access
      return (_G("torch._utils", obj.rebuild), args)
    return NotImplemented

  def save_global(self, obj, name=None):
    if isinstance(obj, _G):
      self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
      self.memoize(obj)
      return
    super().save_global(obj, name)


class _StorageBox:

  def __init__(self, key, array):
    self.key, self.array = key, array


def _legacy_bytes(obj, storage_name="FloatStorage", byteorder="little"):
  out = io.BytesIO()
  for header in (torch_format.LEGACY_MAGIC, torch_format.LEGACY_PROTOCOL,
                 {"protocol_version": 1001, "little_endian": byteorder == "little",
                  "type_sizes": {"short": 2, "int": 4, "long": 4}}):
    pickle.dump(header, out, protocol=2)
  writer = _Writer(out, legacy=True, storage_name=storage_name)
  writer.dump(obj)
  pickle.dump([b.key for b in writer.storages], out, protocol=2)
  end = "<" if byteorder == "little" else ">"
  for box in writer.storages:
    out.write(struct.pack(end + "q", box.array.size))
    out.write(box.array.astype(box.array.dtype.newbyteorder(end)).tobytes())
  return out.getvalue()


def _zip_file(path, obj, storage_name="FloatStorage", byteorder="little"):
  buffer = io.BytesIO()
  writer = _Writer(buffer, legacy=False, storage_name=storage_name)
  writer.dump(obj)
  end = "<" if byteorder == "little" else ">"
  with zipfile.ZipFile(path, "w") as archive:
    archive.writestr("some_name/data.pkl", buffer.getvalue())
    archive.writestr("some_name/byteorder", byteorder)
    for box in writer.storages:
      archive.writestr(f"some_name/data/{box.key}",
                       box.array.astype(box.array.dtype.newbyteorder(end)).tobytes())


def test_real_legacy_pickled_tensor_matches_numpy_copy():
  array = torch_format.load(os.path.join(DATA, "clevr_text_minilm_embeddings.pkl"))
  expected = np.load(os.path.join(DATA, "embeddings.npy"))
  assert array.dtype == np.float32 and array.shape == (600, 384)
  np.testing.assert_array_equal(array, expected)


def test_real_pt_zip_with_whole_linear_modules():
  out = torch_format.load(PT_FILE)
  expected = np.load(os.path.join(DATA, "embeddings.npy"))
  np.testing.assert_array_equal(out["embeddings"], expected[24:])
  concept = out["probes_single_concept"]
  assert isinstance(concept, safe_pickle.ModuleState)
  assert concept.torch_class == "torch.nn.modules.container.ModuleDict"
  assert concept["0"].torch_class == "torch.nn.modules.linear.Linear"
  assert concept["0"].parameters["weight"].shape == (8, 384)
  assert concept["0"].parameters["bias"] is None
  assert concept["1"].attributes["out_features"] == 3
  assert out["probes_object"].state_dict()["1.weight"].shape == (24, 384)
  assert out["similarity"] == "dot" and out["sim_scale"] == 1.0
  assert np.isfinite(concept["1"].parameters["weight"]).all()


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_views_offsets_strides_and_byte_order(tmp_path, legacy, byteorder):
  storage = np.arange(12, dtype=np.float32)
  obj = {"t": _View(storage, 2, (2, 3), (1, 2)),  # transposed view starting at element 2
         "v1": _View(storage, 0, (4,), (3,), rebuild="_rebuild_tensor"),
         "empty": _View(storage, 0, (0, 3), (3, 1)), "n": 5}
  path = tmp_path / "f.pt"
  if legacy:
    path.write_bytes(_legacy_bytes(obj, byteorder=byteorder))
  else:
    _zip_file(path, obj, byteorder=byteorder)
  out = torch_format.load(path)
  np.testing.assert_array_equal(out["t"], [[2, 4, 6], [3, 5, 7]])
  np.testing.assert_array_equal(out["v1"], [0, 3, 6, 9])
  assert out["empty"].shape == (0, 3) and out["n"] == 5
  assert out["t"].flags.c_contiguous and out["t"].flags.writeable


@pytest.mark.parametrize("legacy", [False, True])
def test_bfloat16_and_half_storages(tmp_path, legacy):
  values = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
  bits = (values.view(np.uint32) >> 16).astype(np.uint16)  # exact bfloat16 values
  half = values.astype(np.float16)
  for name, storage, expected in [("BFloat16Storage", bits, values),
                                  ("HalfStorage", half, half)]:
    obj = [_View(storage, 0, (2, 2), (2, 1))]
    path = tmp_path / f"{name}.pt"
    if legacy:
      path.write_bytes(_legacy_bytes(obj, storage_name=name))
    else:
      _zip_file(path, obj, storage_name=name)
    (out,) = torch_format.load(path)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out, expected.reshape(2, 2))


class _PickledTensor:
  """What pickle.dump(tensor) writes: a rebuild on torch.storage._load_from_bytes(legacy)."""

  def __init__(self, legacy_bytes, offset, size, stride):
    self.args = (_LoadFromBytes(legacy_bytes), offset, size, stride, False,
                 torch_format._OrderedDictLiteral())  # pylint: disable=protected-access

  def __reduce__(self):
    return (_G("torch._utils", "_rebuild_tensor_v2"), self.args)


class _LoadFromBytes:

  def __init__(self, raw):
    self.raw = raw

  def __reduce__(self):
    return (_G("torch.storage", "_load_from_bytes"), (self.raw,))


def test_pickle_dump_of_tensor_nests_legacy_bytes(tmp_path):
  inner = _legacy_bytes(_StorageBox("9", np.arange(6, dtype=np.float32)))
  buffer = io.BytesIO()
  _Writer(buffer, legacy=False).dump(_PickledTensor(inner, 1, (2, 2), (2, 1)))
  path = tmp_path / "x_embeddings.pkl"
  path.write_bytes(buffer.getvalue())
  np.testing.assert_array_equal(torch_format.load(path), [[1, 2], [3, 4]])


def test_save_round_trip_all_dtypes(tmp_path):
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  arrays = {
      "f64": np.linspace(0, 1, 5), "f32": np.arange(6, dtype=np.float32).reshape(2, 3).T,
      "f16": np.array([0.5, 2], np.float16), "i64": np.array([-1, 2**40]),
      "i32": np.array([[1]], np.int32), "i16": np.array([3], np.int16),
      "i8": np.array([-3], np.int8), "u8": np.array([250], np.uint8),
      "b": np.array([True, False]), "scalar": np.array(3.5, np.float32),
      "empty": np.zeros((0, 4), np.float32),
      "bf16": np.array([1.5, -2], ml_dtypes.bfloat16),
  }
  obj = {"state": arrays, "step": 7, "name": "x", "list": [np.ones(2, np.float32)],
         "nested": {"a": (1, 2)}}
  path = tmp_path / "ckpt.pt"
  torch_format.save(obj, path)
  assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]
  with zipfile.ZipFile(path) as archive:
    names = archive.namelist()
    assert "archive/data.pkl" in names and "archive/data/0" in names
    for info in archive.infolist():  # torch aligns member data to 64 bytes
      if "/data/" in info.filename:
        offset = info.header_offset + 30 + len(info.filename) + len(info.extra)
        assert offset % 64 == 0
  out = torch_format.load(path)
  assert out["step"] == 7 and out["name"] == "x" and out["nested"] == {"a": (1, 2)}
  np.testing.assert_array_equal(out["list"][0], [1, 1])
  for key, array in arrays.items():
    expected = array.astype(np.float32) if key == "bf16" else array
    assert out["state"][key].dtype == expected.dtype, key
    np.testing.assert_array_equal(out["state"][key], expected)


def test_save_refuses_unsupported_dtype(tmp_path):
  with pytest.raises(ValueError, match="complex128"):
    torch_format.save({"x": np.ones(2, np.complex128)}, tmp_path / "x.pt")
  assert not os.listdir(tmp_path)


def test_plain_pickles_and_refusal_inside_torch_files(tmp_path):
  path = tmp_path / "plain.pkl"
  path.write_bytes(pickle.dumps({"embeddings": np.ones((2, 3), np.float32)}))
  assert torch_format.load(path)["embeddings"].shape == (2, 3)
  bad = tmp_path / "bad.pt"
  with zipfile.ZipFile(bad, "w") as archive:
    archive.writestr("a/data.pkl", b"\x80\x02cposix\nsystem\nX\x04\x00\x00\x00trueq\x85R.")
  with pytest.raises(safe_pickle.RefusedGlobalError, match="posix.system"):
    torch_format.load(bad)
  junk = tmp_path / "junk.pt"
  junk.write_bytes(b"not a pickle")
  with pytest.raises(ValueError, match="junk.pt"):
    torch_format.load(junk)


def test_torch_cross_check(tmp_path):
  torch = pytest.importorskip("torch")
  array = torch_format.load(os.path.join(DATA, "clevr_text_minilm_embeddings.pkl"))
  with open(os.path.join(DATA, "clevr_text_minilm_embeddings.pkl"), "rb") as f:
    reference = pickle.load(f)
  np.testing.assert_array_equal(array, reference.numpy())
  expected = torch.load(PT_FILE, weights_only=False)
  out = torch_format.load(PT_FILE)
  np.testing.assert_array_equal(out["embeddings"], expected["embeddings"].numpy())
  np.testing.assert_array_equal(out["probes_object"]["1"].parameters["weight"],
                                expected["probes_object"]["1"].weight.detach().numpy())
  saved = tmp_path / "s.pt"
  torch_format.save({"w": np.arange(6, dtype=np.float32).reshape(2, 3).T}, saved)
  np.testing.assert_array_equal(torch.load(saved)["w"].numpy(), [[0, 3], [1, 4], [2, 5]])
  assert torch.randperm(576, generator=torch.Generator().manual_seed(3)).tolist() == (
      torch_random.randperm(576, 3).tolist())


def test_randperm_matches_spec_values():
  assert torch_random.randperm(576, 0)[:10].tolist() == [44, 465, 429, 210, 419, 380, 163,
                                                         207, 49, 315]
  assert torch_random.randperm(24, 0)[:12].tolist() == [20, 5, 3, 12, 7, 2, 13, 17, 4, 1, 19,
                                                        22]
  perm = torch_random.randperm(1000, 123)
  assert sorted(perm.tolist()) == list(range(1000)) and perm.dtype == np.int64
  assert torch_random.randperm(0, 0).shape == (0,) and torch_random.randperm(1, 5).tolist() == [0]
  assert not np.array_equal(torch_random.randperm(50, 1), torch_random.randperm(50, 2))
  with pytest.raises(ValueError, match="n must be"):
    torch_random.randperm(-1, 0)
  with pytest.raises(ValueError, match="seed"):
    torch_random.randperm(3, 0.5)


def test_truncated_storage_names_the_file(tmp_path):
  path = tmp_path / "short.pt"
  torch_format.save({"w": np.arange(8, dtype=np.float32)}, path)
  with zipfile.ZipFile(path) as archive:
    members = {n: archive.read(n) for n in archive.namelist()}
  members["archive/data/0"] = members["archive/data/0"][:12]
  with zipfile.ZipFile(path, "w") as archive:
    for name, raw in members.items():
      archive.writestr(name, raw)
  with pytest.raises(ValueError, match=r"short.pt: .*needs 32 bytes, the file holds 12"):
    torch_format.load(path)
