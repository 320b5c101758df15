"""bindjax.frozen.compat against genuine PyTorch: files torch wrote, files torch reads, randperm.

Two halves. The torch-free half reads small files that torch.save / pickle.dump wrote
(tests/data/torch_fixtures) and compares them with the values numpy recorded beside them in
expected.json; checks that torch_format.save still writes, byte for byte, the file whose
contents real torch read back (recorded in expected.json); and checks randperm against
permutations real torch drew (hashes, for n up to 100,000 and seeds beyond 2^32). The other
half runs only where torch is importable (never in the project venv: torch lives in a separate
venv) and checks both directions live.

Regenerate the fixtures (torch 2.13 CPU, in its own venv; the project never depends on torch):
  PYTHONPATH=. TORCH_VENV/bin/python tests/test_compat_torch_crosscheck.py
Run the live checks too:
  PYTHONPATH=. TORCH_VENV/bin/python -m pytest tests/test_compat_torch_crosscheck.py -q
"""
import collections
import hashlib
import json
import os
import pickle
import warnings

import numpy as np
import pytest

from bindjax.frozen.compat import safe_pickle
from bindjax.frozen.compat import torch_format
from bindjax.frozen.compat import torch_random

FIXTURES = os.path.join(os.path.dirname(__file__), "data", "torch_fixtures")
EXPECTED = os.path.join(FIXTURES, "expected.json")
FIXTURE_FILES = ("zip_mixed.pt", "legacy.pt", "views.pt", "pickled_tensor.pkl")
BINDJAX_FILE = "bindjax_written.pt"
# (n, seed) pairs whose torch.randperm is recorded: n past 2^16 and seeds past 2^32 included.
RANDPERM_CASES = tuple((n, seed) for n in (24, 576, 2**16, 2**16 + 3, 100_000)
                       for seed in (0, 7, 2**32 + 5, 123_456_789_012, 2**63 - 1))


# ---------------------------------------------------------------- fixtures (need torch to write)
def _fixture_objects(torch):
  """{file name: (object, how to write it)} built from a fixed torch seed; tiny on purpose."""
  torch.manual_seed(0)
  nn = torch.nn
  zip_mixed = {
      "f32": torch.randn(2, 3), "f16": torch.randn(3).half(),
      "bf16": torch.randn(2, 2).to(torch.bfloat16), "i64": torch.arange(4) * 2**33,
      "bool": torch.tensor([True, False]), "scalar": torch.tensor(1.5),
      "probes": {"0": nn.Linear(3, 2, bias=False)},
      "od": collections.OrderedDict(w=torch.randn(2)), "step": 7, "name": "zip",
  }
  base = torch.randn(4, 6)
  legacy = collections.OrderedDict(
      f32=base[1:, ::2], bf16=base.to(torch.bfloat16).t()[2:], f16=base.half()[::2, 1:4],
      probes={"1": nn.Linear(3, 2, bias=False)}, step=3)
  grid = torch.arange(24.0).reshape(4, 6)
  views = {"base": grid, "t": grid.t(), "slice": grid[1:3, ::2], "offset": grid.view(-1)[7:13],
           "expand": torch.arange(3.0).expand(2, 3), "i32": torch.arange(5, dtype=torch.int32)[1:]}
  embeddings = torch.randn(6, 4).to(torch.bfloat16).t()[1:]  # what *_embeddings.pkl can hold
  return {"zip_mixed.pt": (zip_mixed, "zip"), "legacy.pt": (legacy, "legacy"),
          "views.pt": (views, "zip"), "pickled_tensor.pkl": (embeddings, "pickle")}


def _record(torch, obj, prefix=""):
  """{path: expected} for every tensor and plain value in obj (numpy writes the values)."""
  if torch.is_tensor(obj):
    array = obj.detach()
    array = array.float().numpy() if array.dtype == torch.bfloat16 else array.numpy()
    return {prefix: {"dtype": array.dtype.name, "shape": list(array.shape),
                     "values": array.tolist()}}
  if isinstance(obj, torch.nn.Module):
    # Parameters (None for an absent bias) and submodules, as the pickled module holds them.
    items = list(vars(obj)["_parameters"].items()) + list(vars(obj)["_modules"].items())
  elif isinstance(obj, dict):
    items = list(obj.items())
  else:
    return {prefix: {"value": obj}}
  out = {}
  for key, value in items:
    out.update(_record(torch, value, f"{prefix}/{key}" if prefix else str(key)))
  return out


