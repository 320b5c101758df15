"""JAX's persistent compilation cache for bindjax's commands (docs/cli.md#compilation-cache).

The commands that compile training and fitting programs (`train`, `sweep`, `binding`,
`complexity`) call `enable()` before anything compiles: every compiled program is kept under
$XDG_CACHE_HOME/bindjax/jax_cache (~/.cache/bindjax/jax_cache), so a rerun, a resumed run or
the same models in another workdir load their programs instead of compiling them again.
BINDJAX_COMPILATION_CACHE=0 turns it off; a JAX_COMPILATION_CACHE_DIR set by the user wins.
It is a process-wide JAX setting, so only commands turn it on, never an import of bindjax.

JAX's cache is keyed on the lowered program, so a hit still pays for tracing and lowering, which
for a sweep bucket's programs is most of a warm start. `load_or_compile` keeps whole compiled
programs (serialized executables) beside it, under a key made of what determines them (the
program's description, bindjax's source, the JAX version, XLA_FLAGS), so a rerun skips tracing.
"""
import functools
import hashlib
import os
import pickle

import jax
from jax.experimental import serialize_executable

PROGRAMS = "bindjax_programs"   # the folder of whole programs, inside JAX's cache folder

ENV = "BINDJAX_COMPILATION_CACHE"
_OFF = ("0", "false", "no", "off")


def cache_dir(environ=None):
  """$XDG_CACHE_HOME/bindjax/jax_cache, ~/.cache/bindjax/jax_cache without XDG_CACHE_HOME."""
  environ = os.environ if environ is None else environ
  base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "bindjax", "jax_cache")


def enable(environ=None):
  """Turns the persistent cache on (unless BINDJAX_COMPILATION_CACHE is 0); returns its
  directory, or None when it is off."""
  environ = os.environ if environ is None else environ
  if environ.get(ENV, "1").strip().lower() in _OFF:
    return None
  directory = jax.config.jax_compilation_cache_dir or cache_dir(environ)
  jax.config.update("jax_compilation_cache_dir", directory)
  # JAX's defaults skip programs compiled in under a second and small entries; CPU compiles of
  # small models are exactly those, and a sweep compiles many of them.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  return directory


def programs_dir():
  """The folder of `load_or_compile`'s programs, or None when JAX's persistent cache is off."""
  directory = jax.config.jax_compilation_cache_dir
  if not directory or not jax.config.jax_enable_compilation_cache:
    return None
  return os.path.join(directory, PROGRAMS)


@functools.cache
def _source_digest():
  """SHA-256 of every Python file of the bindjax package: a program traced from other code is
  another program."""
  root = os.path.dirname(os.path.abspath(__file__))
  digest = hashlib.sha256()
  for folder, dirs, names in sorted(os.walk(root)):
    dirs.sort()
    for name in sorted(n for n in names if n.endswith(".py")):
      path = os.path.join(folder, name)
      digest.update(os.path.relpath(path, root).encode())
      with open(path, "rb") as f:
        digest.update(f.read())
  return digest.hexdigest()


def program_key(description):
  """The file name of the programs `description` (a string naming everything the programs depend
  on besides bindjax's source, JAX and XLA_FLAGS) are kept under."""
  digest = hashlib.sha256()
  for part in (description, _source_digest(), jax.__version__, jax.lib.__version__,
               os.environ.get("XLA_FLAGS", "")):
    digest.update(part.encode())
    digest.update(b"\0")
  return digest.hexdigest()


def load_or_compile(description, build, devices):
  """build()'s tuple of compiled programs for `devices` (the mesh's, in its order), loaded from
  `programs_dir()` when a run before kept them under `description` (`program_key`), else built
  and kept there. Returns (programs, loaded). With the persistent cache off, or when a program
  closes over constants (which a serialized executable does not carry), build() and keep nothing.
  """
  directory = programs_dir()
  if directory is None:
    return build(), False
  path = os.path.join(directory, program_key(description) + ".pkl")
  if os.path.exists(path):
    try:
      with open(path, "rb") as f:
        stored = pickle.load(f)
      devices = list(devices)
      return tuple(serialize_executable.deserialize_and_load(
          *p, backend=devices[0].client, execution_devices=devices) for p in stored), True
    except Exception:  # pylint: disable=broad-except
      pass  # a damaged or foreign file only costs the compile it was meant to save
  programs = build()
  if any(p._params.const_args for p in programs):  # pylint: disable=protected-access
    return programs, False
  os.makedirs(directory, exist_ok=True)
  temporary = f"{path}.{os.getpid()}.tmp"
  with open(temporary, "wb") as f:
    pickle.dump([serialize_executable.serialize(p) for p in programs], f)
  os.replace(temporary, path)
  return programs, False
