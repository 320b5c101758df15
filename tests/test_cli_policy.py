"""The command-line policy (bindjax.commands.flags) on the commands that follow it.

Bad input data exits 1 and a usage error exits 2, each with one line on stderr that names the
file or flag; a non-empty output directory is refused without --overwrite; nothing is written.
"""
import os
import shutil
import sys

import numpy as np
import pytest

from bindjax.commands import flags
from bindjax.commands import main as cli

DATA = os.path.join(os.path.dirname(__file__), "data", "clevr_text")


def listing(path):
  return sorted(os.path.relpath(os.path.join(d, f), path)
                for d, _, names in os.walk(path) for f in names)


def run(argv, capsys, monkeypatch=None):
  """(exit status, stderr lines) of `bindjax ARGV` run in-process."""
  if monkeypatch is not None:   # ml_collections reads --config.field overrides from sys.argv
    monkeypatch.setattr(sys, "argv", ["bindjax"] + list(argv))
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  return e.value.code, capsys.readouterr().err.splitlines()


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPLEXITY = os.path.join(REPO, "experiments", "complexity.py")
GEOMETRY = os.path.join(REPO, "experiments", "geometry.py")
BINDING = os.path.join(REPO, "experiments", "binding.py")


def commands(bad_input, out):
  """Each command that reads data, with input `bad_input` and output `out`."""
  return {
      "import": ["import", f"--reference={bad_input}", f"--out={out}"],
      "extract": ["extract", f"--workdir={bad_input}", f"--out={out}"],
      "mds": ["mds", f"--embeddings={bad_input}", f"--workdir={out}",
              "--quadruple=red,blue,cube,sphere"],
      "interventions-table": ["interventions-table", f"--summaries={bad_input}",
                              f"--workdir={out}"],
      "report": ["report", f"--workdir={bad_input}", f"--out={out}"],
      "binding": ["binding", f"--workdir={bad_input}", f"--config={BINDING}:smoke",
                  f"--out={out}"],
      "probe": ["probe", f"--embeddings={bad_input}", f"--workdir={out}", "--steps=10"],
      "complexity": ["complexity", f"--config={COMPLEXITY}:smoke",
                     f"--config.embeddings={bad_input}", f"--workdir={out}"],
      "decompose": ["decompose", f"--embeddings={bad_input}", f"--workdir={out}",
                    f"--config={GEOMETRY}:smoke"],
      "interventions": ["interventions", f"--embeddings={bad_input}", f"--workdir={out}",
                        f"--config={GEOMETRY}:smoke"],
  }


READERS = sorted(commands("x", "y"))


@pytest.mark.parametrize("name", READERS)
def test_bad_input_exits_1_naming_the_input_and_writes_nothing(tmp_path, capsys, monkeypatch,
                                                               name):
  missing, out = tmp_path / "missing", tmp_path / "out"
  code, err = run(commands(missing, out)[name], capsys, monkeypatch)
  assert code == flags.INPUT_ERROR, err
  assert len(err) == 1 and err[0].startswith(f"bindjax {name}: ") and str(missing) in err[0]
  assert not out.exists() and listing(tmp_path) == []


@pytest.mark.parametrize("name", READERS)
def test_non_empty_output_is_a_usage_error_and_is_left_alone(tmp_path, capsys, monkeypatch,
                                                             name):
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("mine")
  code, err = run(commands(DATA, out)[name], capsys, monkeypatch)
  assert code == flags.USAGE_ERROR
  assert len(err) == 1 and f"={out} is not empty" in err[0] and "--overwrite" in err[0]
  assert listing(out) == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("argv,named", [
    (["complexity", f"--config={COMPLEXITY}:smoke", f"--config.embeddings={DATA}",
      "--config.models=additive,cubic"], "'cubic'"),
    (["complexity", f"--config={COMPLEXITY}:smoke", f"--config.embeddings={DATA}",
      "--config.chunk_size=zero"], "chunk_size='zero'"),
    (["complexity", f"--config={COMPLEXITY}:smoke", f"--config.embeddings={DATA}",
      "--config.eval_every=7"], "eval_every=7"),
    (["probe", f"--embeddings={DATA}", "--train_fraction=1.5"], "train_fraction"),
    (["decompose", f"--embeddings={DATA}", f"--config={GEOMETRY}:smoke",
      "--config.decomposition.banks=avg"], "'avg'"),
    (["report", f"--workdir={DATA}", "--draws=0"], "--draws=0"),
    (["binding", f"--workdir={DATA}", f"--config={BINDING}:smoke", "--config.fit.eval_every=7"],
     "eval_every=7"),
    (["binding", f"--workdir={DATA}", f"--config={BINDING}:smoke", "--config.models=cubic"],
     "'cubic'"),
    (["train", f"--config={REPO}/experiments/train.py:smoke", "--config.coverage=1.5"],
     "config.coverage=1.5"),
    (["sweep", f"--config={REPO}/experiments/coverage_sweep.py:smoke",
      "--config.grid.seeds=-1"], "grid.seeds[0]=-1"),
])
def test_bad_settings_are_usage_errors_and_write_nothing(tmp_path, capsys, monkeypatch, argv,
                                                         named):
  out = tmp_path / "out"
  if argv[0] not in ("report", "binding"):
    argv = argv + [f"--workdir={out}"]
  else:
    argv = argv + [f"--out={out}"]
  code, err = run(argv, capsys, monkeypatch)
  assert code == flags.USAGE_ERROR and len(err) == 1 and named in err[0], err
  assert listing(tmp_path) == []


