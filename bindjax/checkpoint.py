"""All orbax use of bindjax: periodic, keep-last-n and best-by-metric checkpoints of any pytree.

A `Checkpoints` object manages one directory:

  DIR/latest/<step>/{state,metadata}   periodic saves, the newest `keep` are kept
  DIR/best/<step>/{state,metadata}     the `keep_best` saves with the best metric value

The state is any pytree of jax arrays (a single run's TrainState or a replica-stacked, sharded one
from the sweep); metadata is a JSON-serialisable dict stored beside it. Restores go into a target
pytree, concrete or abstract (`abstract_target(tree)`, jax.ShapeDtypeStruct with sharding), so
optax states and flax dataclasses come back with their own types and shardings.

  ckpt = Checkpoints(workdir / "checkpoints", keep=3)
  ckpt.save(step, state, {"step": step})                        # periodic
  ckpt.save_best(step, state, value=acc, metadata={...})        # only if acc improves
  step, state, meta = ckpt.restore(abstract_target(state))      # latest; which="best" for best
  ckpt.prune_after(step)     # on resume: drop checkpoints written after the restored step
  ckpt.close()               # waits for asynchronous saves
"""
import math
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
  """Latest-n and best-by-metric orbax checkpoints of a pytree under one directory."""

  def __init__(self, directory, *, keep=3, keep_best=1, best_mode="max", async_save=True):
    """Opens (creating if needed) the checkpoint directory.

    Args:
      directory: folder holding `latest/` and `best/`.
      keep: number of newest periodic checkpoints kept (>= 1).
      keep_best: number of best checkpoints kept (>= 1).
      best_mode: "max" or "min": which metric values are better.
      async_save: write in background threads (arrays are copied before `save` returns).
    """
    if keep < 1:
      raise ValueError(f"Checkpoints: keep={keep!r}, expected an int >= 1")
    if keep_best < 1:
      raise ValueError(f"Checkpoints: keep_best={keep_best!r}, expected an int >= 1")
    if best_mode not in ("max", "min"):
      raise ValueError(f"Checkpoints: best_mode={best_mode!r}, expected 'max' or 'min'")
    self.directory = os.path.abspath(os.fspath(directory))
    self.best_mode = best_mode
    self._latest = ocp.CheckpointManager(
        os.path.join(self.directory, "latest"), item_names=_ITEMS,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save))
    self._best = ocp.CheckpointManager(
        os.path.join(self.directory, "best"), item_names=_ITEMS,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep_best, best_fn=lambda metrics: metrics["value"],
            best_mode=best_mode, keep_checkpoints_without_metrics=False,
            cleanup_tmp_directories=True, enable_async_checkpointing=async_save))
    self.best_value = self._read_best_value()

  def _manager(self, which):
    if which == "latest":
      return self._latest
    if which == "best":
      return self._best
    raise ValueError(f"Checkpoints: which={which!r}, expected 'latest' or 'best'")

  def _read_best_value(self):
    step = self._best.best_step()
    if step is None:
      return None
    metadata = self._best.restore(step, args=ocp.args.Composite(metadata=ocp.args.JsonRestore()))
    return metadata["metadata"]["best_value"]

  def is_better(self, value):
    """Whether `value` strictly improves on the best value so far (NaN never does)."""
    if value is None or math.isnan(value):
      return False
    if self.best_value is None:
      return True
    return value > self.best_value if self.best_mode == "max" else value < self.best_value

  def save(self, step, state, metadata=None):
    """Saves `state` (and JSON `metadata`) as periodic checkpoint `step`."""
    self._latest.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(dict(metadata or {}))),
        force=True)

  def save_best(self, step, state, value, metadata=None):
    """Saves `state` as a best checkpoint iff `value` improves on the best so far; returns that."""
    value = float(value)
    if not self.is_better(value):
      return False
    metadata = dict(metadata or {}, best_value=value)
    self._best.save(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), metadata=ocp.args.JsonSave(metadata)),
        metrics={"value": value}, force=True)
    self.best_value = value
    return True

  def latest_step(self, which="latest"):
    """Newest saved step (None when there is none)."""
    manager = self._manager(which)
    return manager.best_step() if which == "best" else manager.latest_step()

  def all_steps(self, which="latest"):
    """Sorted saved steps."""
    return sorted(self._manager(which).all_steps())

  def restore(self, target, *, step=None, which="latest"):
    """Restores (step, state, metadata); `target` is a concrete or abstract pytree of the state.

    `step=None` picks the newest periodic checkpoint (which="latest") or the best one
    (which="best"). Returns None when there is no checkpoint.
    """
    manager = self._manager(which)
    if step is None:
      step = manager.best_step() if which == "best" else manager.latest_step()
      if step is None:
        return None
    elif int(step) not in manager.all_steps():
      raise ValueError(f"Checkpoints: no {which} checkpoint at step {step} in {self.directory}; "
                       f"have {sorted(manager.all_steps())}")
    restored = manager.restore(int(step), args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_target(target)),
        metadata=ocp.args.JsonRestore()))
    return int(step), restored["state"], dict(restored["metadata"] or {})

  def prune_after(self, step):
    """Deletes checkpoints newer than `step` (both kinds) and re-reads the best value.

    A resumed run recomputes those steps bit for bit, so this makes the directory look as if the
    run had never gone past `step`.
    """
    self.wait()
    for manager in (self._latest, self._best):
      for saved in manager.all_steps():
        if step is None or saved > step:
          manager.delete(saved)
    self._best.reload()
    self.best_value = self._read_best_value()

  def wait(self):
    """Blocks until asynchronous saves are on disk."""
    self._latest.wait_until_finished()
    self._best.wait_until_finished()

  def close(self):
    """Waits for pending saves and releases the managers."""
    self._latest.close()
    self._best.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()
