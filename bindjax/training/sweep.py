"""Coverage sweeps: many small dual encoders trained together, vmapped and sharded.

The run loop. `bindjax.training.grid` expands `config.grid` into replicas and buckets; each bucket
trains in one compiled program (`bindjax.training.bucket_programs`), or split into parts on lanes of
the devices that train side by side (`bindjax.training.packing`, `_interleave`). One
dispatch runs every step up to the next one whose rows are written (`dispatch_ends`), so a long
stretch between logged steps costs one dispatch, and the rows do not depend on it.

A config without a grid (experiments/train.py) runs as a sweep of one replica
(`grid.single_run_config`); that is `bindjax train`. The workdir layout is
`bindjax.workdir.layout`'s, result rows and best/final selection `bindjax.workdir.results`'; the
rows of a running sweep and results.jsonl are `bindjax.workdir.results_writer`'s; the workdir
checks and the lock are `bindjax.workdir.checks`'.

A run holds the workdir's lock for its whole life (`bindjax.workdir.lock`). A killed sweep
resumes from each bucket's newest checkpoint that verifies (`checkpoint.Checkpoints`, falling
back past damaged ones); each checkpoint holds its bucket's rows up to its step, so results.jsonl
is rebuilt from them (any row lost or damaged before a checkpoint comes back, and the run says
so), rows past it are recomputed bit for bit, and results equal an uninterrupted sweep. Nothing
is rewritten before the restore it depends on has succeeded. A replica whose loss or
parameters become non-finite is frozen at its last finite state, flagged in a "diverged" row,
and left out of later rows; the others continue. A bucket whose replicas have all diverged
stops there.
"""
import dataclasses
import functools
import time

import jax

from bindjax.base import errors
from bindjax.base import files
from bindjax.base import progress as progress_lib
from bindjax.runtime import engine
from bindjax.runtime import multihost
from bindjax.runtime import parallel
from bindjax.training import bucket_programs
from bindjax.training import grid
from bindjax.training import packing
from bindjax.training import run_spec
from bindjax.training import train
from bindjax.workdir import checkpoint
from bindjax.workdir import checks as workdir_checks
from bindjax.workdir import layout
from bindjax.workdir import results
from bindjax.workdir import results_writer


def run_sweep(config, workdir, *, overwrite=False, progress=True, log=print, devices=None,
              name="sweep", tensorboard=False):
  """Runs (or resumes) the sweep of `config` in `workdir`; returns the done-file summary.

  `workdir` is any `etils.epath` path: local, or gs:// and the other stores epath serves
  (docs/training.md says what each file system guarantees).

  The run holds the workdir's lock throughout (`bindjax.workdir.lock`). A finished workdir is
  reported and left alone unless overwrite=True, which first deletes what the previous run
  recorded as its outputs (and only that). Errors: errors.ConfigError for a setting or a
  workdir this run may not use (a different config, files that are not a bindjax run);
  ValueError for damaged data it cannot repair; OSError for the environment (a workdir held by
  a live run or not writable, a full disk). devices: the devices to train on (default all,
  over every process), laid out in lanes by `bindjax.training.packing`. name: what the log calls the
  run. tensorboard: also write the rows as TensorBoard event files (`bindjax.workdir.event_files`).
  """
  with errors.config_errors():
    settings = run_spec.LoopSpec.from_config(config)
    replicas, buckets = grid.expand_grid(config)
    devices = list(jax.devices() if devices is None else devices)
    parallel.make_mesh(settings.num_data, devices=devices)   # num_data divides the devices
  workdir = files.as_path(workdir)
  workdir_checks.check_path(workdir)
  with workdir_checks.ownership(workdir, log):
    return _run_owned(config, settings, workdir, replicas, buckets, devices,
                      overwrite=overwrite, progress=progress, log=log, label=name,
                      tensorboard=tensorboard)