@pytest.mark.parametrize("name", ["train", "sweep"])
def test_training_refuses_a_directory_that_holds_no_run(tmp_path, capsys, monkeypatch, name):
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("mine")
  preset = {"train": "train.py:smoke", "sweep": "coverage_sweep.py:smoke"}[name]
  code, err = run([name, f"--config={REPO}/experiments/{preset}", f"--workdir={out}"], capsys,
                  monkeypatch)
  assert code == flags.USAGE_ERROR and len(err) == 1 and "holds no bindjax run" in err[0]
  assert listing(out) == ["keep.txt"]


def test_bad_flag_values_are_usage_errors(tmp_path, capsys):
  out = tmp_path / "out"
  for argv, named in ((["extract", f"--checkpoint={DATA}", f"--out={out}",
                        "--values_per_concept=8,x"], "--values_per_concept=8,x"),
                      (["extract", f"--workdir={DATA}", "--batch_size=0"], "batch_size"),
                      (["interventions-table", f"--summaries={DATA}", f"--workdir={out}",
                        "--metric=nope"], "metric")):
    code, err = run(argv, capsys)
    assert code == flags.USAGE_ERROR and len(err) == 1 and named in err[0], argv
  assert listing(tmp_path) == []


def test_one_line_keeps_a_tracebacks_last_line_only():
  text = "Traceback (most recent call last):\n  File x\nValueError: config.py: bad"
  assert flags.one_line(text) == "ValueError: config.py: bad"
  assert flags.one_line("a\n  b ") == "a b"


TRAIN = os.path.join(REPO, "experiments", "train.py")
SWEEP = os.path.join(REPO, "experiments", "coverage_sweep.py")


@pytest.mark.parametrize("argv,named", [
    (["train", f"--config={TRAIN}:smoke", "--config.nonexistent=3"],
     "--config.nonexistent: the config has no field 'nonexistent'; expected one of checkpoint,"),
    (["train", f"--config={TRAIN}:smoke", "--config.optimizer.lr=1e4"],
     "--config.optimizer.lr: config.optimizer has no field 'lr'; expected one of b1, b2, eps,"),
    (["sweep", f"--config={SWEEP}:smoke", "--config.grid.nope=1"],
     "--config.grid.nope: config.grid has no field 'nope'"),
    (["train", f"--config={REPO}/experiments/no_such_file.py:smoke"],
     f"config file {REPO}/experiments/no_such_file.py not found"),
    (["train", f"--config={TRAIN}:nopreset"], "unknown preset 'nopreset'"),
    (["sweep", f"--config={SWEEP}:nopreset"], "preset 'nopreset'"),
    (["train", f"--config={TRAIN}:smoke", "--config.space.num_values=1", "--config.coverage=1.0"],
     "gives |O| = 1 object; expected at least 2 objects"),
])
def test_config_holes_are_one_line_usage_errors_and_write_nothing(tmp_path, capsys, monkeypatch,
                                                                  argv, named):
  code, err = run(argv + [f"--workdir={tmp_path / 'out'}"], capsys, monkeypatch)
  assert code == flags.USAGE_ERROR and len(err) == 1, err
  assert err[0].startswith(f"bindjax {argv[0]}: ") and named in err[0], err
  assert listing(tmp_path) == []


