"""The command-line policy (bindjax.commands.flags) on the commands that follow it.

Bad input data exits 1 and a usage error exits 2, each with one line on stderr that names the
file or flag; a non-empty output directory is refused without --overwrite; nothing is written.
"""
import os

import pytest

from bindjax import cli
from bindjax.commands import flags

DATA = os.path.join(os.path.dirname(__file__), "data", "clevr_text")


def listing(path):
  return sorted(os.path.relpath(os.path.join(d, f), path)
                for d, _, names in os.walk(path) for f in names)


def run(argv, capsys):
  """(exit status, stderr lines) of `bindjax ARGV` run in-process."""
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  return e.value.code, capsys.readouterr().err.splitlines()


def commands(bad_input, out):
  """Each command of the policy with an input that does not exist and output `out`."""
  return {
      "import": ["import", f"--reference={bad_input}", f"--out={out}"],
      "extract": ["extract", f"--workdir={bad_input}", f"--out={out}"],
      "mds": ["mds", f"--embeddings={bad_input}", f"--workdir={out}",
              "--quadruple=red,blue,cube,sphere"],
      "interventions-table": ["interventions-table", f"--summaries={bad_input}",
                              f"--workdir={out}"],
  }


@pytest.mark.parametrize("name", ["import", "extract", "mds", "interventions-table"])
def test_bad_input_exits_1_naming_the_input_and_writes_nothing(tmp_path, capsys, name):
  missing, out = tmp_path / "missing", tmp_path / "out"
  code, err = run(commands(missing, out)[name], capsys)
  assert code == flags.INPUT_ERROR
  assert len(err) == 1 and err[0].startswith(f"bindjax {name}: ") and str(missing) in err[0]
  assert not out.exists() and listing(tmp_path) == []


@pytest.mark.parametrize("name", ["import", "extract", "mds", "interventions-table"])
def test_non_empty_output_is_a_usage_error_and_is_left_alone(tmp_path, capsys, name):
  out = tmp_path / "out"
  out.mkdir()
  (out / "keep.txt").write_text("mine")
  code, err = run(commands(DATA, out)[name], capsys)
  assert code == flags.USAGE_ERROR
  assert len(err) == 1 and f"={out} is not empty" in err[0] and "--overwrite" in err[0]
  assert listing(out) == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


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