def _plan(settings, workdir, buckets, devices):
  """The plan of the sweep's lanes (`packing.choose`); for a resumed run the one whose parts its
  checkpoints belong to (a workdir from before packing existed holds whole buckets).
  errors.ConfigError when no plan on these devices has them."""
  args = ([len(b.replicas) for b in buckets],
          [train.train_step_flops(b.spec) * b.spec.num_steps for b in buckets], len(devices),
          settings.num_data)
  processes = [d.process_index for d in devices]
  chosen = packing.choose(*args, device_processes=processes, packing=settings.packing)
  root = layout.Workdir(workdir).checkpoints
  present = {p.name for p in root.iterdir()} if root.is_dir() else set()
  if not present:
    return chosen
  turn = packing.in_turn(*args, num_processes=len(set(processes)))
  for plan in (chosen, turn):
    if present <= {buckets[p.bucket].part(p.start, p.stop).checkpoint_dir(workdir).name
                   for p in plan.parts}:
      return plan
  raise errors.ConfigError(
      f"{root} holds checkpoints of a run laid out on other devices than these {len(devices)} "
      f"(this run's plan: {chosen.describe()}); resume it on the devices it started on, or pass "
      "--overwrite")


def _count(n, noun):
  """"1 replica", "12 replicas", "2 processes"."""
  return f"{n} {noun}" + ("" if n == 1 else "es" if noun.endswith("s") else "s")


def _run_owned(config, settings, workdir, replicas, buckets, devices, *, overwrite, progress,
               log, label, tensorboard):
  writer = multihost.is_writer()
  config_json, coordinates = _check_workdir(config, workdir, replicas, overwrite, writer)
  plan = _plan(settings, workdir, buckets, devices)
  lanes = [(parallel.make_mesh(plan.num_data, devices=[devices[i] for i in lane.devices]),
            [buckets[p.bucket].part(p.start, p.stop) for p in lane.parts]) for lane in plan.lanes]
  parts = [part for _, lane_parts in lanes for part in lane_parts]
  done = layout.Workdir(workdir).done_record()
  if done is not None:
    done = workdir_checks.finished(workdir, done, parts, log)
    multihost.sync("bindjax_sweep_finished")
    log(f"the run in {workdir} is finished ({done['num_replicas']} replicas, "
        f"{done['num_buckets']} buckets); nothing to do (pass --overwrite to run it again)")
    return done
  if writer:
    _write_run_files(workdir, config_json, coordinates)

  managers = {p.key: checkpoint.Checkpoints(p.checkpoint_dir(workdir),
                                            keep=settings.checkpoint_keep) for p in parts}
  rows = results_writer.ResultsWriter(workdir, replicas, log, tensorboard)
  loop = _Loop(results=rows, bar=None, log=log, settings=settings)
  try:
    log(f"{label}: {_count(len(replicas), 'replica')} in {_count(len(buckets), 'bucket')} on "
        f"{_count(len(devices), 'device')} ({_count(jax.process_count(), 'process')}); "
        f"{plan.describe()}")
    restored = _restore_lanes(loop, lanes, managers, log)
    total = _start_progress(loop, buckets, parts, restored, progress and writer, log)
    rows.publish()

    def lane_work(mesh, lane_parts):
      for part in lane_parts:
        manager = managers[part.key]
        start, state, complete = restored.pop(part.key)
        if not complete:
          yield from loop.train(part, mesh, manager, start, state)
        manager.close()
        if writer:
          layout.Workdir(workdir).write_summary(rows.rows(), coordinates)

    _interleave([lane_work(mesh, lane_parts) for mesh, lane_parts in lanes])
    rows.finish()
  except BaseException:
    rows.close()
    for manager in managers.values():
      try:
        manager.close()
      except OSError:
        pass   # the error that got us here says more
    raise
  finally:
    if loop.bar is not None:
      loop.bar.close()
  return _finish(workdir, replicas, buckets, rows, loop, total, coordinates, writer, log)


def _check_workdir(config, workdir, replicas, overwrite, writer):
  """Checks the workdir against this run (or clears it with `overwrite`) on every process;
  returns (the config's JSON, the replicas' coordinates)."""
  config_json = results.config_json(config)
  workdir_checks.check_contents(workdir, config_json, overwrite)
  coordinates = [r.coordinates() for r in replicas]
  if not overwrite:
    workdir_checks.check_replicas(workdir, coordinates)
  elif writer:
    workdir_checks.remove_outputs(workdir)
  # Every process has checked the workdir before process 0 writes into it.
  multihost.sync("bindjax_sweep_checked")
  return config_json, coordinates


