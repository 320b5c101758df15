"""All orbax use of bindjax: periodic keep-last-n checkpoints of any pytree, each verifying itself.

A `Checkpoints` object manages one directory, DIR/<step>/{state,metadata}, keeping the newest
`keep` saves. The state is any pytree of jax arrays (the replica-stacked, sharded state of a sweep
bucket); metadata is a JSON-serialisable dict stored beside it. Restores go into a target pytree,
concrete or abstract (`abstract_target(tree)`, jax.ShapeDtypeStruct with sharding), so optax
states and flax dataclasses come back with their own types and shardings.

  ckpt = Checkpoints(workdir / "checkpoints" / "bucket_000", keep=3)
  ckpt.save(step, state, {"step": step})
  step, state, meta = ckpt.restore(abstract_target(state))      # the newest
  step, state, meta = ckpt.restore_verified(target, log=print)  # the newest that verifies
  meta = ckpt.metadata()     # the newest save's metadata alone (e.g. to build the target)
  ckpt.prune_after(step)     # on resume: drop checkpoints written after the restored step
  ckpt.close()               # waits for asynchronous saves

Every save records checksums beside the metadata: two wrapping uint32 sums per array (of its
32-bit words, plain and weighted by position, so any single flipped bit and any swap of words
changes them), computed on the devices, and a SHA-256 of the metadata. A restore recomputes them
and raises `CorruptCheckpointError` naming the checkpoint (and the array) when they differ or the
files cannot be read; `restore_verified` then falls back to the previous checkpoint and says so.
Checkpoints written before checksums were recorded restore unverified.

A save that cannot be written (a full disk) raises `CheckpointWriteError`, an OSError, from
`save`, `wait` or `close`, whichever learns of it first.

Best-by-metric parameters are not separate checkpoints: the sweep keeps them inside its state
(docs/training.md, "Checkpoints").
"""
import hashlib
import json

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from bindjax import files
from bindjax import parallel

_ITEMS = ("state", "metadata")
# The metadata key under which a save records its checksums.
CHECKSUM_KEY = "bindjax_checksum"


class CorruptCheckpointError(ValueError):
  """A checkpoint that cannot be read or does not match the checksums recorded when saved."""


class CheckpointWriteError(OSError):
  """A checkpoint could not be written (for example the disk is full)."""


def abstract_target(tree):
  """jax.ShapeDtypeStruct leaves (shape, dtype, sharding) mirroring a pytree of arrays."""
  def leaf(x):
    sharding = getattr(x, "sharding", None)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  return jax.tree.map(leaf, tree)


