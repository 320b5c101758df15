"""The persistent compilation cache of the commands: where it lives, off by a variable, and a
second run of the same sweep in another workdir compiles nothing new; the program store beside
it: a second run reads its bucket programs without tracing them, a damaged or foreign entry is
compiled again."""
import os
import pickle
import subprocess
import sys

import jax
import pytest

from bindjax.base import files
from bindjax.runtime import compilation_cache
from bindjax.runtime import program_store

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = os.path.join(REPO, "experiments", "coverage_sweep.py")


def get_config(arg=None):
  """Lets the subprocesses use this file as --config: one bucket of two replicas, a tiny model."""
  del arg
  from bindjax.commands import flags  # pylint: disable=g-import-not-at-top
  c = flags.load_config(f"{PRESETS}:smoke")
  c.grid.spaces = ((2, 3),)
  c.grid.coverages = (0.5,)
  c.grid.seeds = (0, 1)
  c.model.update(d_model=16, num_heads=2, num_layers=1, d_ff=32, d_out=8)
  c.sampler.update(batch_size=8, max_concept_queries=8, max_positive_queries=8)
  c.num_steps = 2
  c.eval.update(every=2, batches=1, batch_size=8)
  c.checkpoint.update(every=2, keep=1, keep_best=False)
  c.sweep.update(cpu_devices=0, chunk_size="none")
  return c


def test_cache_dir_follows_xdg_cache_home():
  assert compilation_cache.cache_dir({"XDG_CACHE_HOME": "/c"}) == "/c/bindjax/jax_cache"
  assert compilation_cache.cache_dir({}) == os.path.join(os.path.expanduser("~"), ".cache",
                                                         "bindjax", "jax_cache")


@pytest.mark.parametrize("value", ["0", "false", "Off"])
def test_switched_off_by_the_environment(value):
  assert compilation_cache.enable({compilation_cache.ENV: value}) is None


def test_program_store_off_by_its_variable_with_the_cache_on(monkeypatch, tmp_path):
  previous = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))
  try:
    monkeypatch.setenv(compilation_cache.PROGRAM_STORE_ENV, "1")
    assert program_store.directory() == str(tmp_path / program_store.STORE_DIR)
    monkeypatch.setenv(compilation_cache.PROGRAM_STORE_ENV, "0")
    assert program_store.directory() is None
    built = program_store.load_or_build("key", jax.devices()[:1], lambda: ("built",))
  finally:
    jax.config.update("jax_compilation_cache_dir", previous)
  assert built == ("built",) and not os.listdir(tmp_path)


def _entries(directory):
  return set(os.listdir(directory)) if os.path.isdir(directory) else set()


@pytest.mark.slow
def test_second_sweep_loads_every_program_from_the_cache(tmp_path):
  env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), XLA_FLAGS="",
             PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env[compilation_cache.ENV] = "1"
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env.pop(compilation_cache.PROGRAM_STORE_ENV, None)
  cache = compilation_cache.cache_dir(env)

  def sweep(workdir):
    subprocess.run([sys.executable, "-m", "bindjax.commands.main", "sweep", f"--config={__file__}",
                    f"--workdir={tmp_path / workdir}", "--noprogress", "--noreport"],
                   env=env, check=True, timeout=600, capture_output=True)
    return _entries(cache)

  first = sweep("a")
  assert first, "the first run cached no program"
  store = os.path.join(cache, program_store.STORE_DIR)
  stored = {name: os.stat(os.path.join(store, name)).st_mtime_ns for name in os.listdir(store)}
  assert len(stored) == 1   # one bucket: its init, run and eval in one entry
  assert sweep("b") == first
  # The second run read the entry (a rebuilt one is written anew) and its rows are the first's.
  assert {name: os.stat(os.path.join(store, name)).st_mtime_ns
          for name in os.listdir(store)} == stored
  rows = lambda workdir: files.read_jsonl(str(tmp_path / workdir / "results.jsonl"))
  assert rows("b") == rows("a")
  # A damaged entry costs a compile, not the run.
  (entry,) = stored
  with open(os.path.join(store, entry), "wb") as f:
    f.write(b"not a program")
  sweep("c")
  assert rows("c") == rows("a")
  assert os.path.getsize(os.path.join(store, entry)) > len(b"not a program")


class _Refused:
  def __reduce__(self):
    return (os.getcwd, ())


def test_a_stored_entry_resolves_no_class_outside_the_programs_modules(tmp_path):
  path = tmp_path / "entry"
  path.write_bytes(pickle.dumps(_Refused()))
  with pytest.raises(pickle.UnpicklingError, match="refers to posix.getcwd"):
    program_store.read_entry(str(path), jax.devices()[:1])
