"""Devices and hosts: replica mesh, replica sharding, padding, chunking.

Replicas (independent models) live on a leading axis R of every array. The mesh has a "replica"
axis, over which that leading axis is split, and a "data" axis (size 1 by default) for callers
that also split a batch. Both axes are `AxisType.Auto`, so eager indexing of sharded results
works and the compiler places everything else. No pmap.

Multi-host: every process builds the same host arrays (the grid is deterministic) and
`shard_replicas` hands each device its own rows; `to_host` and `gather_to_host` gather results
on every process; joining a multi-process job and writing from one process are
`bindjax.runtime.multihost`'s.
"""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding, PartitionSpec


REPLICA_AXIS = "replica"
DATA_AXIS = "data"

# Fraction of a device's memory that chunking plans for (XLA, the runtime and fragmentation need
# the rest).
DEFAULT_MEMORY_FRACTION = 0.7


def use_cpu_cores_as_devices(count=-1, environ=None):
  """Exposes `count` CPU devices (-1: one per available core), each running ops on one thread.

  A sweep then places its replicas side by side on separate cores, where JAX's default (one CPU
  device whose every op is split over all cores) spends most of a small model's step handing
  tiny ops between threads (experiments/benchmarks/sweep_throughput.py). Only the CPU platform
  changes, so it is harmless on accelerator hosts. It must run before JAX starts its backends
  and does nothing when count == 0 or XLA_FLAGS already sets the host device count. Returns the
  device count it set, or 0 when it left JAX's default.
  """
  environ = os.environ if environ is None else environ
  if count == 0 or "xla_force_host_platform_device_count" in environ.get("XLA_FLAGS", ""):
    return 0
  if count < -1:
    raise ValueError(f"cpu_devices={count}: expected -1 (one per core), 0 (JAX's default) or a "
                     "positive device count")
  if count == -1:
    count = len(available_cores())
  try:
    jax.config.update("jax_num_cpu_devices", int(count))
  except RuntimeError as e:
    raise RuntimeError("use_cpu_cores_as_devices must run before the first JAX computation "
                       f"(backends already started): {e}") from None
  if "xla_cpu_multi_thread_eigen" not in environ.get("XLA_FLAGS", ""):
    # Read by XLA when the CPU backend starts, which is after this point.
    environ["XLA_FLAGS"] = (environ.get("XLA_FLAGS", "") +
                            " --xla_cpu_multi_thread_eigen=false").strip()
  return int(count)


def available_cores():
  """Sorted ids of the CPU cores this process may run on."""
  if hasattr(os, "sched_getaffinity"):
    return sorted(os.sched_getaffinity(0))
  return list(range(os.cpu_count() or 1))


def split_cores(num_processes, cores=None):
  """Disjoint, contiguous groups of `cores` (default: this process's), one per local process.

  For several sweep processes on one CPU host (launch/local.py): pinned, each process makes one
  CPU device per core of its own group and keeps its devices' work there, where inside one
  process XLA:CPU runs every device's ops on one shared thread pool, so a device's work hops
  between cores (measured: experiments/benchmarks/sweep_throughput.py --processes). Returns None
  when there are more processes than cores (no pinning then). Group sizes differ by at most one.
  """
  cores = available_cores() if cores is None else sorted(cores)
  if num_processes < 1:
    raise ValueError(f"num_processes={num_processes}: expected >= 1")
  if num_processes > len(cores):
    return None
  size, extra = divmod(len(cores), num_processes)
  starts = [i * size + min(i, extra) for i in range(num_processes + 1)]
  return [cores[starts[i]:starts[i + 1]] for i in range(num_processes)]


