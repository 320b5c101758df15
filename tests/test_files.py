"""Tests of bindjax.base.files: atomic writes leave only the final file; JSONL reads skip a torn
line."""
import json
import os

import numpy as np
import pytest

from bindjax.base import files


def test_write_atomic_text_then_bytes(tmp_path):
  path = tmp_path / "sub" / "f.json"
  files.write_atomic(path, "one")
  files.write_atomic(path, b"two")
  assert path.read_text() == "two"
  assert os.listdir(path.parent) == ["f.json"]


def test_atomic_path_keeps_extension_and_cleans_up_on_failure(tmp_path):
  path = tmp_path / "a.npz"
  with files.atomic_path(path) as tmp:
    assert tmp.endswith(".npz") and os.path.dirname(tmp) == str(tmp_path)
    np.savez(tmp, x=np.arange(3))
  np.testing.assert_array_equal(np.load(path)["x"], np.arange(3))
  with pytest.raises(RuntimeError):
    with files.atomic_path(path) as tmp:
      np.savez(tmp, x=np.arange(5))
      raise RuntimeError("writer failed")
  assert os.listdir(tmp_path) == ["a.npz"]
  np.testing.assert_array_equal(np.load(path)["x"], np.arange(3))


def test_write_json_and_jsonl_round_trip(tmp_path):
  files.write_json(tmp_path / "v.json", {"b": 1, "a": [2]}, sort_keys=True)
  assert json.loads((tmp_path / "v.json").read_text()) == {"a": [2], "b": 1}
  rows = [{"step": 1}, {"step": 2}]
  files.write_jsonl(tmp_path / "r.jsonl", rows)
  assert files.read_jsonl(tmp_path / "r.jsonl") == rows


def test_read_jsonl_skips_only_a_torn_last_line(tmp_path):
  path = tmp_path / "r.jsonl"
  path.write_text('{"step": 1}\n{"step": 2}\n{"ste')
  with pytest.warns(files.TornLineWarning, match=f"{path}:3: skipped a torn last line"):
    assert files.read_jsonl(path) == [{"step": 1}, {"step": 2}]
  path.write_text('{"step": 1}\n{"ste\n')
  with pytest.warns(files.TornLineWarning, match=f"{path}:2: "):
    assert files.read_jsonl(path) == [{"step": 1}]
  path.write_text('{"step": 1}\n{"step": 2}')   # complete, only its newline missing
  assert files.read_jsonl(path) == [{"step": 1}, {"step": 2}]
  assert files.read_jsonl(tmp_path / "missing.jsonl") == []


@pytest.mark.parametrize("bad", ['{"ste', "", "5", "\xff\xfe", '{"step": 2}{"step": 3}'])
def test_read_jsonl_stops_at_a_bad_line_before_the_last(tmp_path, bad):
  path = tmp_path / "r.jsonl"
  path.write_bytes(b'{"step": 1}\n' + bad.encode("latin1") + b'\n{"step": 3}\n')
  with pytest.raises(ValueError, match=f"{path}:2: not a JSON object .*damaged before its "
                                       "last line"):
    files.read_jsonl(path)


def test_recorded_outputs_and_their_removal(tmp_path):
  (tmp_path / "mine.txt").write_text("a user's")
  assert files.recorded_outputs(tmp_path) is None
  files.record_outputs(tmp_path, ["a.json", "sub"])
  files.record_outputs(tmp_path, ["a.json", "b.png"])
  assert files.recorded_outputs(tmp_path) == ["a.json", "sub", "b.png"]
  (tmp_path / "a.json").write_text("{}")
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "x").write_text("x")
  removed = files.remove_recorded_outputs(tmp_path)
  assert sorted(os.path.basename(p) for p in removed) == ["a.json", "sub"]
  assert os.listdir(tmp_path) == ["mine.txt"]
  (tmp_path / "old.json").write_text("{}")   # a directory without a record: the names given
  assert files.remove_recorded_outputs(tmp_path, ["old.json"]) == [str(tmp_path / "old.json")]
  assert os.listdir(tmp_path) == ["mine.txt"]


def test_read_arrays_refuses_object_arrays_naming_the_file(tmp_path):
  path = tmp_path / "a.npz"
  np.savez(path, x=np.arange(3), y=np.array([{"a": 1}], dtype=object))
  with pytest.raises(ValueError, match=f"{path}: unreadable as numpy arrays .*object arrays are "
                                       "refused"):
    files.read_arrays(path)
  np.savez(path, x=np.arange(3))
  np.testing.assert_array_equal(files.read_arrays(path)["x"], np.arange(3))
  (tmp_path / "bad.json").write_text("{")
  with pytest.raises(ValueError, match="bad.json: unreadable"):
    files.read_json(tmp_path / "bad.json")


def test_to_jsonable_writes_strict_json():
  value = {1: (np.float32(0.5), np.int64(3), np.bool_(True)),
           "a": np.array([[1.0, np.nan], [np.inf, -np.inf]]), "b": [float("nan"), "x", None]}
  out = files.to_jsonable(value)
  assert out == {"1": [0.5, 3, True], "a": [[1.0, None], [None, None]], "b": [None, "x", None]}
  assert type(out["1"][1]) is int and type(out["1"][2]) is bool
  json.dumps(out, allow_nan=False)  # raises if anything non-standard is left