def _words(x):
  """The array's contents as uint32 words (smaller types widened, 64-bit ones split)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32).ravel()
  size = x.dtype.itemsize
  if size >= 4:
    return jax.lax.bitcast_convert_type(x, jnp.uint32).ravel()
  narrow = jnp.uint16 if size == 2 else jnp.uint8
  return jax.lax.bitcast_convert_type(x, narrow).astype(jnp.uint32).ravel()


@jax.jit
def _sums(leaves):
  def one(x):
    w = _words(x)
    position = jnp.arange(w.shape[0], dtype=jnp.uint32) * 2 + 1
    return jnp.stack([w.sum(dtype=jnp.uint32), (w * position).sum(dtype=jnp.uint32)])
  return jnp.stack([one(x) for x in leaves]) if leaves else jnp.zeros((0, 2), jnp.uint32)


def tree_checksums(tree):
  """{leaf path: [sum of words, position-weighted sum of words]} (uint32 sums) of a pytree.

  One jitted pass on the devices; only the sums come to the host, so checkpoints of sharded,
  multi-host states are checked without gathering them.
  """
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  paths = [path for path, _ in flat]
  sums = parallel.to_host(_sums([jnp.asarray(x) for _, x in flat])).tolist()
  return {jax.tree_util.keystr(path): s for path, s in zip(paths, sums)}


def _metadata_digest(metadata):
  return hashlib.sha256(json.dumps(metadata, sort_keys=True).encode()).hexdigest()


def _one_line(error, limit=300):
  text = " ".join(str(error).split())
  return f"{type(error).__name__}: {text[:limit]}" + ("…" if len(text) > limit else "")


# Part of the name orbax gives a checkpoint folder while it is being written.
TMP_MARK = ".orbax-checkpoint-tmp"


class Checkpoints:
  """The newest `keep` orbax checkpoints of a pytree under one directory."""

  def __init__(self, directory, *, keep=3, async_save=True):
    """Opens (creating if needed) the checkpoint directory.

    Args:
      directory: folder holding one sub-folder per saved step (any `etils.epath` path orbax
        writes to: local, gs://).
      keep: number of newest checkpoints kept (>= 1).
      async_save: write in background threads (arrays are copied before `save` returns).
    """
    if keep < 1:
      raise ValueError(f"Checkpoints: keep={keep!r}, expected an int >= 1")
    self.directory = files.as_path(directory)
    # A write killed half-way leaves a temporary folder. It is removed here, before any save:
    # orbax's own clean-up runs beside the first save and can remove the temporary folder of
    # that very save when it is for the same step.
    if parallel.is_writer() and self.directory.is_dir():
      for path in self.directory.iterdir():
        if TMP_MARK in path.name:
          try:
            path.rmtree()
          except OSError:
            pass   # orbax's clean-up gets another go
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=_ITEMS,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, cleanup_tmp_directories=False,
            enable_async_checkpointing=async_save))
    self._corrupt = {}   # step -> why it did not verify (each is reported once)

  def path(self, step):
    """The folder of checkpoint `step`."""
    return self.directory / str(int(step))

  def _writing(self, what, step=None):
    """Runs orbax's `what`; a failure to write becomes one CheckpointWriteError."""
    try:
      return what()
    except Exception as e:  # orbax and tensorstore raise ValueError, OSError and more
      where = self.path(step) if step is not None else self.directory
      raise CheckpointWriteError(f"cannot write checkpoint {where}: {_one_line(e)}") from None

  def save(self, step, state, metadata=None):
    """Saves `state` (and JSON `metadata`) as checkpoint `step`, with their checksums."""
    metadata = dict(metadata or {})
    metadata[CHECKSUM_KEY] = {"arrays": tree_checksums(state),
                              "metadata": _metadata_digest(metadata)}
    self._writing(lambda: self._manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(metadata)),
        force=True), step)

  def latest_step(self):
    """Newest saved step (None when there is none)."""
    return self._manager.latest_step()

  def all_steps(self):
    """Sorted saved steps."""
    return sorted(self._manager.all_steps())

  def _step(self, step):
    if step is None:
      return self._manager.latest_step()
    if int(step) not in self._manager.all_steps():
      raise ValueError(f"Checkpoints: no checkpoint at step {step} in {self.directory}; "
                       f"have {self.all_steps()}")
    return int(step)

  def _read(self, step, args):
    try:
      return self._manager.restore(step, args=ocp.args.Composite(**args))
    except Exception as e:  # orbax raises many types for damaged files
      raise CorruptCheckpointError(f"checkpoint {self.path(step)} cannot be read: "
                                   f"{_one_line(e)}") from None

  def _verified_metadata(self, step, restored):
    metadata = restored["metadata"]
    if not isinstance(metadata, dict):
      raise CorruptCheckpointError(f"checkpoint {self.path(step)}: its metadata is not a JSON "
                                   "object")
    metadata = dict(metadata)
    recorded = metadata.pop(CHECKSUM_KEY, None)
    if recorded is not None and recorded.get("metadata") != _metadata_digest(metadata):
      raise CorruptCheckpointError(f"checkpoint {self.path(step)}: its metadata does not match "
                                   "the checksum recorded when it was saved (corrupt data)")
    return metadata, recorded

  def metadata(self, step=None):
    """The metadata dict of checkpoint `step` (default the newest); None when there is none.

    CorruptCheckpointError when it cannot be read or does not match its checksum.
    """
    step = self._step(step)
    if step is None:
      return None
    restored = self._read(step, {"metadata": ocp.args.JsonRestore()})
    return self._verified_metadata(step, restored)[0]

  def restore(self, target, *, step=None):
    """Restores (step, state, metadata); `target` is a concrete or abstract pytree of the state.

    `step=None` picks the newest checkpoint. Returns None when there is no checkpoint. Raises
    CorruptCheckpointError naming the checkpoint when its files cannot be read or its arrays or
    metadata differ from the checksums recorded when it was saved.
    """
    step = self._step(step)
    if step is None:
      return None
    restored = self._read(step, {"state": ocp.args.StandardRestore(abstract_target(target)),
                                 "metadata": ocp.args.JsonRestore()})
    metadata, recorded = self._verified_metadata(step, restored)
    state = restored["state"]
    if recorded is not None:
      expected = recorded.get("arrays", {})
      for path, sums in tree_checksums(state).items():
        if expected.get(path) != sums:
          raise CorruptCheckpointError(
              f"checkpoint {self.path(step)}: array {path} does not match the checksum "
              "recorded when it was saved (corrupt data)")
    return step, state, metadata

  def verified_metadata(self, log=print):
    """(step, metadata) of the newest checkpoint whose metadata verifies; None when none is
    saved. A checkpoint that does not verify is reported through `log` once and skipped;
    CorruptCheckpointError when none verifies."""
    for step in reversed(self.all_steps()):
      if step in self._corrupt:
        continue
      try:
        return step, self.metadata(step)
      except CorruptCheckpointError as e:
        self._skip(step, e, log)
    return self._none_verified()

  def restore_verified(self, target, *, at_most=None, log=print):
    """`restore` of the newest checkpoint (at or before step `at_most`) that verifies.

    One that does not is reported through `log` ("...; falling back to the previous
    checkpoint") and skipped. Returns None when there is no checkpoint;
    CorruptCheckpointError when there are some and none verifies.
    """
    for step in reversed(self.all_steps()):
      if step in self._corrupt or (at_most is not None and step > at_most):
        continue
      try:
        return self.restore(target, step=step)
      except CorruptCheckpointError as e:
        self._skip(step, e, log)
    return self._none_verified()

  def _skip(self, step, error, log):
    self._corrupt[step] = str(error)
    if any(s < step and s not in self._corrupt for s in self.all_steps()):
      log(f"{error}; falling back to the previous checkpoint")

  def _none_verified(self):
    if not self._corrupt:
      return None
    steps = sorted(self._corrupt)
    raise CorruptCheckpointError(
        f"{self._corrupt[steps[0]]}; no checkpoint of {self.directory} verifies (damaged: "
        f"steps {', '.join(map(str, steps))}); restore the folder from a copy, or pass "
        "--overwrite to start the run over")

  def prune_after(self, step):
    """Deletes checkpoints newer than `step` (all of them for None).

    A resumed run recomputes those steps bit for bit, so this makes the directory look as if the
    run had never gone past `step`.
    """
    self.wait()
    for saved in self._manager.all_steps():
      if step is None or saved > step:
        self._manager.delete(saved)

  def wait(self):
    """Blocks until asynchronous saves are on disk (CheckpointWriteError when one failed)."""
    self._writing(self._manager.wait_until_finished)

  def close(self):
    """Waits for pending saves and releases the manager (CheckpointWriteError when a save
    failed)."""
    self._writing(self._manager.close)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
