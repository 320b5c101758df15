"""Helpers shared by the launchers: dated workdirs, quoting, dry runs."""
import datetime
import os
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dated_workdir(root, config, now=None):
  """ROOT/YYYYmmdd-HHMMSS-<config stem>-<preset>, e.g. .../20260130-120000-coverage_sweep-paper."""
  now = now or datetime.datetime.now(datetime.timezone.utc)
  path, _, preset = config.partition(":")
  stem = os.path.splitext(os.path.basename(path))[0]
  tag = "-".join(x for x in (stem, preset.replace(",", "_")) if x)
  return f"{root.rstrip('/')}/{now:%Y%m%d-%H%M%S}-{tag}"


def sweep_command(bindjax, config, workdir, extra=()):
  """argv of `bindjax sweep` (extra: more flags, e.g. --config.grid.seeds=0)."""
  return [bindjax, "sweep", f"--config={config}", f"--workdir={workdir}", *extra]


def quote(argv):
  return " ".join(shlex.quote(str(a)) for a in argv)


def run(commands, dry_run, shell=False):
  """Prints every command; unless dry_run also runs them, stopping at the first failure."""
  for command in commands:
    text = command if isinstance(command, str) else quote(command)
    print(("+ " if not dry_run else "") + text, flush=True)
    if dry_run:
      continue
    result = subprocess.run(command, shell=isinstance(command, str))
    if result.returncode:
      print(f"command failed with exit status {result.returncode}: {text}", file=sys.stderr)
      return result.returncode
  return 0


def split_extra(argv):
  """argv before and after a literal `--` (the part after is passed on to `bindjax sweep`)."""
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
  return argv, []
