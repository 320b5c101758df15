"""Test session set-up: 8 fake CPU devices so sharded code is exercised on any machine, and no
persistent compilation cache for the commands tests run in-process (it is a process-wide JAX
setting, and the user's cache is not the tests' to fill)."""
import os

import pytest

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["BINDJAX_COMPILATION_CACHE"] = "0"

import jax  # noqa: E402  (after the environment it reads)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module: every program keeps its machine code
  in memory maps of its own, and the whole suite in one process otherwise reached the kernel's
  per-process map limit (65,530 by default) and crashed inside a compile."""
  yield
  jax.clear_caches()
