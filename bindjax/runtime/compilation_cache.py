"""JAX's persistent compilation cache for bindjax's commands (docs/cli.md#compilation-cache).

The commands that compile training and fitting programs (`train`, `sweep`, `binding`,
`complexity`) call `enable()` before anything compiles: every compiled program is kept under
$XDG_CACHE_HOME/bindjax/jax_cache (~/.cache/bindjax/jax_cache), so a rerun, a resumed run or
the same models in another workdir load their programs instead of compiling them again.
BINDJAX_COMPILATION_CACHE=0 turns it off; a JAX_COMPILATION_CACHE_DIR set by the user wins.
BINDJAX_PROGRAM_STORE=0 keeps the cache and turns off only the program store beside it.
It is a process-wide JAX setting, so only commands turn it on, never an import of bindjax.
"""
import os

import jax

ENV = "BINDJAX_COMPILATION_CACHE"
PROGRAM_STORE_ENV = "BINDJAX_PROGRAM_STORE"
_OFF = ("0", "false", "no", "off")


def switched_off(name, environ=None):
  """Whether the environment variable `name` turns its feature off (0, false, no or off)."""
  environ = os.environ if environ is None else environ
  return environ.get(name, "1").strip().lower() in _OFF


def cache_dir(environ=None):
  """$XDG_CACHE_HOME/bindjax/jax_cache, ~/.cache/bindjax/jax_cache without XDG_CACHE_HOME."""
  environ = os.environ if environ is None else environ
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "bindjax", "jax_cache")


def enable(environ=None):
  """Turns the persistent cache on (unless BINDJAX_COMPILATION_CACHE is 0); returns its
  directory, or None when it is off."""
  environ = os.environ if environ is None else environ
  if switched_off(ENV, environ):
    return None
  directory = jax.config.jax_compilation_cache_dir or cache_dir(environ)
  jax.config.update("jax_compilation_cache_dir", directory)
  # JAX's defaults skip programs compiled in under a second and small entries; CPU compiles of
  # small models are exactly those, and a sweep compiles many of them.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  return directory
