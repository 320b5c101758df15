"""Test session set-up: 8 fake CPU devices so sharded code is exercised on any machine, and no
persistent compilation cache for the commands tests run in-process (it is a process-wide JAX
setting, and the user's cache is not the tests' to fill); and `memory_fs`, an in-memory file
system standing in for gs://."""
import os

import pytest

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["BINDJAX_COMPILATION_CACHE"] = "0"

import fsspec  # noqa: E402
from etils.epath import backend as epath_backend  # noqa: E402
from etils.epath import gpath as epath_gpath  # noqa: E402
import jax  # noqa: E402  (after the environment it reads)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops JAX's compiled programs after each test module: every program keeps its machine code
  in memory maps of its own, and the whole suite in one process otherwise reached the kernel's
  per-process map limit (65,530 by default) and crashed inside a compile."""
  yield
  jax.clear_caches()


# The bucket the memory_fs fixture serves from memory.
MEMORY_ROOT = "gs://bindjax-memory"


class _MemoryBackend(epath_backend._FileSystemSpecBackend):  # pylint: disable=protected-access
  """epath's fsspec backend with gs:// served by fsspec's in-memory file system."""

  def fs(self, path):
    if os.fspath(path).startswith(MEMORY_ROOT):
      return fsspec.filesystem("memory")
    return super().fs(path)


@pytest.fixture
def memory_fs(monkeypatch, tmp_path):
  """A non-local file system in memory, as epath sees gs://: yields MEMORY_ROOT.

  epath 1.15 serves only its own URI schemes (gs://, s3://, az://, hf://), so the fixture maps
  gs:// onto fsspec's memory file system the way `epath.testing.mock_epath` swaps backends. The
  test runs in an empty working directory, which must stay empty: a gs:// path handed to os.*
  or open() would land there as a local gs: folder.
  """
  backends = epath_gpath._PREFIX_TO_BACKEND  # pylint: disable=protected-access
  monkeypatch.setitem(backends, "gs", _MemoryBackend())
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  yield MEMORY_ROOT
  assert not os.listdir(cwd), f"files written locally instead of in memory: {os.listdir(cwd)}"
  store = fsspec.filesystem("memory").store
  for key in [k for k in store if k.startswith(MEMORY_ROOT)]:
    del store[key]