@pytest.mark.parametrize("name", ["train", "sweep"])
@pytest.mark.parametrize("shape", ["a file", "under a file", "not writable"])
def test_workdirs_that_cannot_be_used_are_one_line_errors(tmp_path, capsys, monkeypatch, name,
                                                          shape):
  preset = {"train": f"{TRAIN}:smoke", "sweep": f"{SWEEP}:smoke"}[name]
  taken = tmp_path / "taken"
  taken.write_text("mine")
  if shape == "not writable":
    if os.geteuid() == 0:   # root writes anywhere a mode allows nothing; sysfs refuses it too
      if not os.path.isdir("/sys/kernel"):
        pytest.skip("needs /sys or a non-root user")
      workdir, expected = "/sys/kernel/bindjax_test/run", flags.INPUT_ERROR
    else:
      locked = tmp_path / "locked"
      locked.mkdir(mode=0o500)
      workdir, expected = str(locked / "run"), flags.INPUT_ERROR
    named = f"cannot write to workdir {workdir}"
  else:
    workdir = str(taken if shape == "a file" else taken / "run")
    expected = flags.USAGE_ERROR
    named = "is a file; expected a directory" if shape == "a file" else (
        f"lies under {taken}, which is a file")
  code, err = run([name, f"--config={preset}", f"--workdir={workdir}"], capsys, monkeypatch)
  assert code == expected and len(err) == 1 and named in err[0], err
  assert err[0].startswith(f"bindjax {name}: ")
  assert taken.read_text() == "mine" and sorted(os.listdir(tmp_path)) == sorted(
      ["taken"] + (["locked"] if (tmp_path / "locked").exists() else []))


def _damaged_copy(tmp_path, damage):
  """The bundled reference folder with a damaged dataset.pkl (or a native set whose npz holds
  an object array); returns (folder, the damaged file)."""
  folder = tmp_path / "damaged"
  if damage == "object array":
    from bindjax.frozen import embeddings
    embeddings.read_embeddings(DATA).save(folder)
    arrays = dict(np.load(folder / "embeddings.npz"))
    arrays["num_objects"] = arrays["num_objects"].astype(object)
    np.savez(folder / "embeddings.npz", **arrays)
    return folder, folder / "embeddings.npz"
  shutil.copytree(DATA, folder)
  pkl = folder / "dataset.pkl"
  pkl.write_bytes(pkl.read_bytes()[:len(pkl.read_bytes()) // 2] if damage == "truncated" else b"")
  return folder, pkl


# `import` reads folders written by the original code only, so not the native set.
@pytest.mark.parametrize("name,damage", [
    (name, damage) for damage in ("truncated", "empty", "object array")
    for name in ("import", "probe", "interventions", "decompose", "complexity", "mds")
    if (name, damage) != ("import", "object array")])
def test_damaged_inputs_are_one_line_input_errors_naming_the_file(tmp_path, capsys, monkeypatch,
                                                                  name, damage):
  folder, damaged = _damaged_copy(tmp_path, damage)
  out = tmp_path / "out"
  code, err = run(commands(folder, out)[name], capsys, monkeypatch)
  assert code == flags.INPUT_ERROR and len(err) == 1, err
  assert err[0].startswith(f"bindjax {name}: ") and str(damaged) in err[0], err
  assert not out.exists()


def test_report_of_several_sweeps_follows_the_policy(tmp_path, capsys, monkeypatch):
  """Several sweeps in one report: without --out a usage error; one without rows is bad input
  named in the line; an unknown --step a usage error. Nothing is written in any case."""
  first = tmp_path / "first"
  first.mkdir()
  (first / "results.jsonl").write_text("")
  missing, out = tmp_path / "missing", tmp_path / "out"
  code, err = run(["report", f"--workdir={first},{missing}"], capsys, monkeypatch)
  assert code == flags.USAGE_ERROR and len(err) == 1 and "--out is required" in err[0], err
  code, err = run(["report", f"--workdir={first},{missing}", f"--out={out}"], capsys,
                  monkeypatch)
  assert code == flags.INPUT_ERROR and len(err) == 1 and str(first) in err[0], err
  for name in ("report", "binding"):
    argv = [name, f"--workdir={first}", f"--out={out}", "--step=last"]
    if name == "binding":
      argv.append(f"--config={BINDING}:smoke")
    code, err = run(argv, capsys, monkeypatch)
    assert code == flags.USAGE_ERROR and len(err) == 1 and "--step" in err[0], (name, err)
  assert listing(tmp_path) == ["first/results.jsonl"]
