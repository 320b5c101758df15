"""The command-line policy every `bindjax` command follows, and shared flag parsing.

Policy:
- A usage error (a bad, missing or conflicting flag or config value, or an output directory
  that is not empty without `--overwrite`) prints one line to stderr and exits with status 2
  (`UsageError`).
- Bad input data (a file or directory the command reads is missing, unreadable or malformed)
  prints one line and exits with status 1 (`InputError`).
- Each line starts with the command's name and names the flag, field or file and what was
  expected.
- A command that writes checks its output directory (`check_output_dir`) and everything it reads
  before writing anything, so a failed command leaves no files behind.

Each command builds its own absl FlagValues so commands never share global flag state (tests call
several commands in one process).
"""
import contextlib
import os
import sys
import textwrap

from absl import flags
from ml_collections import config_flags

from bindjax.base import errors
from bindjax.base import files

USAGE_ERROR = 2
INPUT_ERROR = 1


def one_line(text):
  """`text` on one line; of a traceback (config files that fail to load) only its last line."""
  lines = [line.strip() for line in str(text).splitlines() if line.strip()]
  if any(line.startswith("Traceback (most recent call last)") for line in lines):
    lines = lines[-1:]
  return " ".join(lines)


class UsageError(SystemExit):
  """Bad command line or config value: printed to stderr on one line, exit status 2."""

  def __init__(self, message):
    print(one_line(message), file=sys.stderr)
    super().__init__(USAGE_ERROR)


class InputError(SystemExit):
  """Bad input data: printed to stderr on one line, exit status 1."""

  def __init__(self, message):
    print(one_line(message), file=sys.stderr)
    super().__init__(INPUT_ERROR)


@contextlib.contextmanager
def usage_errors(prog):
  """Turns a ValueError raised inside the block into a UsageError prefixed with `prog`."""
  try:
    yield
  except ValueError as e:
    raise UsageError(f"{prog}: {e}") from None


@contextlib.contextmanager
def run_errors(prog):
  """For a library run that reads data and settings: a ConfigError becomes a UsageError, any
  other ValueError or OSError an InputError."""
  try:
    yield
  except errors.ConfigError as e:
    raise UsageError(f"{prog}: {e}") from None
  except (ValueError, OSError) as e:
    raise InputError(f"{prog}: {e}") from None


@contextlib.contextmanager
def input_errors(prog):
  """Turns a ValueError or OSError raised inside the block into an InputError."""
  try:
    yield
  except (ValueError, OSError) as e:
    raise InputError(f"{prog}: {e}") from None


def new_flag_values(with_config=True, with_workdir=True, config_help="experiment config",
                    workdir_help="directory for results and checkpoints"):
  """A fresh FlagValues holding --config (ml_collections config file) and --workdir (described
  by `workdir_help`: what the command reads or writes there)."""
  flag_values = flags.FlagValues()
  if with_config:
    config_flags.DEFINE_config_file(
        "config", None, f"{config_help}: path/to/file.py[:ARG]; override fields with "
        "--config.field=value", flag_values=flag_values, lock_config=True)
  if with_workdir:
    flags.DEFINE_string("workdir", None, workdir_help, flag_values=flag_values)
  flags.DEFINE_bool("help", False, "show this help", flag_values=flag_values, short_name="h")
  return flag_values


def define_overwrite(flag_values):
  """Adds --overwrite: allow writing into a non-empty output directory."""
  flags.DEFINE_bool("overwrite", False, "write into a non-empty output directory, replacing "
                    "what the command writes there", flag_values=flag_values)


def parse(flag_values, argv, required=(), description=None, default_config=None):
  """Parses argv (argv[0] is the program name) into flag_values; clear errors for bad input.

  --help prints `description` (what the command does; e.g. its module docstring, whose first
  line is the usage line), then the flags, then the config's fields with their values: those of
  --config when given, else of `default_config()` (a callable, called only for --help).
  """
  argv = list(argv)
  if "config" in flag_values:
    _check_config_file(argv)
  # ml_collections finds `--config.field=value` overrides in sys.argv at parse time; point it at
  # this argv so commands called in-process (tests, notebooks) see their own overrides.
  saved_argv, sys.argv = sys.argv, argv
  try:
    rest = flag_values(argv)
    if "config" in flag_values and flag_values["config"].present:
      flag_values["config"].value  # pylint: disable=pointless-statement  (loads it now)
  except flags.Error as e:
    raise UsageError(f"{argv[0]}: {one_line(e)}") from None
  except (AttributeError, KeyError) as e:
    raise UsageError(_unknown_field_message(argv, e)) from None
  except Exception as e:  # a config file that fails to load: its own error, on one line
    raise UsageError(f"{argv[0]}: --config: {type(e).__name__}: {one_line(e)}") from None
  finally:
    sys.argv = saved_argv
  if flag_values["help"].value:
    if description:
      print(usage_line(description))
      print(textwrap.dedent(description).strip() + "\n\nflags:")
    # get_help, not main_module_help: the flags are defined in several modules (this one and the
    # command's), and main_module_help shows only one of them.
    print(flag_values.get_help())
    if "config" in flag_values:
      print(_config_fields(flag_values, default_config))
    raise SystemExit(0)
  if len(rest) > 1:
    raise UsageError(f"{argv[0]}: unexpected arguments {rest[1:]}")
  for name in required:
    if flag_values[name].value is None:
      raise UsageError(f"{argv[0]}: --{name} is required")
  return flag_values