def _bindjax_object():
  """What bindjax writes with torch_format.save for the byte-level check: every dtype it writes,
  views, nesting and plain values; numpy only."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  grid = np.arange(12, dtype=np.float32).reshape(3, 4)
  return collections.OrderedDict(
      f32=grid.T, f16=np.array([0.5, -2, 65504], np.float16), f64=np.linspace(0, 1, 3),
      bf16=np.array([1.5, -2, 3.140625], ml_dtypes.bfloat16), i64=np.array([-1, 2**40, 7]),
      i32=np.array([[3]], np.int32), bool=np.array([True, False]),
      scalar=np.array(2.5, np.float32), empty=np.zeros((0, 3), np.float32),
      nested={"a": {"b": np.ones((2, 2), np.float32)}}, step=3, name="x")


def _perm_hash(perm):
  return hashlib.sha256(np.asarray(perm, "<i8").tobytes()).hexdigest()


def write_fixtures(directory):
  """Writes the fixture files and expected.json into `directory` (needs torch)."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch import serialization  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  expected = {"torch_version": torch.__version__, "files": {}}
  get_source = serialization.get_source_lines_and_file

  def no_source(obj):
    # Legacy files embed each module class's source text; torch saves None when it cannot
    # read it, which keeps PyTorch's own source out of our fixture.
    raise OSError(f"source of {obj} left out of the fixture")

  for name, (obj, kind) in _fixture_objects(torch).items():
    path = os.path.join(directory, name)
    tmp = f"{path}.tmp{os.getpid()}"
    if kind == "pickle":
      with open(tmp, "wb") as f:
        pickle.dump(obj, f, protocol=2)
    elif kind == "legacy":
      serialization.get_source_lines_and_file = no_source
      try:
        with warnings.catch_warnings():
          warnings.filterwarnings("ignore", message="Couldn't retrieve source code")
          torch.save(obj, tmp, _use_new_zipfile_serialization=False)
      finally:
        serialization.get_source_lines_and_file = get_source
    else:
      with open(tmp, "wb") as f:  # a file object, so the zip root is torch's plain "archive/"
        torch.save(obj, f)
    os.replace(tmp, path)
    expected["files"][name] = _record(torch, obj)
  path = os.path.join(directory, BINDJAX_FILE)
  torch_format.save(_bindjax_object(), path)
  expected["torch_read_bindjax_file"] = _record(torch, torch.load(path))
  expected["randperm"] = [
      {"n": n, "seed": seed, "sha256": _perm_hash(
          torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy())}
      for n, seed in RANDPERM_CASES]
  path = os.path.join(directory, "expected.json")
  with open(f"{path}.tmp", "w") as f:
    json.dump(expected, f, indent=1)
  os.replace(f"{path}.tmp", path)
  return expected


# ---------------------------------------------------------------- torch-free checks
def _walk(obj, path):
  for part in path.split("/") if path else ():
    if isinstance(obj, safe_pickle.ModuleState):
      obj = obj.parameters[part] if part in obj.parameters else obj[part]
    else:
      obj = obj[part]
  return obj


def _check_against_expected(name, loaded, expected):
  assert expected, name
  for path, want in expected.items():
    got = _walk(loaded, path)
    if "value" in want:
      assert got == want["value"], (name, path, got)
      continue
    assert isinstance(got, np.ndarray), (name, path, type(got))
    assert got.dtype == np.dtype(want["dtype"]), (name, path, got.dtype)
    assert list(got.shape) == want["shape"], (name, path, got.shape)
    expected_array = np.asarray(want["values"], want["dtype"]).reshape(want["shape"])
    np.testing.assert_array_equal(got, expected_array, err_msg=f"{name}:{path}")


@pytest.mark.parametrize("name", FIXTURE_FILES)
def test_reads_genuine_torch_files(name):
  with open(EXPECTED) as f:
    expected = json.load(f)["files"][name]
  loaded = torch_format.load(os.path.join(FIXTURES, name))
  _check_against_expected(name, loaded, expected)


def test_save_writes_the_bytes_torch_read(tmp_path):
  """torch_format.save's output is unchanged since real torch read it (values recorded)."""
  path = tmp_path / BINDJAX_FILE
  torch_format.save(_bindjax_object(), path)
  assert path.read_bytes() == open(os.path.join(FIXTURES, BINDJAX_FILE), "rb").read()
  with open(EXPECTED) as f:
    read_by_torch = json.load(f)["torch_read_bindjax_file"]
  written = _bindjax_object()
  for key in ("f32", "f16", "f64", "i64", "i32", "bool", "scalar", "empty"):
    want = read_by_torch[key]
    assert want["shape"] == list(written[key].shape) and want["dtype"] == written[key].dtype.name
    np.testing.assert_array_equal(np.asarray(want["values"], want["dtype"]).reshape(
        want["shape"]), written[key], err_msg=key)
  np.testing.assert_array_equal(read_by_torch["bf16"]["values"],
                                written["bf16"].astype(np.float32))
  assert read_by_torch["nested/a/b"]["values"] == [[1.0, 1.0], [1.0, 1.0]]
  assert read_by_torch["step"] == {"value": 3} and read_by_torch["name"] == {"value": "x"}


