"""The persistent compilation cache of the commands: where it lives, off by a variable, and a
second run of the same sweep in another workdir compiles nothing new."""
import os
import subprocess
import sys

import pytest

from bindjax.runtime import compilation_cache

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


def _entries(directory):
  return set(os.listdir(directory)) if os.path.isdir(directory) else set()


@pytest.mark.slow
def test_second_sweep_loads_every_program_from_the_cache(tmp_path):
  env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), XLA_FLAGS="",
             PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env[compilation_cache.ENV] = "1"
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  cache = compilation_cache.cache_dir(env)

  def sweep(workdir):
    subprocess.run([sys.executable, "-m", "bindjax.commands.main", "sweep", f"--config={__file__}",
                    f"--workdir={tmp_path / workdir}", "--noprogress", "--noreport"],
                   env=env, check=True, timeout=600, capture_output=True)
    return _entries(cache)

  first = sweep("a")
  assert first, "the first run cached no program"
  assert sweep("b") == first
