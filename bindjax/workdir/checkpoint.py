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
  step, rows, meta = ckpt.restore_row(target, 3)   # row 3 of each array (replica 3) alone
  meta = ckpt.metadata()     # the newest save's metadata alone (e.g. to build the target)
  ckpt.prune_after(step)     # on resume: drop checkpoints written after the restored step
  ckpt.close()               # waits for asynchronous saves

A target leaf may be `SKIP`: that array is not read and comes back as SKIP, so a reader of the
parameters alone never reads the optimiser state.

Every array's leading axis holds rows (a bucket's replicas): each array is stored in chunks of
one row, so `restore_row` reads one row of the arrays it is asked for through tensorstore and
none of the other rows' chunks (but those under 1 KiB, which orbax's OCDBT store keeps inside the
index it reads for any array).

Every save records checksums beside the metadata: two wrapping uint32 sums per array and the
same two sums of each row of every array of rank >= 1 (bindjax.workdir.checksums), and a
SHA-256 of the metadata. A restore recomputes the sums of the arrays it read, and
`restore_row` those of the rows it read, and raises `CorruptCheckpointError` naming the
checkpoint and the array when they differ or the files cannot be read; `restore_verified` then
falls back to the previous checkpoint and says so. Checkpoints written before checksums were
recorded restore unverified; those written before row checksums were recorded cannot be read by
row (`restore_row` returns None) and restore whole, verified.

A save that cannot be written (a full disk) raises `CheckpointWriteError`, an OSError, from
`save`, `wait` or `close`, whichever learns of it first.

Best-by-metric parameters are not separate checkpoints: the sweep keeps them inside its state
(docs/training.md, "Checkpoints").
"""
import hashlib
import json

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from bindjax.base import files
from bindjax.runtime import multihost
from bindjax.workdir import checksums

_STATE = "state"
_ITEMS = (_STATE, "metadata")
# The metadata key under which a save records its checksums.
CHECKSUM_KEY = "bindjax_checksum"
# A target leaf that a restore does not read (orbax's placeholder: the leaf comes back as it).
SKIP = ocp.PLACEHOLDER


class CorruptCheckpointError(ValueError):
  """A checkpoint that cannot be read or does not match the checksums recorded when saved."""


class CheckpointWriteError(OSError):
  """A checkpoint could not be written (for example the disk is full)."""


def abstract_target(tree):
  """jax.ShapeDtypeStruct leaves (shape, dtype, sharding) mirroring a pytree of arrays (SKIP
  leaves stay SKIP)."""
  def leaf(x):
    if x is SKIP:
      return x
    sharding = getattr(x, "sharding", None)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  return jax.tree.map(leaf, tree)


def _checksums(tree):
  """`checksums.of_leaves` of a pytree's leaves, named by their paths, SKIP leaves left out."""
  return checksums.of_leaves([(jax.tree_util.keystr(path), x) for path, x in
                              jax.tree_util.tree_flatten_with_path(tree)[0] if x is not SKIP])


def tree_checksums(tree):
  """{leaf path: [sum of words, position-weighted sum of words]} (uint32 sums) of a pytree's
  arrays (bindjax.workdir.checksums); SKIP leaves are left out."""
  return _checksums(tree)[0]


def row_checksums(tree):
  """{leaf path: [the `tree_checksums` pair of each row along axis 0]} of a pytree's leaves of
  rank >= 1: row r's pair is the checksum of the array x[r]."""
  return _checksums(tree)[1]


