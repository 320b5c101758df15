"""The `bindjax` dispatcher and the shared flag parsing of commands."""
import sys

import pytest

from bindjax.commands import flags
from bindjax.commands import main as cli


def test_help_lists_every_command(capsys):
  assert cli.main(["--help"]) == 0
  out = capsys.readouterr().out
  for name in cli.COMMANDS:
    assert name in out


def test_unknown_command_is_named(capsys):
  assert cli.main(["trian"]) == 2
  assert "'trian'" in capsys.readouterr().err


def test_every_command_answers_help_with_its_own_flags(capsys):
  # A flag each command defines in its own module, next to the shared ones.
  own_flag = {"train": "progress", "sweep": "coordinator_address", "report": "draws",
              "import": "reference", "probe": "train_fraction", "complexity": "config",
              "decompose": "embeddings", "interventions": "embeddings",
              "interventions-table": "summaries", "mds": "quadruple", "extract": "objects",
              "binding": "step"}
  assert set(own_flag) == set(cli.COMMANDS)
  for name in cli.COMMANDS:
    with pytest.raises(SystemExit) as e:
      cli.main([name, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and own_flag[name] in out and "--[no]help" in out, name


def test_config_overrides_come_from_the_given_argv(monkeypatch):
  monkeypatch.setattr(sys, "argv", ["python", "--config.num_steps=999"])
  fv = flags.new_flag_values()
  flags.parse(fv, ["bindjax train", "--config=experiments/train.py:smoke",
                   "--config.num_steps=7", "--workdir=unused"], required=("workdir",))
  assert fv["config"].value.num_steps == 7
  assert sys.argv == ["python", "--config.num_steps=999"]


def test_grid_lists_take_plain_comma_lists_and_single_values():
  fv = flags.new_flag_values()
  flags.parse(fv, ["bindjax sweep", "--config=experiments/coverage_sweep.py:smoke",
                   "--config.grid.seeds=0,1,2", "--config.grid.coverages=0.5",
                   "--config.grid.spaces=(2,20),(3,10)", "--workdir=unused"])
  grid = fv["config"].value.grid
  assert grid.seeds == (0, 1, 2)
  assert grid.coverages == (0.5,)
  assert grid.spaces == ((2, 20), (3, 10))


def test_missing_required_flag_and_stray_arguments_exit_2(capsys):
  with pytest.raises(SystemExit) as e:
    flags.parse(flags.new_flag_values(with_config=False), ["bindjax report"],
                required=("workdir",))
  assert e.value.code == 2 and "--workdir is required" in capsys.readouterr().err
  with pytest.raises(SystemExit) as e:
    flags.parse(flags.new_flag_values(with_config=False), ["bindjax report", "extra"])
  assert e.value.code == 2 and "unexpected arguments" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["probe", "interventions"])
def test_refused_pickle_is_a_one_line_input_error(tmp_path, capsys, command):
  """A pickle naming a code-running global is refused before anything runs: exit 1, one line
  naming the file and the global, nothing written."""
  import os  # pylint: disable=g-import-not-at-top
  import pickle  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  source = os.path.join(os.path.dirname(__file__), "data", "clevr_text")
  data = tmp_path / "set"
  shutil.copytree(source, data)
  poisoned = data / "clevr_text_minilm_embeddings.pkl"
  poisoned.write_bytes(pickle.dumps(os.system))
  out = tmp_path / "out"
  assert cli.main([command, f"--embeddings={data}", f"--workdir={out}"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and str(poisoned) in err[0] and "system" in err[0], err
  assert not out.exists() or not os.listdir(out)


@pytest.mark.parametrize("command,phrase", [("complexity", "Config fields"),
                                            ("probe", "probes.npz"),
                                            ("interventions", "position-dependent")])
def test_help_says_what_the_command_does(capsys, command, phrase):
  with pytest.raises(SystemExit) as exit_info:
    cli.main([command, "--help"])
  assert exit_info.value.code == 0
  out = capsys.readouterr().out
  assert phrase in out and "flags:" in out and "--workdir" in out
