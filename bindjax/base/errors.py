"""The one error type the library adds: a bad setting, as opposed to bad input data.

Library functions raise ValueError for both; where one function reads data and settings together
(`bindjax.complexity.analysis.run`), it raises `ConfigError` for a bad setting, so a command can
exit 2 for a usage error and 1 for bad input data (docs/cli.md).
"""
import contextlib


class ConfigError(ValueError):
  """A config field or argument has a value the library cannot use."""


@contextlib.contextmanager
def config_errors():
  """Re-raises a ValueError from inside the block as a ConfigError with the same message."""
  try:
    yield
  except ConfigError:
    raise
  except ValueError as e:
    raise ConfigError(str(e)) from None