def make_mesh(num_data=1, devices=None):
  """Mesh over all (or the given) devices with axes ("replica", "data"), both AxisType.Auto.

  num_data devices of each replica group cooperate on one batch; the remaining factor is the
  replica axis. Raises ValueError if num_data does not divide the device count.
  """
  devices = list(jax.devices() if devices is None else devices)
  if num_data < 1 or len(devices) % num_data:
    raise ValueError(f"num_data={num_data}: expected a positive divisor of the device count "
                     f"{len(devices)}")
  shape = (len(devices) // num_data, num_data)
  return jax.make_mesh(shape, (REPLICA_AXIS, DATA_AXIS), axis_types=(AxisType.Auto,) * 2,
                       devices=devices)


def num_replica_shards(mesh):
  """How many parts the replica axis is split into."""
  return mesh.shape[REPLICA_AXIS]


def replica_sharding(mesh):
  """NamedSharding splitting an array's leading axis along "replica" (replicated over "data")."""
  return NamedSharding(mesh, PartitionSpec(REPLICA_AXIS))


def data_sharding(mesh):
  """NamedSharding splitting a (per-replica) batch axis along "data"; None when "data" is 1.

  Meant for sharding constraints inside functions vmapped with spmd_axis_name="replica".
  """
  if mesh.shape[DATA_AXIS] == 1:
    return None
  return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def replicated_sharding(mesh):
  """NamedSharding holding a full copy on every device."""
  return NamedSharding(mesh, PartitionSpec())


def padded_size(num_replicas, multiple):
  """Smallest multiple of `multiple` that is ≥ num_replicas (and ≥ multiple)."""
  if num_replicas < 1 or multiple < 1:
    raise ValueError(f"num_replicas={num_replicas}, multiple={multiple}: expected both ≥ 1")
  return -(-num_replicas // multiple) * multiple


def pad_to_multiple(tree, n):
  """Pads every leaf's leading axis R to a multiple of n by repeating the last replica.

  Repeating (not zero-filling) keeps padded replicas numerically ordinary, so they never raise
  NaNs or divide by zero. Returns (padded_tree, valid_R) where valid_R is a bool numpy array,
  False on the padding.
  """
  leaves = jax.tree_util.tree_leaves(tree)
  if not leaves:
    raise ValueError("pad_to_multiple: the tree has no leaves")
  sizes = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
  if len(sizes) != 1 or None in sizes:
    raise ValueError(f"pad_to_multiple: expected every leaf to share one leading replica axis, "
                     f"got leading sizes {sorted(map(str, sizes))}")
  (size,) = sizes
  total = padded_size(size, n)

  def pad(x):
    if total == size:
      return x
    xp = jnp if isinstance(x, jax.Array) else np
    extra = xp.repeat(x[-1:], total - size, axis=0)
    return xp.concatenate([x, extra], axis=0)

  valid_R = np.arange(total) < size
  return jax.tree_util.tree_map(pad, tree), valid_R


def shard_replicas(tree, mesh):
  """Places host (numpy) arrays on the mesh, leading axis split along "replica".

  Works on one or many processes: each process must hold the same full host arrays and only
  transfers the rows of its own devices. The leading axis must be divisible by the replica axis
  size (see `pad_to_multiple`).
  """
  sharding = replica_sharding(mesh)
  shards = num_replica_shards(mesh)

  def put(x):
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[0] % shards:
      raise ValueError(f"shard_replicas: leading axis of shape {x.shape} must be divisible by "
                       f"the {shards} replica shards; pad with pad_to_multiple first")
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree_util.tree_map(put, tree)


def to_host(tree):
  """Numpy copy of (possibly multi-host sharded) arrays, identical on every process."""
  if jax.process_count() == 1:
    return jax.tree_util.tree_map(np.asarray, jax.device_get(tree))

  def gather(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)

  return jax.tree_util.tree_map(gather, tree)


def gather_to_host(tree, mesh):
  """Numpy copy of `tree` (arrays on `mesh` sharing a leading axis, all of 32-bit dtypes),
  identical on every process, through one replicated gather whatever the number of leaves
  (`to_host` makes one per leaf across processes): the leaves are packed bit for bit into one
  array, gathered onto every device, and each process reads its own copy."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  if any(np.dtype(x.dtype).itemsize != 4 for x in leaves):
    raise ValueError(f"gather_to_host: expected 32-bit leaves, got "
                     f"{sorted({str(x.dtype) for x in leaves})}")
  packed_RxM = np.asarray(pack_columns(leaves, replicated_sharding(mesh)).addressable_data(0))
  out, offset = [], 0
  for x in leaves:
    width = int(np.prod(x.shape[1:]))
    columns = np.ascontiguousarray(packed_RxM[:, offset:offset + width])
    out.append(columns.view(x.dtype).reshape(x.shape))
    offset += width
  return jax.tree_util.tree_unflatten(treedef, out)


@functools.partial(jax.jit, static_argnums=1)
def pack_columns(leaves, sharding):
  """uint32 [R, M]: the bits of 32-bit `leaves` (sharing a leading axis R) side by side, laid
  out as `sharding`; joined along the unsharded axis, so the only collective is the gather of
  the result."""
  columns = [jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(x.shape[0], -1) for x in leaves]
  return jax.lax.with_sharding_constraint(jnp.concatenate(columns, axis=1), sharding)


def chunked_vmap(fn, chunk_size=None, num_shards=1, in_axes=0, spmd_axis_name=None):
  """vmap of fn over a leading axis R, evaluated `chunk_size` replicas at a time with lax.map.

  Activation memory then scales with the chunk, not with R. With the leading axis split into
  num_shards device blocks, each chunk takes chunk_size // num_shards rows from *every* block
  so all devices stay busy in every chunk. chunk_size=None (or ≥ R) is a plain vmap. If the
  per-shard chunk does not divide the rows per shard, the largest divisor below it is used.
  Results equal `jax.vmap(fn)` up to float reordering.
  """
  vmapped = jax.vmap(fn, in_axes=in_axes, spmd_axis_name=spmd_axis_name)
  if chunk_size is None:
    return vmapped
  if chunk_size < 1 or num_shards < 1:
    raise ValueError(f"chunked_vmap: chunk_size={chunk_size}, num_shards={num_shards}: "
                     f"expected positive integers")
  if in_axes != 0:
    raise ValueError(f"chunked_vmap: in_axes={in_axes!r}; chunking supports in_axes=0 only")

  @functools.wraps(fn)
  def wrapped(*args):
    leaves = jax.tree_util.tree_leaves(args)
    size = leaves[0].shape[0]
    if size % num_shards:
      raise ValueError(f"chunked_vmap: {size} replicas are not divisible by {num_shards} shards")
    per_shard = size // num_shards
    per_chunk = _largest_divisor_at_most(per_shard, max(1, chunk_size // num_shards))
    num_chunks = per_shard // per_chunk
    if num_chunks == 1:
      return vmapped(*args)

    def split(x):  # [S·M·c, ...] -> [M, S·c, ...]: chunk m holds rows m·c.. of every shard
      x = x.reshape((num_shards, num_chunks, per_chunk) + x.shape[1:])
      x = jnp.swapaxes(x, 0, 1)
      return x.reshape((num_chunks, num_shards * per_chunk) + x.shape[3:])

    def merge(y):  # inverse of split
      y = y.reshape((num_chunks, num_shards, per_chunk) + y.shape[2:])
      y = jnp.swapaxes(y, 0, 1)
      return y.reshape((size,) + y.shape[3:])

    outputs = jax.lax.map(lambda chunk: vmapped(*chunk),
                          jax.tree_util.tree_map(split, args))
    return jax.tree_util.tree_map(merge, outputs)

  return wrapped


def _largest_divisor_at_most(n, limit):
  for d in range(min(n, limit), 0, -1):
    if n % d == 0:
      return d
  return 1


def device_memory_bytes(device=None):
  """Usable memory of one device: its allocator limit, or host RAM shared by the local devices."""
  device = device or jax.local_devices()[0]
  stats = None
  try:
    stats = device.memory_stats()
  except Exception:  # Some backends do not implement memory_stats at all.
    stats = None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  try:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    ram = 8 << 30
  return int(ram // max(1, jax.local_device_count()))


AUTO = "auto"


def chunk_setting(value, field="chunk_size"):
  """A chunking setting as configs write it: "auto", "none" (or None: everything at once), or a
  positive count (int or its string, as a command-line override gives it).

  Returns AUTO, None or an int; ValueError naming `field` otherwise.
  """
  if value is None or value == "none":
    return None
  if value == AUTO:
    return AUTO
  try:
    count = int(value)
  except (TypeError, ValueError):
    count = 0
  if isinstance(value, bool) or count < 1 or str(count) != str(value).strip():
    raise ValueError(f"{field}={value!r}: expected 'auto', 'none' or a positive integer")
  return count


def choose_chunk_size(bytes_per_replica, replicas_per_device, *, fixed_bytes=0,
                      memory_bytes=None, memory_fraction=DEFAULT_MEMORY_FRACTION, num_shards=1):
  """Replicas to run at once (over all shards) so one chunk's activations fit in device memory.

  bytes_per_replica: activation/temporary memory of one replica's step; fixed_bytes: memory
  that every replica's state takes regardless of chunking (per device). Returns None when all
  replicas fit (no chunking), and when a chunk would hold every replica of a device anyway (one
  replica per device that does not fit alone).
  """
  if replicas_per_device < 1:
    raise ValueError(f"replicas_per_device={replicas_per_device}: expected ≥ 1")
  budget = (memory_bytes or device_memory_bytes()) * memory_fraction - fixed_bytes
  if bytes_per_replica <= 0 or bytes_per_replica * replicas_per_device <= budget:
    return None
  per_device = max(1, int(budget // bytes_per_replica))
  # One chunk of every replica is no chunking; as a chunk size it would compile the bucket's
  # programs a second time (one replica of 12 layers at d_model 256 did, on CPU).
  return None if per_device >= replicas_per_device else per_device * num_shards


def cpu_cache_bytes_per_core(cache_dir="/sys/devices/system/cpu/cpu0/cache"):
  """CPU 0's last-level cache divided by the CPUs that share it (bytes), or None if unknown.

  Reads Linux sysfs (index*/level, size such as "32768K", shared_cpu_list such as "0-1,4").
  """
  try:
    levels = []
    for entry in os.listdir(cache_dir):
      path = os.path.join(cache_dir, entry)
      if entry.startswith("index"):
        with open(os.path.join(path, "level")) as f:
          levels.append((int(f.read()), path))
    _, path = max(levels)
    with open(os.path.join(path, "size")) as f:
      size = f.read().strip()
    with open(os.path.join(path, "shared_cpu_list")) as f:
      shared = f.read().strip()
  except (OSError, ValueError):
    return None
  units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
  try:
    nbytes = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    cpus = 0
    for part in shared.split(","):
      first, _, last = part.partition("-")
      cpus += int(last or first) - int(first) + 1
  except (ValueError, IndexError):
    return None
  return nbytes // max(1, cpus)


def compiled_memory_bytes(compiled):
  """(temporary bytes, argument + output bytes) of a compiled executable, or None if unknown."""
  try:
    stats = compiled.memory_analysis()
  except Exception:  # Not every backend reports memory statistics.
    return None
  if stats is None:
    return None
  return (int(stats.temp_size_in_bytes),
          int(stats.argument_size_in_bytes + stats.output_size_in_bytes))
