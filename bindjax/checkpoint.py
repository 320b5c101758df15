"""All orbax use of bindjax: periodic keep-last-n checkpoints of any pytree.

A `Checkpoints` object manages one directory, DIR/<step>/{state,metadata}, keeping the newest
`keep` saves. The state is any pytree of jax arrays (the replica-stacked, sharded state of a sweep
bucket); metadata is a JSON-serialisable dict stored beside it. Restores go into a target pytree,
concrete or abstract (`abstract_target(tree)`, jax.ShapeDtypeStruct with sharding), so optax
states and flax dataclasses come back with their own types and shardings.

  ckpt = Checkpoints(workdir / "checkpoints" / "bucket_000", keep=3)
  ckpt.save(step, state, {"step": step})
  step, state, meta = ckpt.restore(abstract_target(state))      # the newest
  meta = ckpt.metadata()     # the newest save's metadata alone (e.g. to build the target)
  ckpt.prune_after(step)     # on resume: drop checkpoints written after the restored step
  ckpt.close()               # waits for asynchronous saves

Best-by-metric parameters are not separate checkpoints: the sweep keeps them inside its state
(docs/training.md, "Checkpoints").
"""
import os

import jax
import orbax.checkpoint as ocp

_ITEMS = ("state", "metadata")


def abstract_target(tree):
  """jax.ShapeDtypeStruct leaves (shape, dtype, sharding) mirroring a pytree of arrays."""
  def leaf(x):
    sharding = getattr(x, "sharding", None)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  return jax.tree.map(leaf, tree)


class Checkpoints:
  """The newest `keep` orbax checkpoints of a pytree under one directory."""

  def __init__(self, directory, *, keep=3, async_save=True):
    """Opens (creating if needed) the checkpoint directory.

    Args:
      directory: folder holding one sub-folder per saved step.
      keep: number of newest checkpoints kept (>= 1).
      async_save: write in background threads (arrays are copied before `save` returns).
    """
    if keep < 1:
      raise ValueError(f"Checkpoints: keep={keep!r}, expected an int >= 1")
    self.directory = os.path.abspath(os.fspath(directory))
    self._manager = ocp.CheckpointManager(
        self.directory, item_names=_ITEMS,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save))

  def save(self, step, state, metadata=None):
    """Saves `state` (and JSON `metadata`) as checkpoint `step`."""
    self._manager.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(dict(metadata or {}))),
        force=True)

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

  def metadata(self, step=None):
    """The metadata dict of checkpoint `step` (default the newest); None when there is none."""
    step = self._step(step)
    if step is None:
      return None
    restored = self._manager.restore(
        step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))
    return dict(restored["metadata"] or {})

  def restore(self, target, *, step=None):
    """Restores (step, state, metadata); `target` is a concrete or abstract pytree of the state.

    `step=None` picks the newest checkpoint. Returns None when there is no checkpoint.
    """
    step = self._step(step)
    if step is None:
      return None
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_target(target)),
        metadata=ocp.args.JsonRestore()))
    return step, restored["state"], dict(restored["metadata"] or {})

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
    """Blocks until asynchronous saves are on disk."""
    self._manager.wait_until_finished()

  def close(self):
    """Waits for pending saves and releases the manager."""
    self._manager.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