def _write_run_files(workdir, config_json, coordinates):
  """Records the run's outputs and writes its config and replica files, unless present."""
  files.record_outputs(workdir, layout.OUTPUTS)
  # A resumed run already has them (the config was checked): nothing is rewritten.
  run_files = layout.Workdir(workdir)
  for path, value, sort_keys in ((run_files.config_file, config_json, True),
                                 (run_files.replicas_file, coordinates, False)):
    if not path.exists():
      files.write_json(path, value, sort_keys=sort_keys)


def _restore_lanes(loop, lanes, managers, log):
  """{part key: (start step, restored state or None, complete)} of every part of every lane;
  only a lane's first part with training left keeps its restored state."""
  # Every restore (state and rows, checksums verified) succeeds before anything is rewritten.
  latest = {p.key: managers[p.key].verified_metadata(log)
            for _, lane_parts in lanes for p in lane_parts}
  restored = {}
  for mesh, lane_parts in lanes:
    training = None   # the lane's first part with training left: it keeps its restored state
    for part in lane_parts:
      start, state, complete = loop.restore(part, mesh, managers[part.key], latest[part.key])
      training = part.key if training is None and not complete else training
      restored[part.key] = (start, state if training == part.key else None, complete)
  return restored


def _start_progress(loop, buckets, parts, restored, show, log):
  """Opens the loop's progress bar at the restored replica-steps; returns the run's total."""
  total = sum(len(b.replicas) * b.spec.num_steps for b in buckets)
  initial = sum(len(p.replicas) * (p.spec.num_steps if restored[p.key][2]
                                   else restored[p.key][0]) for p in parts)
  if initial:
    log(f"resuming at {initial:,} of {total:,} replica-steps")
  loop.bar = progress_lib.bar(total, "replica-step", show, initial)
  return total


def _finish(workdir, replicas, buckets, rows, loop, total, coordinates, writer, log):
  """Writes the summary and the done file of a finished run; returns the done record."""
  all_rows = rows.rows()
  done = {"num_replicas": len(replicas), "num_buckets": len(buckets),
          "num_diverged": len(rows.diverged), "compile_seconds": round(loop.compile_seconds, 2),
          "replica_steps": total, "results": str(rows.path), "num_rows": len(all_rows),
          "results_sha256": results.rows_digest(all_rows)}
  if writer:
    layout.Workdir(workdir).write_summary(all_rows, coordinates)
    layout.Workdir(workdir).write_done(done)
  multihost.sync("bindjax_sweep_done")
  log(f"sweep finished: {len(replicas)} replicas, {len(rows.diverged)} diverged; compile "
      f"{loop.compile_seconds:.1f} s; results in {rows.path}")
  return done


def _interleave(lanes):
  """Runs the lanes' generators, one step (a dispatch) of each in turn, until all are done.

  Dispatches are asynchronous, so while the host waits for one lane's rows the other lanes'
  queued work runs on their own devices. The order is fixed, so every process issues the same
  programs in the same order.
  """
  active = list(lanes)
  while active:
    for lane in list(active):
      if next(lane, _DONE) is _DONE:
        active.remove(lane)


_DONE = object()


def run_single(config, workdir, *, overwrite=False, progress=True, log=print, tensorboard=False):
  """`bindjax train`: runs a config without a grid as a one-replica sweep in `workdir`.

  Returns the replica's final evaluation row; when the replica diverged, with "diverged" True
  and "diverged_step" (the step whose update was non-finite) added.
  """
  with errors.config_errors():
    config = grid.single_run_config(config)
  run_sweep(config, workdir, overwrite=overwrite, progress=progress, log=log, name="train",
            tensorboard=tensorboard)
  rows = layout.Workdir(workdir).read_rows()
  final = [r for r in results.select_evaluations(rows, "final") if r[results.KIND] == "eval"]
  out = dict(final[0]) if final else {results.STEP: 0}
  diverged_at = results.diverged_steps(rows)
  if diverged_at:
    (step,) = diverged_at.values()   # one replica
    out.update({results.DIVERGED: True, results.DIVERGED_STEP: step})
  return out


