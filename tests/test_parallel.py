"""Tests of bindjax.runtime.parallel on the 8 fake CPU devices from conftest."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from bindjax.runtime import multihost
from bindjax.runtime import parallel


def test_make_mesh_axes_and_types():
  mesh = parallel.make_mesh()
  assert mesh.axis_names == ("replica", "data")
  assert dict(mesh.shape) == {"replica": jax.device_count(), "data": 1}
  assert all(t == AxisType.Auto for t in mesh.axis_types)
  mesh = parallel.make_mesh(num_data=2)
  assert dict(mesh.shape) == {"replica": jax.device_count() // 2, "data": 2}
  with pytest.raises(ValueError, match="num_data=3"):
    parallel.make_mesh(num_data=3)


def test_pad_to_multiple_repeats_last_replica():
  tree = {"a": np.arange(5, dtype=np.float32), "b": np.arange(10).reshape(5, 2)}
  padded, valid = parallel.pad_to_multiple(tree, 4)
  assert padded["a"].shape == (8,) and padded["b"].shape == (8, 2)
  np.testing.assert_array_equal(valid, [1, 1, 1, 1, 1, 0, 0, 0])
  np.testing.assert_array_equal(padded["a"][5:], [4, 4, 4])
  np.testing.assert_array_equal(padded["b"][7], [8, 9])
  same, valid = parallel.pad_to_multiple({"a": jnp.ones(8)}, 4)
  assert same["a"].shape == (8,) and valid.all()
  with pytest.raises(ValueError, match="leading"):
    parallel.pad_to_multiple({"a": np.ones(3), "b": np.ones(4)}, 2)


def test_shard_replicas_places_rows_on_devices():
  mesh = parallel.make_mesh()
  x = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
  y = parallel.shard_replicas({"x": x}, mesh)["x"]
  assert y.sharding.spec == jax.sharding.PartitionSpec("replica")
  assert len(y.addressable_shards) == 8
  assert y.addressable_shards[1].data.shape == (2, 3)
  np.testing.assert_array_equal(parallel.to_host(y), x)
  # Eager indexing works because the mesh axes are Auto, not Explicit.
  np.testing.assert_array_equal(np.asarray(y[3]), x[3])
  with pytest.raises(ValueError, match="divisible"):
    parallel.shard_replicas(np.ones((6, 2)), mesh)


def test_gather_to_host_is_bit_exact_in_one_collective():
  mesh = parallel.make_mesh()
  special = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45, 3.4e38, 1.0, -2.5], np.float32)
  tree = {"f_R": np.tile(special, 2), "i_Rx3": np.arange(-24, 24, dtype=np.int32).reshape(16, 3),
          "empty": None, "u_Rx2x2": np.arange(64, dtype=np.uint32).reshape(16, 2, 2)}
  sharded = parallel.shard_replicas(tree, mesh)
  got = parallel.gather_to_host([sharded, sharded["f_R"]], mesh)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves([tree, tree["f_R"]])):
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
  assert got[0]["empty"] is None
  leaves = jax.tree.leaves(sharded)
  hlo = parallel.pack_columns.lower(leaves, parallel.replicated_sharding(mesh)).compile().as_text()
  assert hlo.count("all-gather(") == 1, hlo
  with pytest.raises(ValueError, match="expected 32-bit leaves"):
    parallel.gather_to_host(parallel.shard_replicas(np.ones(8, bool), mesh), mesh)


def _step(w, x):
  h = jnp.tanh(x @ w)
  return {"out": h.sum(), "w": w * 0.5 + h.mean()}


@pytest.mark.parametrize("chunk_size,num_shards", [(None, 1), (2, 1), (3, 1), (8, 8), (16, 8)])
def test_chunked_vmap_matches_vmap(chunk_size, num_shards):
  mesh = parallel.make_mesh()
  rng = np.random.default_rng(0)
  w = rng.normal(size=(32, 4, 4)).astype(np.float32)
  x = rng.normal(size=(32, 5, 4)).astype(np.float32)
  w_s, x_s = parallel.shard_replicas((w, x), mesh)
  expected = jax.jit(jax.vmap(_step))(w, x)
  fn = parallel.chunked_vmap(_step, chunk_size, num_shards=num_shards)
  got = jax.jit(fn)(w_s, x_s)
  for key in expected:
    np.testing.assert_allclose(parallel.to_host(got[key]), np.asarray(expected[key]),
                               rtol=1e-5, atol=1e-6)
  assert got["w"].shape == (32, 4, 4)


def test_chunked_vmap_actually_chunks():
  calls = []

  def f(x):
    calls.append(x.shape)
    return x * 2

  out = jax.jit(parallel.chunked_vmap(f, chunk_size=4, num_shards=2))(jnp.arange(16.0))
  np.testing.assert_array_equal(out, np.arange(16.0) * 2)
  assert calls == [()]  # traced once, inside lax.map's body
  jaxpr = jax.make_jaxpr(parallel.chunked_vmap(f, chunk_size=4, num_shards=2))(jnp.arange(16.0))
  assert "scan" in str(jaxpr) and "length=4" in str(jaxpr)
  with pytest.raises(ValueError, match="chunk_size=0"):
    parallel.chunked_vmap(f, chunk_size=0)


def test_choose_chunk_size():
  gib = 1 << 30
  assert parallel.choose_chunk_size(gib, 4, memory_bytes=10 * gib, memory_fraction=1.0) is None
  assert parallel.choose_chunk_size(gib, 64, memory_bytes=10 * gib, memory_fraction=1.0,
                                    num_shards=2) == 20
  assert parallel.choose_chunk_size(gib, 64, memory_bytes=10 * gib, memory_fraction=1.0,
                                    fixed_bytes=9.5 * gib) == 1
  # One replica per device that does not fit alone: a chunk of one is all of them.
  assert parallel.choose_chunk_size(gib, 1, memory_bytes=10 * gib, memory_fraction=1.0,
                                    fixed_bytes=9.5 * gib) is None
  assert parallel.device_memory_bytes() > 0


def test_detect_cluster():
  assert multihost.detect_cluster({}) is None
  assert multihost.detect_cluster({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1"}) is None
  assert multihost.detect_cluster({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "4"}) == "slurm"
  assert multihost.detect_cluster({"TPU_WORKER_HOSTNAMES": "10.0.0.1"}) is None
  assert multihost.detect_cluster({"TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2"}) == "tpu_pod"
  assert multihost.detect_cluster({"JAX_COORDINATOR_ADDRESS": "h:1234"}) == "env"


def test_maybe_initialize_distributed_single_host():
  assert multihost.maybe_initialize_distributed(environ={}) is False
  with pytest.raises(ValueError, match="all three"):
    multihost.maybe_initialize_distributed(coordinator_address="127.0.0.1:1234")
  assert multihost.is_writer()


def test_use_cpu_cores_as_devices_before_and_after_backend_start():
  # Left alone: count 0, or XLA_FLAGS already fixing the host device count (as conftest does).
  assert parallel.use_cpu_cores_as_devices(0, environ={}) == 0
  flags = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  assert parallel.use_cpu_cores_as_devices(-1, environ=flags) == 0
  assert flags == {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  with pytest.raises(ValueError, match="cpu_devices=-2"):
    parallel.use_cpu_cores_as_devices(-2, environ={})
  jax.devices()  # this process's backends are running: too late to change the device count
  with pytest.raises(RuntimeError, match="before the first JAX computation"):
    parallel.use_cpu_cores_as_devices(3, environ={})
  code = ("import os; from bindjax.runtime import parallel; "
          "n = parallel.use_cpu_cores_as_devices(3); "
          "import jax; print(n, jax.device_count(), os.environ['XLA_FLAGS'])")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                       text=True).stdout.split()
  assert out == ["3", "3", "--xla_cpu_multi_thread_eigen=false"]


def test_split_cores_gives_each_process_its_own_contiguous_cores():
  assert parallel.split_cores(2, [0, 1]) == [[0], [1]]
  assert parallel.split_cores(3, [7, 2, 3, 4, 5, 6, 8]) == [[2, 3, 4], [5, 6], [7, 8]]
  assert parallel.split_cores(1, [1, 0]) == [[0, 1]]
  assert parallel.split_cores(3, [0, 1]) is None
  with pytest.raises(ValueError, match="num_processes=0"):
    parallel.split_cores(0, [0, 1])
  groups = parallel.split_cores(1)
  assert groups == [parallel.available_cores()]


def test_cpu_cache_bytes_per_core_reads_sysfs(tmp_path):
  def cache(index, level, size, shared):
    d = tmp_path / f"index{index}"
    d.mkdir()
    (d / "level").write_text(f"{level}\n")
    (d / "size").write_text(f"{size}\n")
    (d / "shared_cpu_list").write_text(f"{shared}\n")

  cache(0, 1, "32K", "0")
  cache(2, 2, "512K", "0")
  cache(3, 3, "24576K", "0-1,4")
  assert parallel.cpu_cache_bytes_per_core(str(tmp_path)) == (24 << 20) // 3
  (tmp_path / "index3" / "size").write_text("lots\n")
  assert parallel.cpu_cache_bytes_per_core(str(tmp_path)) is None
  assert parallel.cpu_cache_bytes_per_core(str(tmp_path / "missing")) is None
