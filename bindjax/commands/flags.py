"""Shared flag parsing for commands: `--config=FILE:ARG`, `--config.field=value`, `--workdir`.

Each command builds its own absl FlagValues so commands never share global flag state (tests call
several commands in one process).
"""
import sys
import textwrap

from absl import flags
from ml_collections import config_flags


class UsageError(SystemExit):
  """Bad command line: printed to stderr with exit status 2."""

  def __init__(self, message):
    print(message, file=sys.stderr)
    super().__init__(2)


def new_flag_values(with_config=True, with_workdir=True, config_help="experiment config"):
  """A fresh FlagValues holding --config (ml_collections config file) and --workdir."""
  flag_values = flags.FlagValues()
  if with_config:
    config_flags.DEFINE_config_file(
        "config", None, f"{config_help}: path/to/file.py[:ARG]; override fields with "
        "--config.field=value", flag_values=flag_values, lock_config=True)
  if with_workdir:
    flags.DEFINE_string("workdir", None, "directory for results and checkpoints",
                        flag_values=flag_values)
  flags.DEFINE_bool("help", False, "show this help", flag_values=flag_values, short_name="h")
  return flag_values


def parse(flag_values, argv, required=(), description=None):
  """Parses argv (argv[0] is the program name) into flag_values; clear errors for bad input.

  --help prints `description` (what the command does; e.g. its module docstring), then the flags.
  """
  argv = list(argv)
  # ml_collections finds `--config.field=value` overrides in sys.argv at parse time; point it at
  # this argv so commands called in-process (tests, notebooks) see their own overrides.
  saved_argv, sys.argv = sys.argv, argv
  try:
    rest = flag_values(argv)
  except flags.Error as e:
    raise UsageError(f"{argv[0]}: {e}") from None
  finally:
    sys.argv = saved_argv
  if flag_values["help"].value:
    if description:
      print(textwrap.dedent(description).strip() + "\n\nflags:")
    print(flag_values.main_module_help() or flag_values.get_help())
    raise SystemExit(0)
  if len(rest) > 1:
    raise UsageError(f"{argv[0]}: unexpected arguments {rest[1:]}")
  for name in required:
    if flag_values[name].value is None:
      raise UsageError(f"{argv[0]}: --{name} is required")
  return flag_values