def usage_line(description):
  """"usage: bindjax CMD --flags..." from a command's docstring, which opens with it in
  backticks (over one or two lines)."""
  usage = description.split("`")[1] if description.startswith("`") else description
  return "usage: " + " ".join(usage.split())


def _config_fields(flag_values, default_config):
  """The --help lines listing the fields of --config (or of `default_config()`) and values."""
  if flag_values["config"].present:
    config = flag_values["config"].value
    source = f"--config={flag_values['config'].config_filename}"
  elif default_config is not None:
    config, source = default_config(), "the defaults"
  else:
    return "\nconfig fields: pass --config=FILE[:ARG] with --help to list its fields"
  lines = [f"  {name} = {value!r}" for name, value in _leaves(config)]
  return (f"\nconfig fields (--config.FIELD=VALUE), with the values of {source}:\n"
          + "\n".join(lines))


def _leaves(config, prefix=""):
  """(dotted field name, value) of every leaf of a ConfigDict, in sorted order."""
  for name in sorted(config.keys()):
    value = config[name]
    if hasattr(value, "keys"):
      yield from _leaves(value, f"{prefix}{name}.")
    else:
      yield f"{prefix}{name}", value


def _config_arg(argv):
  """The value of --config= in argv (None when absent)."""
  for arg in argv[1:]:
    if arg.startswith("--config="):
      return arg[len("--config="):]
  return None


def _check_config_file(argv):
  value = _config_arg(argv)
  if value is not None and not os.path.isfile(value.split(":", 1)[0]):
    raise UsageError(f"{argv[0]}: --config={value}: config file {value.split(':', 1)[0]} not "
                     "found; expected path/to/file.py[:ARG]")


def _unknown_field_message(argv, error):
  """The one line for a --config.a.b=... override naming a field the config lacks."""
  key = str(error.args[0] if error.args else error).strip("\"'")
  overrides = [a[len("--config."):].split("=", 1)[0] for a in argv[1:]
               if a.startswith("--config.")]
  path = next((o for o in overrides if key in o.split(".")), key)
  parts = path.split(".")
  parent = parts[:parts.index(key)] if key in parts else []
  expected = ""
  try:
    node = load_config(_config_arg(argv))
    for part in parent:
      node = node[part]
    expected = f"; expected one of {', '.join(sorted(node.keys()))}"
  except (KeyError, AttributeError, TypeError):
    pass
  where = "config." + ".".join(parent) if parent else "the config"
  return f"{argv[0]}: --config.{path}: {where} has no field {key!r}{expected}"


def check_output_dir(prog, flag, directory, overwrite):
  """UsageError unless `directory` (any `etils.epath` path) is absent, empty, or non-empty with
  overwrite=True.

  `flag` names the flag that gave the directory, for the message.
  """
  path = files.as_path(directory)
  if path.exists() and not path.is_dir():
    raise UsageError(f"{prog}: --{flag}={directory} is a file; expected a directory")
  if path.is_dir() and any(path.iterdir()) and not overwrite:
    raise UsageError(f"{prog}: --{flag}={directory} is not empty; expected a new or empty "
                     "directory, or pass --overwrite")


def load_config(path_and_arg):
  """The ConfigDict of `path/to/file.py[:ARG]`, loaded exactly as `--config=` loads it.

  For tests and scripts that need a preset without a command line. A bad path or argument is a
  UsageError, as on the command line.
  """
  path = path_and_arg.split(":", 1)[0]
  if not os.path.isfile(path):
    raise UsageError(f"load_config: config file {path} not found; expected path/to/file.py[:ARG]")
  flag_values = new_flag_values(with_workdir=False)
  parse(flag_values, ["load_config", f"--config={path_and_arg}"])
  return flag_values["config"].value