def _names(path):
  """A key path as the names orbax's metadata tree nests its arrays under (dict keys, dataclass
  and namedtuple fields, sequence indices)."""
  return tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _stored_arrays(directory):
  """({names: orbax ArrayMetadata} of the arrays saved in the state folder `directory`, whether
  they are zarr3 arrays)."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    metadata = handler.metadata(directory)
  finally:
    handler.close()
  flat = jax.tree_util.tree_flatten_with_path(metadata.tree)[0]
  return {_names(path): info for path, info in flat}, bool(metadata.use_zarr3)


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
    if multihost.is_writer() and self.directory.is_dir():
      for path in self.directory.iterdir():
        if TMP_MARK in path.name:
          try:
            path.rmtree()
          except OSError:
            pass   # orbax's clean-up gets another go
    # orbax names its cross-process barriers by step alone: two managers of one process saving
    # the same step (a packed sweep's buckets, on lanes that span processes) would wait at one
    # barrier at once, which the coordination service refuses ("... is already ongoing"). A
    # prefix from the directory, the same in every process, keeps each manager's own.
    barriers = "ckpt_" + hashlib.sha256(str(self.directory).encode()).hexdigest()[:16]
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=_ITEMS,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, cleanup_tmp_directories=False,
            enable_async_checkpointing=async_save,
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                barrier_sync_key_prefix=barriers)))
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
    """Saves `state` (and JSON `metadata`) as checkpoint `step`, with their checksums; every
    array in chunks of one row along its leading axis."""
    metadata = dict(metadata or {})
    arrays, rows = _checksums(state)
    metadata[CHECKSUM_KEY] = {"arrays": arrays, "rows": rows,
                              "metadata": _metadata_digest(metadata)}
    # Chunks of one row: `restore_row` then reads none of the other rows' chunks.
    save_args = jax.tree.map(lambda x: ocp.SaveArgs(shard_axes=(0,) if np.ndim(x) else ()), state)
    self._writing(lambda: self._manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state, save_args=save_args),
        metadata=ocp.args.JsonSave(metadata)), force=True), step)

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

  def _reading(self, step, what, array=None):
    """Runs `what`; a failure to read becomes one CorruptCheckpointError naming the checkpoint
    (and `array`)."""
    try:
      return what()
    except Exception as e:  # orbax and tensorstore raise many types for damaged files
      where = f"{self.path(step)}: array {array}" if array else self.path(step)
      raise CorruptCheckpointError(f"checkpoint {where} cannot be read: {_one_line(e)}") from None

  def _read_metadata(self, step):
    """(metadata, recorded checksums or None) of checkpoint `step`, its digest verified."""
    restored = self._reading(step, lambda: self._manager.restore(
        step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore())))
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
    return self._read_metadata(step)[0]

  def restore(self, target, *, step=None):
    """Restores (step, state, metadata); `target` is a concrete or abstract pytree of the state.

    `step=None` picks the newest checkpoint. Leaves of `target` that are SKIP are not read and
    come back as SKIP. Returns None when there is no checkpoint. Raises CorruptCheckpointError
    naming the checkpoint when its files cannot be read or the arrays read or its metadata differ
    from the checksums recorded when it was saved.
    """
    step = self._step(step)
    if step is None:
      return None
    metadata, recorded = self._read_metadata(step)
    item = abstract_target(target)
    args = ocp.args.PyTreeRestore(item=item,
                                  restore_args=ocp.checkpoint_utils.construct_restore_args(item))

    def read():
      # A reader of its own: restoring through the manager with PyTreeRestore (which, unlike
      # StandardRestore, takes SKIP leaves) would tie the manager's "state" item to the PyTree
      # handler, and the manager would then refuse the StandardSave of the next save.
      with ocp.PyTreeCheckpointer() as reader:
        return reader.restore(self.path(step) / _STATE, args=args)

    state = self._reading(step, read)
    if recorded is not None:
      self._verify(step, tree_checksums(state), recorded.get("arrays", {}))
    return step, state, metadata

  def _verify(self, step, sums, expected, row=None):
    """CorruptCheckpointError naming the first array whose `sums` differ from `expected`."""
    for path, pair in sums.items():
      recorded = expected.get(path)
      if row is not None:
        recorded = recorded[row] if recorded and row < len(recorded) else None
      if recorded != pair:
        what = f"array {path}" if row is None else f"row {row} of array {path}"
        raise CorruptCheckpointError(
            f"checkpoint {self.path(step)}: {what} does not match the checksum recorded when it "
            "was saved (corrupt data)")

  def restore_row(self, target, row, *, step=None):
    """(step, rows, metadata): row `row` along the leading axis of each array of `target`.

    `target` is as for `restore` (SKIP leaves are not read); rows holds numpy arrays of the
    target's shapes less the leading axis. Only the chunks of that row are read (tensorstore,
    through orbax's read spec of each array) and each row is verified against the checksum its
    save recorded for it. Returns None when there is no checkpoint or it records no row
    checksums (one written before they were; `restore` reads it). CorruptCheckpointError naming
    the checkpoint and the array when a row cannot be read or differs from its checksum;
    ValueError when `target` names an array the checkpoint lacks or holds with another shape or
    dtype.
    """
    step = self._step(step)
    if step is None:
      return None
    metadata, recorded = self._read_metadata(step)
    expected = (recorded or {}).get("rows")
    if expected is None:
      return None
    directory = self.path(step) / _STATE
    stored, use_zarr3 = self._reading(step, lambda: _stored_arrays(directory))
    flat, treedef = jax.tree_util.tree_flatten_with_path(target)
    wanted = {jax.tree_util.keystr(path): (_names(path), x) for path, x in flat if x is not SKIP}
    use_ocdbt = ocp.type_handlers.is_ocdbt_checkpoint(directory)
    context = ocp.type_handlers.get_ts_context(use_ocdbt=use_ocdbt)
    opening = {}
    for path, (names, x) in wanted.items():
      info = stored.get(names)
      if info is None or tuple(info.shape) != tuple(x.shape) or info.dtype != x.dtype:
        held = "no such array" if info is None else f"{info.dtype}{list(info.shape)}"
        raise ValueError(f"checkpoint {self.path(step)}: array {path} expected as "
                         f"{x.dtype}{list(x.shape)}; it holds {held}")
      if not 0 <= row < (x.shape[0] if x.shape else 0):
        raise ValueError(f"checkpoint {self.path(step)}: row {row} of array {path} of shape "
                         f"{list(x.shape)} does not exist")
      # get_json_tspec_read and get_ts_context are public names of orbax.checkpoint.type_handlers,
      # listed there among its "deprecated functions": they build the very spec and context
      # orbax's own restore reads the array with. tests/test_checkpoint.py fails if they go.
      spec = ocp.type_handlers.get_json_tspec_read(
          ocp.type_handlers.ParamInfo(name=info.name, parent_dir=info.directory,
                                      use_zarr3=use_zarr3, ts_context=context),
          use_ocdbt=use_ocdbt)
      opening[path] = ts.open(spec, read=True, context=context)
    reading = {path: self._reading(step, opened.result, path)[row].read()
               for path, opened in opening.items()}
    rows = {path: self._reading(step, read.result, path) for path, read in reading.items()}
    tree = treedef.unflatten([SKIP if x is SKIP else rows[jax.tree_util.keystr(path)]
                              for path, x in flat])
    self._verify(step, tree_checksums(tree), expected, row)
    return step, tree, metadata

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