def is_checkpoint_step(spec, checkpoint_every, step):
  """Whether a bucket saves a checkpoint after `step` steps (every checkpoint_every, the last)."""
  return step % checkpoint_every == 0 or step == spec.num_steps


def is_logged_step(spec, log_every, checkpoint_every, step):
  """Whether a bucket writes rows after `step` steps (evaluations, checkpoints, log_every)."""
  return (step % spec.eval_every == 0 or step % log_every == 0
          or is_checkpoint_step(spec, checkpoint_every, step))


def dispatch_ends(spec, log_every, checkpoint_every, start=0):
  """The steps after `start` at which the sweep loop's dispatches of a bucket end: every step
  that writes rows, and the step after one whose rows are written during the next dispatch
  (any but a checkpoint's), since the bucket stops there when they show every replica diverged.
  The steps in between run on the device in one dispatch, so k follows the cadence alone.
  """
  def waits(step):
    return (step > start and is_logged_step(spec, log_every, checkpoint_every, step)
            and not is_checkpoint_step(spec, checkpoint_every, step))

  return [step for step in range(start + 1, spec.num_steps + 1)
          if is_logged_step(spec, log_every, checkpoint_every, step) or waits(step - 1)]


@dataclasses.dataclass
class _Loop:
  """The settings and running state the buckets of one sweep share; each bucket (or part of
  one) trains on the mesh of its lane."""
  results: results_writer.ResultsWriter
  bar: object
  log: object
  settings: run_spec.LoopSpec
  compile_seconds: float = 0.0

  def is_logged(self, bucket):
    """Whether the bucket writes rows at a step (`is_logged_step`)."""
    return functools.partial(is_logged_step, bucket.spec, self.settings.log_every,
                             self.settings.checkpoint_every)

  @staticmethod
  def complete(bucket, latest):
    """Whether the bucket's checkpoint `latest` ((step, metadata) or None) ends its training."""
    if latest is None:
      return False
    step, metadata = latest
    return bool(metadata.get("complete", step >= bucket.spec.num_steps))

  @staticmethod
  def _inputs(bucket, mesh):
    """The bucket's stacked inputs, padded to the replica shards and sharded; and its padding."""
    return engine.place(bucket.stacked_inputs(), mesh)

  def _restore_state(self, bucket, mesh, inputs, restore, **kwargs):
    """`bucket_programs.restore_state` of the bucket's state on `mesh`."""
    target = bucket_programs.abstract_bucket_state(bucket.spec, mesh, inputs,
                                                   self.settings.keep_best)
    return bucket_programs.restore_state(restore, target, parallel.replica_sharding(mesh),
                                         **kwargs)

  def restore(self, bucket, mesh, manager, latest):
    """Restores the bucket from its newest checkpoint up to `latest` ((step, metadata) of the
    newest whose metadata verifies, or None) whose arrays verify too, falling back past
    damaged ones and saying so; takes its rows from it and deletes newer checkpoints.

    Returns (step, state, whether the bucket's training is complete); (0, None, False) without
    a checkpoint.
    """
    if latest is None:
      self.results.restore(bucket, 0, {}, self.is_logged(bucket))
      manager.prune_after(None)
      return 0, None, False
    inputs, _ = self._inputs(bucket, mesh)
    start, state, metadata = self._restore_state(bucket, mesh, inputs, manager.restore_verified,
                                                 at_most=latest[0], log=self.log)
    self.results.restore(bucket, start, metadata, self.is_logged(bucket))
    manager.prune_after(start)
    return start, state, self.complete(bucket, (start, metadata))

  def _compile(self, bucket, mesh, inputs, num_padded):
    """(init_fn, run_fn, eval_fn) of the bucket on `mesh`, compiled and logged."""
    spec = bucket.spec
    t0 = time.perf_counter()
    settings = self.settings
    init_fn, run_fn, eval_fn, chunk = bucket_programs.compile_bucket(
        spec, mesh, inputs, settings.chunk_size, settings.memory_fraction, self.log,
        settings.fast_compile, settings.keep_best)
    seconds = time.perf_counter() - t0
    self.compile_seconds += seconds
    self.log(f"{bucket.name}: {len(bucket.replicas)} replicas (padded to {num_padded}), "
             f"|O| = {spec.space.num_objects}, d_model {spec.model.d_model}; compiled in "
             f"{seconds:.1f} s" + (f"; chunk {chunk}" if chunk else ""))
    return init_fn, run_fn, eval_fn

  def _flush(self, bucket, mesh, pending, postfix):
    """Writes the pending rows; returns whether every replica of the bucket has diverged."""
    if not pending:
      return False
    host = parallel.gather_to_host([(train, evaluation) for _, train, evaluation in pending],
                                   mesh)
    for (step, _, _), (train_host, eval_host) in zip(pending, host):
      self.results.add(bucket, step, train_host, eval_host)
      if eval_host is not None:
        alive = train_host[results.DIVERGED_STEP][:len(bucket.replicas)] < 0
        acc = eval_host[results.SELECTION_METRIC][:len(bucket.replicas)][alive]
        if acc.size:
          postfix["heldout_obj"] = f"{acc.mean():.3f}"
          self.bar.set_postfix(postfix, refresh=False)
    pending.clear()
    return self.results.all_diverged(bucket)

  def train(self, bucket, mesh, manager, start, state=None):
    """Trains one bucket (or part of one) on `mesh` from step `start` to its last step (or
    until all its replicas diverged), yielding after each dispatch (`_interleave`). state: the
    state `restore` returned at `start` (restored again when None)."""
    spec = bucket.spec
    inputs, valid = self._inputs(bucket, mesh)
    init_fn, run_fn, eval_fn = self._compile(bucket, mesh, inputs, len(valid))
    if not start:
      state = init_fn(inputs)
    else:
      if state is None:
        _, state, _ = self._restore_state(bucket, mesh, inputs, manager.restore, step=start)
      self.log(f"{bucket.name}: resumed from the checkpoint at step {start}")
    postfix = {"compile": f"{self.compile_seconds:.0f}s"}
    self.bar.set_postfix(postfix, refresh=False)
    metadata = {"bucket": bucket.index, "padded_replicas": len(valid)}
    pending = []
    num_steps = spec.num_steps
    step = start
    log_every, checkpoint_every = self.settings.log_every, self.settings.checkpoint_every
    for done in dispatch_ends(spec, log_every, checkpoint_every, start):
      state, train_metrics = run_fn(state, inputs, bucket_programs.global_scalar(done - step, mesh))
      is_eval = done % spec.eval_every == 0 or done == num_steps
      is_checkpoint = is_checkpoint_step(spec, checkpoint_every, done)
      eval_metrics = None
      if is_eval:
        state, eval_metrics = eval_fn(state, inputs, bucket_programs.global_scalar(done, mesh))
      # Metrics of the previous logged step: its values are ready by now, this dispatch queued.
      # Divergence is only learnt from flushed rows, so it is checked only when rows were written.
      stop = self._flush(bucket, mesh, pending, postfix)
      if is_eval or is_checkpoint or stop or done % log_every == 0:
        pending.append((done, train_metrics, eval_metrics))
      if is_checkpoint or stop:
        self._flush(bucket, mesh, pending, postfix)
        self.results.sync()
        manager.save(done, bucket_programs.checkpoint_state(state, parallel.replica_sharding(mesh)),
                     dict(metadata, step=done, complete=stop or done == num_steps,
                          rows=self.results.packed(bucket)))
      self.bar.update(len(bucket.replicas) * ((num_steps if stop else done) - step))
      if stop:
        self.log(f"{bucket.name}: every replica diverged; stopped at step {done}")
        break
      step = done
      yield
    self._flush(bucket, mesh, pending, postfix)
    manager.wait()
