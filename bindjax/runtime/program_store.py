"""Compiled programs kept on disk, so that a warm start skips tracing as well as XLA.

JAX's persistent compilation cache (`bindjax.runtime.compilation_cache`) is keyed by the lowered
program, so a cached sweep still traces and lowers every program before it finds it: for small
models that is most of a warm start (docs/cli.md#compilation-cache). The store keys a group of
programs by what built them instead: the caller's key (a bucket's ProgramSpec, mesh, replica
count, chunk, options and input signature), the digest of bindjax's own source, the jax and
jaxlib versions, the devices, XLA_FLAGS and JAX's settings. Any change to those is a new key, and
a stored entry that cannot be read is compiled again and replaced; the store only saves time.

It lives beside the compilation cache (`<cache dir>/bindjax_programs`) and is used only when that
cache is on, the run is a single process and BINDJAX_PROGRAM_STORE is not 0. The key holds
bindjax's source files, not the functions a process runs: code that patches bindjax at run time
(a test's monkeypatch, a notebook's) must turn the store off. Entries are read with an
unpickler that resolves only the classes of jax, jaxlib, numpy, flax, optax and bindjax and a
few builtins (what the programs and their argument trees are made of).
"""
import functools
import hashlib
import io
import os
import pickle
import tempfile

import jax
import jaxlib
from jax.experimental import serialize_executable

from bindjax.runtime import compilation_cache

STORE_DIR = "bindjax_programs"
SUFFIX = ".programs"
# JAX settings that do not change a compiled program (and vary between runs of one program).
_IGNORED_SETTINGS = ("log", "cache", "explain", "traceback", "debug")
_ALLOWED_MODULES = ("jax", "jaxlib", "numpy", "ml_dtypes", "flax", "optax", "bindjax")
_ALLOWED_BUILTINS = {"tuple", "list", "dict", "set", "frozenset", "slice", "complex", "bytes",
                     "object", "NoneType"}


def directory():
  """The store's folder, or None when programs are not stored (the compilation cache is off, the
  run spans several processes, or BINDJAX_PROGRAM_STORE is 0)."""
  cache = jax.config.jax_compilation_cache_dir
  if (not cache or jax.process_count() > 1 or
      compilation_cache.switched_off(compilation_cache.PROGRAM_STORE_ENV)):
    return None
  return os.path.join(cache, STORE_DIR)


@functools.cache
def _source_digest():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digest = hashlib.sha256()
  for folder, subfolders, names in sorted(os.walk(root)):
    subfolders.sort()
    for name in sorted(n for n in names if n.endswith(".py")):
      path = os.path.join(folder, name)
      digest.update(os.path.relpath(path, root).encode())
      with open(path, "rb") as f:
        digest.update(f.read())
  return digest.hexdigest()


def _environment():
  settings = sorted((name, repr(value)) for name, value in jax.config.values.items()
                    if not any(word in name for word in _IGNORED_SETTINGS))
  devices = [(d.id, d.platform, d.device_kind, d.process_index) for d in jax.devices()]
  backend = jax.devices()[0].client
  return (_source_digest(), jax.__version__, jaxlib.__version__, backend.platform_version,
          os.environ.get("XLA_FLAGS", ""), tuple(devices), tuple(settings))


def entry_path(key):
  """The file that holds the programs stored under `key` (None when programs are not stored)."""
  folder = directory()
  if folder is None:
    return None
  name = hashlib.sha256(repr((key, _environment())).encode()).hexdigest()
  return os.path.join(folder, name + SUFFIX)


class _Unpickler(serialize_executable._JaxPjrtUnpickler):  # pylint: disable=protected-access
  """JAX's executable unpickler, resolving only the classes compiled programs are made of."""

  def find_class(self, module, name):
    if module == "builtins" and name in _ALLOWED_BUILTINS:
      return super().find_class(module, name)
    if module.split(".")[0] in _ALLOWED_MODULES:
      return super().find_class(module, name)
    raise pickle.UnpicklingError(f"a stored program refers to {module}.{name}")


def _save(path, programs):
  with io.BytesIO() as buffer:
    serialize_executable._JaxPjrtPickler(buffer).dump(  # pylint: disable=protected-access
        [(p._executable._unloaded_executable, p.args_info, p.out_tree,  # pylint: disable=protected-access
          p._no_kwargs) for p in programs])  # pylint: disable=protected-access
    data = buffer.getvalue()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".partial")
  with os.fdopen(fd, "wb") as f:
    f.write(data)
  os.replace(partial, path)


def read_entry(path, devices):
  """The compiled programs of the stored entry `path`, loaded onto `devices` (their device
  assignment's order); pickle.UnpicklingError names a class the entry refers to outside the
  modules programs are made of."""
  backend = devices[0].client
  with open(path, "rb") as f:
    stored = _Unpickler(f, backend, devices).load()
  return tuple(jax.stages.Compiled(unloaded.load(), [], args_info, out_tree, no_kwargs=no_kwargs)
               for unloaded, args_info, out_tree, no_kwargs in stored)


def load_or_build(key, devices, build, log=None):
  """build()'s tuple of compiled programs, read from the store when an entry for `key` exists and
  written to it otherwise. `key` must describe everything the programs depend on besides
  bindjax's source and the machine (its repr is hashed); `devices` are the devices the programs
  run on, in the order of their device assignment (a mesh's `devices.flat`). log(message) hears
  of entries that could not be read or written."""
  path = entry_path((key, tuple(d.id for d in devices)))
  if path is None:
    return build()
  if os.path.exists(path):
    try:
      return read_entry(path, list(devices))
    except Exception as e:  # pylint: disable=broad-except
      # A store of another jax build, or a damaged file: compiling again costs only time.
      if log:
        log(f"stored programs {path} not read ({type(e).__name__}: {e}); compiling them again")
  programs = build()
  try:
    _save(path, programs)
  except Exception as e:  # pylint: disable=broad-except
    if log:
      log(f"compiled programs not stored in {path} ({type(e).__name__}: {e})")
  return programs
