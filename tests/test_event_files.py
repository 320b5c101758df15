"""TensorBoard event files of a sweep (bindjax.workdir.event_files): one run per replica, named by
its grid coordinates, holding every curve of its rows; written as TFRecords with valid CRCs."""
import collections
import glob
import os

import pytest

from bindjax.base import files
from bindjax.commands import main as cli
from bindjax.workdir import event_files
from bindjax.workdir import layout
from bindjax.workdir import results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "tests", "test_sweep.py")


def _curves(run_dir):
  """{tag: {step: value}} of every event file of a run, in name order as TensorBoard reads."""
  curves = collections.defaultdict(dict)
  for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
    for step, tag, value in event_files.read_scalars(path):
      curves[tag][step] = value
  return curves


def test_a_sweep_writes_each_replicas_curves(tmp_path, capsys, monkeypatch):
  workdir = tmp_path / "run"
  monkeypatch.setattr("sys.argv", ["bindjax"])
  assert cli.main(["sweep", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress",
                   "--noreport"]) == 0
  capsys.readouterr()
  coordinates = layout.Workdir(workdir).read_replicas()
  runs = sorted(os.listdir(workdir / layout.TENSORBOARD_DIR))
  assert runs == sorted(event_files.run_name(c) for c in coordinates)
  assert runs[0].startswith("replica0000_O9_C2_coverage0.5_seed0_lr")
  rows = layout.Workdir(workdir).read_rows()
  for c in coordinates:
    curves = _curves(workdir / layout.TENSORBOARD_DIR / event_files.run_name(c))
    mine = [r for r in rows if r[results.REPLICA] == c[results.REPLICA]]
    assert curves["train/loss"].keys() == {r[results.STEP] for r in mine
                                           if r.get("train/loss") is not None}
    assert curves[results.SELECTION_METRIC].keys() == {
        r[results.STEP] for r in mine if r[results.KIND] == "eval"}
    for row in mine:
      for tag, value in row.items():
        if tag in curves and value is not None:
          assert curves[tag][row[results.STEP]] == pytest.approx(value, rel=1e-6, abs=1e-30)


def test_without_tensorboard_no_event_files(tmp_path, capsys, monkeypatch):
  workdir = tmp_path / "run"
  monkeypatch.setattr("sys.argv", ["bindjax"])
  assert cli.main(["train", f"--config={REPO}/experiments/train.py:smoke",
                   f"--workdir={workdir}", "--noprogress", "--notensorboard"]) == 0
  out = capsys.readouterr().out
  assert "train: 1 replica in 1 bucket on " in out, out   # a run, said as one
  assert not (workdir / layout.TENSORBOARD_DIR).exists()


def _row(replica, step, loss):
  coordinates = {name: 0 for name in results.COORDINATES}
  coordinates.update({results.REPLICA: replica, results.SPACE_SIZE: 16,
                      results.NUM_CONCEPTS: 2, results.COVERAGE: 0.5, results.SEED: 1,
                      results.LEARNING_RATE: 1e-3, results.WEIGHT_DECAY: 0.1,
                      results.MODEL: None})
  return dict(coordinates, **{results.KIND: "train", results.STEP: step, "train/loss": loss,
                              "train/nan": float("nan"), "train/none": None})


def test_on_a_store_without_appends_each_checkpoint_writes_new_files(memory_fs):
  writer = event_files.EventWriter(f"{memory_fs}/run")
  writer.add([_row(0, 1, 2.5), _row(1, 1, 3.5)])
  run = files.as_path(f"{memory_fs}/run/{layout.TENSORBOARD_DIR}") / event_files.run_name(
      _row(0, 1, 0))
  assert not run.exists()   # nothing until the checkpoint
  writer.sync()
  writer.add([_row(0, 2, 1.5)])
  writer.sync()
  written = sorted(run.iterdir())
  assert len(written) == 2
  scalars = [s for path in written for s in event_files.read_scalars(path)]
  assert scalars == [(1, "train/loss", 2.5), (2, "train/loss", 1.5)]   # non-finite left out


def test_a_damaged_record_is_refused(tmp_path):
  writer = event_files.EventWriter(tmp_path)
  writer.add([_row(0, 1, 2.5)])
  (path,) = glob.glob(str(tmp_path / layout.TENSORBOARD_DIR / "*" / "events.*"))
  data = bytearray(open(path, "rb").read())
  data[-6] ^= 1
  open(path, "wb").write(bytes(data))
  with pytest.raises(ValueError, match="fails its CRC"):
    event_files.read_scalars(path)


def test_crc32c_is_castagnolis():
  assert event_files.crc32c(b"123456789") == 0xE3069283
  assert event_files.crc32c(b"") == 0