@pytest.mark.parametrize("n", sorted({n for n, _ in RANDPERM_CASES}))
def test_randperm_matches_permutations_torch_drew(n):
  with open(EXPECTED) as f:
    recorded = [r for r in json.load(f)["randperm"] if r["n"] == n]
  assert len(recorded) == 5
  for case in recorded:
    assert _perm_hash(torch_random.randperm(n, case["seed"])) == case["sha256"], case["seed"]


def test_fixture_details():
  zipped = torch_format.load(os.path.join(FIXTURES, "zip_mixed.pt"))
  linear = zipped["probes"]["0"]
  assert linear.torch_class == "torch.nn.modules.linear.Linear"
  assert linear.parameters["bias"] is None and linear.attributes["in_features"] == 3
  assert isinstance(zipped["od"], collections.OrderedDict)
  assert zipped["scalar"].shape == () and zipped["i64"][-1] == 3 * 2**33
  legacy = torch_format.load(os.path.join(FIXTURES, "legacy.pt"))
  assert isinstance(legacy, collections.OrderedDict)
  assert list(legacy["probes"]["1"].state_dict()) == ["weight"]
  views = torch_format.load(os.path.join(FIXTURES, "views.pt"))
  np.testing.assert_array_equal(views["offset"], np.arange(7.0, 13.0))
  np.testing.assert_array_equal(views["t"], views["base"].T)
  assert all(v.flags.c_contiguous for v in views.values())


def test_legacy_module_class_outside_allow_list_is_refused(tmp_path):
  # Same file with the Linear class renamed (same length): the class named in a legacy
  # ('module', class, ...) persistent id still goes through the allow-list.
  with open(os.path.join(FIXTURES, "legacy.pt"), "rb") as f:
    raw = f.read()
  assert raw.count(b"\nLinear\n") == 1
  path = tmp_path / "conv.pt"
  path.write_bytes(raw.replace(b"\nLinear\n", b"\nConv1d\n"))
  with pytest.raises(safe_pickle.RefusedGlobalError, match="torch.nn.modules.linear.Conv1d"):
    torch_format.load(path)


def test_save_keeps_zero_dim_arrays(tmp_path):
  path = tmp_path / "s.pt"
  torch_format.save({"s": np.array(2.5, np.float32), "v": np.array([1], np.int64)}, path)
  out = torch_format.load(path)
  assert out["s"].shape == () and out["s"] == 2.5 and out["v"].shape == (1,)


# ---------------------------------------------------------------- live checks (torch only)
def test_torch_loads_bindjax_files(tmp_path):
  torch = pytest.importorskip("torch")
  ml_dtypes = pytest.importorskip("ml_dtypes")
  arrays = {"f32": np.arange(12, dtype=np.float32).reshape(3, 4).T,
            "f16": np.array([0.5, -2, 65504], np.float16),
            "i64": np.array([-1, 2**40, 7]), "i32": np.array([[3]], np.int32),
            "bool": np.array([True, False]), "scalar": np.array(2.5, np.float32),
            "empty": np.zeros((0, 3), np.float32), "f64": np.linspace(0, 1, 3)}
  bf16 = np.array([1.5, -2, 3.140625], ml_dtypes.bfloat16)
  obj = collections.OrderedDict(
      arrays=arrays, bf16=bf16, nested={"a": {"b": np.ones((2, 2), np.float32)},
                                        "od": collections.OrderedDict(x=np.zeros(1, np.int64))},
      step=3, name="x", items=[np.arange(3, dtype=np.int32)], pair=(1, 2))
  path = tmp_path / "b.pt"
  torch_format.save(obj, path)
  out = torch.load(path)  # weights_only=True: only plain tensors and containers
  assert isinstance(out, collections.OrderedDict)
  for key, array in arrays.items():
    tensor = out["arrays"][key]
    assert tensor.is_contiguous() and tuple(tensor.shape) == array.shape, key
    assert tensor.numpy().dtype == array.dtype, key
    np.testing.assert_array_equal(tensor.numpy(), array, err_msg=key)
  assert out["bf16"].dtype == torch.bfloat16
  np.testing.assert_array_equal(out["bf16"].float().numpy(), bf16.astype(np.float32))
  assert isinstance(out["nested"]["od"], collections.OrderedDict)
  assert out["nested"]["a"]["b"].sum().item() == 4 and out["items"][0].tolist() == [0, 1, 2]
  assert out["step"] == 3 and out["name"] == "x" and out["pair"] == (1, 2)


