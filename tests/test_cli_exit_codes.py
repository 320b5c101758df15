"""Every command's --help opens with its usage line, and each exit status docs/cli.md documents
is what the commands return, on cheap cases of each."""
import os
import re

import pytest

from bindjax.base import progress
from bindjax.commands import flags
from bindjax.commands import main as cli
from bindjax.workdir import layout
from bindjax.workdir import results

import test_workdir_integrity

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP = os.path.join(REPO, "experiments", "coverage_sweep.py")
COMPLEXITY = os.path.join(REPO, "experiments", "complexity.py")


def run(argv, capsys, monkeypatch):
  """(exit status, stdout, stderr lines) of `bindjax ARGV` in-process."""
  code, out, err = test_workdir_integrity.run_cli(argv, capsys, monkeypatch)
  return code, "\n".join(out), err


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_help_opens_with_the_usage_line_and_exits_0(name, capsys, monkeypatch):
  code, out, _ = run([name, "--help"], capsys, monkeypatch)
  first = out.splitlines()[0]
  assert code == 0 and first.startswith(f"usage: bindjax {name} --"), first
  assert "--workdir" not in out or "directory for results and checkpoints" not in out


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_a_bad_flag_exits_2_on_one_line(name, capsys, monkeypatch):
  code, _, err = run([name, "--no_such_flag=1"], capsys, monkeypatch)
  assert code == flags.USAGE_ERROR and len(err) == 1 and "no_such_flag" in err[0], err
  assert err[0].startswith(f"bindjax {name}")


def test_config_help_lists_the_presets_fields_with_values(capsys, monkeypatch):
  code, out, _ = run(["sweep", f"--config={SWEEP}:cpu", "--help"], capsys, monkeypatch)
  assert code == 0 and "grid.coverages = (0.3, " in out and "sweep.chunk_size = " in out
  code, out, _ = run(["sweep", "--help"], capsys, monkeypatch)
  assert code == 0 and "grid.seeds = ()" in out and "model.d_model = 256" in out


def _sweep_workdir(tmp_path):
  """A workdir holding the smoke sweep's config only: enough for extract to count replicas."""
  from bindjax.base import files  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "sweep"
  workdir.mkdir()
  files.write_json(workdir / layout.CONFIG_FILE,
                   results.config_json(flags.load_config(f"{SWEEP}:smoke")), sort_keys=True)
  return workdir


def _interrupted_probe(monkeypatch):
  """Makes `bindjax probe` stop as Ctrl-C stops it, at step 40 of 100."""
  from bindjax.frozen.probes import probe_analysis  # pylint: disable=g-import-not-at-top

  def interrupted(*args, **kwargs):
    del args, kwargs
    bar, advance = progress.loss_bar(100, "step", enabled=False)
    advance(40, [1.0])
    bar.close()
    raise KeyboardInterrupt
  monkeypatch.setattr(probe_analysis, "run", interrupted)


# Exit status -> cheap cases: (argv given tmp_path, what the one stderr line says after the
# command's name).
CASES = {
    flags.USAGE_ERROR: [
        (lambda t: ["sweep", f"--config={SWEEP}:no_such_preset", f"--workdir={t / 'w'}"],
         "preset 'no_such_preset'; expected smoke, cpu,"),
        (lambda t: ["train", f"--config={t / 'missing.py'}", f"--workdir={t / 'w'}"],
         "--config="),
        (lambda t: ["extract", f"--workdir={_sweep_workdir(t)}"],
         "workdir "),
        (lambda t: ["complexity", f"--config={COMPLEXITY}:smoke", f"--embeddings={t}",
                    f"--config.embeddings={t}", f"--workdir={t / 'w'}"],
         "--embeddings and --config.embeddings"),
    ],
    flags.INPUT_ERROR: [
        (lambda t: ["report", f"--workdir={t / 'missing'}", f"--out={t / 'out'}"],
         "missing"),
        (lambda t: ["probe", f"--embeddings={t / 'missing'}", f"--workdir={t / 'out'}"],
         "missing"),
        (lambda t: ["extract", f"--workdir={t / 'missing'}", f"--out={t / 'out'}"],
         "workdir "),
    ],
    cli.INTERRUPTED: [
        (lambda t: ["probe", f"--embeddings={t}", f"--workdir={t / 'out'}"],
         "interrupted at step 40 of 100; run the same command with --overwrite "
         "to start again"),
    ],
}


def test_every_documented_exit_status_has_cases():
  with open(os.path.join(REPO, "docs", "cli.md")) as f:
    documented = {int(n) for n in re.findall(r"\bexits? (\d+)", f.read())}
  assert documented == set(CASES) | {0, flags.INPUT_ERROR}, documented


@pytest.mark.parametrize("code,case,expected", [
    (code, case, expected) for code, cases in CASES.items() for case, expected in cases])
def test_each_documented_exit_status_is_returned(code, case, expected, tmp_path, capsys,
                                                 monkeypatch):
  if code == cli.INTERRUPTED:
    _interrupted_probe(monkeypatch)
  argv = case(tmp_path)
  got, _, err = run(argv, capsys, monkeypatch)
  assert got == code and len(err) == 1, (got, err)
  assert err[0].startswith(f"bindjax {argv[0]}: ") and expected in err[0], err
