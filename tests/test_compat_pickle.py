"""bindjax.frozen.compat.safe_pickle: only torch/numpy data globals load; anything else is
refused."""
import collections
import io
import os
import pickle
import subprocess

import numpy as np
import pytest

from bindjax.frozen.compat import safe_pickle


class _Exploit:
  """Pickles as a call to `func(*args)` (what a hostile file does)."""

  def __init__(self, func, args):
    self.func, self.args = func, args

  def __reduce__(self):
    return (self.func, self.args)


@pytest.mark.parametrize("func,name", [
    (os.system, f"{os.system.__module__}.system"),
    (eval, "builtins.eval"),
    (subprocess.call, "subprocess.call"),
])
def test_code_running_pickle_is_refused_and_nothing_runs(tmp_path, func, name):
  marker = tmp_path / "pwned"
  if func is eval:
    args = (f"open({str(marker)!r}, 'w').write('x')",)
  elif func is os.system:
    args = (f"touch {marker}",)
  else:
    args = (["touch", str(marker)],)
  payload = pickle.dumps({"embeddings": np.zeros(3), "x": _Exploit(func, args)}, protocol=2)
  with pytest.raises(safe_pickle.RefusedGlobalError, match=name.replace(".", r"\.")) as e:
    safe_pickle.load(payload)
  assert e.value.name == name
  assert not marker.exists()
  # The same payload really runs code under plain pickle: the test would notice a change.
  if func is not os.system:
    pickle.loads(payload)
    assert marker.exists()


def test_refuses_builtins_and_unlisted_torch_globals():
  for module, name in [("builtins", "getattr"), ("__builtin__", "eval"), ("torch", "load"),
                       ("torch.nn.modules.conv", "Conv2d"), ("numpy", "load"),
                       ("numpy.ma.core", "_mareconstruct"), ("_codecs", "decode")]:
    payload = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b")R."
    with pytest.raises(safe_pickle.RefusedGlobalError):
      safe_pickle.load(payload)


def test_codecs_encode_only_with_plain_text_codecs():
  payload = pickle.dumps(_Exploit(__import__("codecs").encode, ("eJwrSS0u0c3JTEovBgA=",
                                                                 "base64")), protocol=2)
  with pytest.raises(pickle.UnpicklingError, match="base64"):
    safe_pickle.load(payload)


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_numpy_arrays_scalars_and_containers_round_trip(protocol):
  obj = {
      "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
      "fortran": np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)),
      "bool": np.array([True, False]),
      "objects": np.array([[1, 2], [3]], dtype=object),
      "scalar": np.int64(7), "f": np.float32(0.5),
      "ordered": collections.OrderedDict(a=1), "set": {1, 2}, "bytes": b"\x00\x01",
      "nested": [(1, 2.5, "s", None, True)],
  }
  out = safe_pickle.load(pickle.dumps(obj, protocol=protocol))
  for key in ("f32", "fortran", "bool"):
    np.testing.assert_array_equal(out[key], obj[key])
    assert out[key].dtype == obj[key].dtype
  assert out["objects"].tolist() == [[1, 2], [3]]
  assert out["scalar"] == 7 and out["scalar"].dtype == np.int64
  assert out["f"] == np.float32(0.5)
  assert isinstance(out["ordered"], collections.OrderedDict) and out["ordered"] == {"a": 1}
  assert out["set"] == {1, 2} and out["bytes"] == b"\x00\x01"
  assert out["nested"] == [(1, 2.5, "s", None, True)]


def test_load_accepts_path_and_file(tmp_path):
  path = tmp_path / "x.pkl"
  path.write_bytes(pickle.dumps([1, 2]))
  assert safe_pickle.load(path) == [1, 2]
  assert safe_pickle.load(str(path)) == [1, 2]
  assert safe_pickle.load(io.BytesIO(path.read_bytes())) == [1, 2]


def test_persistent_id_in_plain_pickle_is_an_error():
  class P(pickle.Pickler):
    def persistent_id(self, obj):
      return "x" if obj == "ref" else None
  buffer = io.BytesIO()
  P(buffer, protocol=2).dump(["ref"])
  with pytest.raises(pickle.UnpicklingError, match="persistent id"):
    safe_pickle.load(buffer.getvalue())


def test_rebuild_tensor_checks_bounds():
  storage = safe_pickle.Storage(safe_pickle.StorageType("FloatStorage"),
                                np.arange(6, dtype=np.float32))
  np.testing.assert_array_equal(safe_pickle.rebuild_tensor(storage, 1, (2, 2), (1, 2)),
                                [[1, 3], [2, 4]])
  with pytest.raises(pickle.UnpicklingError, match="reads element 7"):
    safe_pickle.rebuild_tensor(storage, 2, (2, 3), (3, 1))
  with pytest.raises(pickle.UnpicklingError, match="bad tensor geometry"):
    safe_pickle.rebuild_tensor(storage, 0, (2,), (-1,))


def test_module_state_holds_data_only():
  cls = safe_pickle.ALLOWED_GLOBALS["torch.nn.modules.linear.Linear"]
  module = cls.__new__(cls)
  module.__setstate__({"training": True, "_parameters": {"weight": np.ones((2, 3)),
                                                         "bias": None},
                       "_buffers": {}, "_modules": {}, "in_features": 3})
  assert list(module.state_dict()) == ["weight"]
  assert module.attributes == {"training": True, "in_features": 3}
  with pytest.raises(pickle.UnpicklingError, match="Linear"):
    module.__setstate__(["not", "a", "dict"])


def test_rebuild_v3_untyped_storage_with_dtype():
  raw = np.arange(4, dtype=np.float32).tobytes()
  untyped = safe_pickle.Storage.from_bytes(safe_pickle.StorageType("UntypedStorage"), raw, 16)
  rebuild = safe_pickle.ALLOWED_GLOBALS["torch._utils._rebuild_tensor_v3"]
  out = rebuild(untyped, 1, (3,), (1,), False, None, safe_pickle.ALLOWED_GLOBALS["torch.float32"])
  np.testing.assert_array_equal(out, [1, 2, 3])
  assert out.dtype == np.float32
