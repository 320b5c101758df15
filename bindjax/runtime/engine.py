"""The replica engine: how stacked replicas (independent models on a leading axis R) are placed on
a mesh, chunked to fit in memory and compiled ahead of time.

Its callers are the sweep's bucket programs (`bindjax.training.bucket_programs`), the complexity
fits (`bindjax.complexity.fitting`), the sweep-wide encoding (`bindjax.complexity.replicas`) and
the linear probe fits (`bindjax.frozen.probes.linear.fit_probes`). Their per-replica functions
stay pure and their own; the engine only picks a mesh, pads, shards, picks a chunk size and
compiles:

  auto_mesh(R)               the default mesh: fewest devices that give the fewest R per device
  place(tree, mesh)          pad R to the mesh's replica shards, shard it; (tree, valid_R)
  auto_chunk(mesh, R, bytes) replicas at a time so a chunk fits in device memory (None: all)
  compile_ahead(jitted, ...) lower and compile for given arguments, through `cached`
  cached(key, build)         the last PROGRAM_CACHE_SIZE compiled programs

The primitives (padding, sharding, chunked vmap, memory queries) are `bindjax.runtime.parallel`'s.
"""
import collections

import jax

from bindjax.runtime import parallel

# Bounded: every compiled program holds its machine code in memory maps of its own, and a
# long-lived process (a notebook, the test suite) that compiled programs without end ran out of
# the kernel's per-process map limit and crashed inside the next compile.
PROGRAM_CACHE_SIZE = 16
_PROGRAMS = collections.OrderedDict()


def platform(mesh):
  """The platform ("cpu", "gpu", "tpu") of the mesh's devices."""
  return mesh.devices.flat[0].platform


def is_single_cpu(mesh):
  """Whether the replica axis lies on one CPU device (nothing to shard it over)."""
  return parallel.num_replica_shards(mesh) == 1 and platform(mesh) == "cpu"


def auto_mesh(num_replicas, devices=None):
  """Replica mesh over the fewest devices that still give the fewest replicas per device.

  E.g. 3 replicas on 8 devices use 3 devices (no padded copies); 9 replicas use 5 (2 per device).
  """
  devices = list(jax.devices() if devices is None else devices)
  per_device = -(-num_replicas // len(devices))
  used = min(len(devices), -(-num_replicas // per_device))
  return parallel.make_mesh(devices=devices[:used])


def place(tree, mesh):
  """A stacked replica tree (host arrays sharing a leading axis R) padded to a multiple of the
  mesh's replica shards (`parallel.pad_to_multiple`) and sharded along "replica".

  Returns (sharded tree, valid_R: bool numpy array, False on the padding).
  """
  padded, valid_R = parallel.pad_to_multiple(tree, parallel.num_replica_shards(mesh))
  return parallel.shard_replicas(padded, mesh), valid_R


def auto_chunk(mesh, num_replicas, bytes_per_replica, *, fixed_bytes=0, memory_bytes=None,
               memory_fraction=parallel.DEFAULT_MEMORY_FRACTION, within_cpu_cache=False,
               log=None):
  """The "auto" chunk size of `num_replicas` (padded) replicas on `mesh`: how many run at once
  (over all shards) so that one chunk's `bytes_per_replica` each fit in `memory_fraction` of the
  device memory (`memory_bytes`, default the device's) beside `fixed_bytes`; None when all fit.

  within_cpu_cache: on CPU also keep each core's chunk within its share of the last-level
  cache. log: told the chunk size and why, when there is one.
  """
  shards = parallel.num_replica_shards(mesh)
  per_device = num_replicas // shards
  chunk = parallel.choose_chunk_size(bytes_per_replica, per_device, fixed_bytes=fixed_bytes,
                                     memory_bytes=memory_bytes, memory_fraction=memory_fraction,
                                     num_shards=shards)
  reason = "device memory"
  cache = (parallel.cpu_cache_bytes_per_core()
           if within_cpu_cache and platform(mesh) == "cpu" else None)
  if cache:
    # A CPU core streams a chunk's activations through its share of the last-level cache: the
    # cpu preset's model ran 1.4× faster one replica per core at a time than eight at once
    # (experiments/benchmarks/results/sweep_throughput_cpu{,_unchunked}.md); the small model,
    # well inside the cache, ran best unchunked.
    cache_chunk = parallel.choose_chunk_size(bytes_per_replica, per_device, memory_bytes=cache,
                                             memory_fraction=1.0, num_shards=shards)
    if cache_chunk is not None and (chunk is None or cache_chunk < chunk):
      chunk, reason = cache_chunk, f"the CPU's {cache / 2**20:.0f} MiB cache share per core"
  if chunk is not None and log is not None:
    log(f"chunking: {chunk} replicas at a time (≈{bytes_per_replica / 2**20:.1f} MiB per "
        f"replica, {per_device} per device; fits {reason})")
  return chunk


def cached(key, build):
  """build()'s compiled program(s), kept under the hashable `key` among the last
  PROGRAM_CACHE_SIZE keys (least recently used dropped first)."""
  if key in _PROGRAMS:
    _PROGRAMS.move_to_end(key)
  else:
    _PROGRAMS[key] = build()
    while len(_PROGRAMS) > PROGRAM_CACHE_SIZE:
      _PROGRAMS.popitem(last=False)
  return _PROGRAMS[key]


def compile_ahead(jitted, *args, options=None, **static):
  """`jitted` (a jax.jit function) lowered for `args` and its static keyword arguments `static`
  and compiled with the XLA compiler `options`, through `cached`: arguments of the same shapes,
  dtypes and shardings, the same statics and options reuse one program."""
  leaves, treedef = jax.tree_util.tree_flatten(args)
  signature = tuple((x.shape, x.dtype, getattr(x, "weak_type", False), getattr(x, "sharding", None))
                    for x in leaves)
  key = (jitted, treedef, signature, tuple(sorted(static.items())),
         tuple(sorted((options or {}).items())))
  return cached(key, lambda: jitted.lower(*args, **static).compile(options))