@pytest.mark.parametrize("legacy", [False, True])
def test_bindjax_loads_torch_save(tmp_path, legacy):
  torch = pytest.importorskip("torch")
  torch.manual_seed(1)
  base = torch.randn(6, 8)
  nn = torch.nn
  obj = {
      "t": base.t(), "slice": base[2:5, 1::2], "offset": base.view(-1)[5:17],
      "bf16": base.to(torch.bfloat16).t()[1:], "f16": base.half()[::2], "bool": base > 0,
      "i64": torch.arange(10)[3:], "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3),
      "param": nn.Parameter(torch.ones(2)), "probes": {"0": nn.Linear(8, 3, bias=False),
                                                       "1": nn.Linear(8, 2)},
      "module_dict": nn.ModuleDict({"0": nn.Linear(2, 2)}),
      "sequential": nn.Sequential(nn.Linear(8, 2), nn.Linear(2, 1)),
      "od": collections.OrderedDict(a=base[0]), "step": 5,
  }
  path = tmp_path / "t.pt"
  torch.save(obj, path, _use_new_zipfile_serialization=not legacy)
  loaded = torch_format.load(path)
  _check_against_expected("t.pt", loaded, _record(torch, obj))
  for name in ("probes", "module_dict", "sequential"):
    module = obj[name] if isinstance(obj[name], nn.Module) else nn.ModuleDict(obj[name])
    got = (loaded[name].state_dict() if isinstance(loaded[name], safe_pickle.ModuleState) else
           {f"{k}.{n}": v for k, m in loaded[name].items() for n, v in m.state_dict().items()})
    want = module.state_dict()
    assert list(got) == list(want), name
    for key, value in want.items():
      np.testing.assert_array_equal(got[key], value.numpy(), err_msg=f"{name}.{key}")


def test_bindjax_loads_whole_module_and_pickled_tensors(tmp_path):
  torch = pytest.importorskip("torch")
  linear = torch.nn.Linear(4, 3)
  torch.save(linear, tmp_path / "m.pt")
  module = torch_format.load(tmp_path / "m.pt")
  assert module.torch_class == "torch.nn.modules.linear.Linear"
  for key, value in linear.state_dict().items():
    np.testing.assert_array_equal(module.state_dict()[key], value.numpy())
  base = torch.randn(5, 7)
  for name, tensor in [("f32", base), ("view", base[1:, 2:]), ("f16", base.half().t()),
                       ("bf16", base.to(torch.bfloat16)[::2])]:
    path = tmp_path / f"{name}_embeddings.pkl"
    with open(path, "wb") as f:
      pickle.dump(tensor, f)
    _check_against_expected(name, torch_format.load(path), _record(torch, tensor))
  with open(tmp_path / "d.pkl", "wb") as f:
    pickle.dump({"embeddings": base, "n": 3}, f)
  out = torch_format.load(tmp_path / "d.pkl")
  np.testing.assert_array_equal(out["embeddings"], base.numpy())
  assert out["n"] == 3


@pytest.mark.parametrize("n", [0, 1, 2, 24, 576, 1000, 2**16])
def test_randperm_matches_torch(n):
  torch = pytest.importorskip("torch")
  for seed in (0, 1, 3, 42, 2**32 + 5, 2**63 - 1):
    want = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    np.testing.assert_array_equal(torch_random.randperm(n, seed), want,
                                  err_msg=f"n={n} seed={seed}")


def test_fixtures_match_what_this_torch_writes(tmp_path):
  torch = pytest.importorskip("torch")
  with open(EXPECTED) as f:
    committed = json.load(f)
  fresh = write_fixtures(str(tmp_path))
  assert fresh["files"] == committed["files"], (torch.__version__, committed["torch_version"])
  for name in FIXTURE_FILES:
    _check_against_expected(name, torch_format.load(tmp_path / name), fresh["files"][name])


if __name__ == "__main__":
  print(json.dumps({k: len(v) for k, v in write_fixtures(FIXTURES)["files"].items()}))
