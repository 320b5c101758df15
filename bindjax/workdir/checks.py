"""Whether and how a sweep may use its workdir (an `etils.epath` path): the path, the lock held
for the run's life (`bindjax.workdir.lock`), what the directory already holds, what --overwrite
removes, and the check of a finished run's results against its done record.

A finished workdir is left alone; one whose results.jsonl no longer matches the done record is
rebuilt from the buckets' final checkpoints. Nothing a user put there is removed: --overwrite
deletes only what a previous run recorded as its outputs.
"""
import contextlib
import hashlib
import itertools
import json

from bindjax.base import errors
from bindjax.base import files
from bindjax.runtime import multihost
from bindjax.workdir import checkpoint
from bindjax.workdir import layout
from bindjax.workdir import lock as workdir_lock
from bindjax.workdir import results


def check_path(workdir):
  """errors.ConfigError when `workdir` (an epath.Path) is a file or lies under one."""
  if workdir.exists() and not workdir.is_dir():
    raise errors.ConfigError(f"workdir='{workdir}' is a file; expected a directory")
  if not files.is_local(workdir):
    return   # an object store's names do not nest under its files
  parent = workdir
  while not parent.exists():
    parent = parent.parent
  if not parent.is_dir():
    raise errors.ConfigError(f"workdir='{workdir}' lies under {parent}, which is a file; "
                             "expected a directory path")


@contextlib.contextmanager
def ownership(workdir, log):
  """Holds the workdir's lock (taken by the writer process) for the block."""
  lock, failure = None, None
  if multihost.is_writer():
    try:
      lock = workdir_lock.acquire(workdir)
    except OSError as e:
      failure = e
  if multihost.any_process(failure is not None):
    raise failure or OSError(f"workdir {workdir}: process 0 could not take its lock")
  try:
    if lock is not None and lock.stale:
      log(f"workdir {workdir}: took over the lock of a run that has ended "
          f"({workdir_lock.describe(lock.stale)})")
    yield
  finally:
    if lock is not None:
      lock.release()


def check_contents(workdir, config_json, overwrite):
  """Usage errors (errors.ConfigError) for a workdir this run may not use: one holding files
  that are not a bindjax run (with --overwrite: files named like its outputs), or without
  --overwrite a run of a different config."""
  entries = [p.name for p in (workdir.iterdir() if workdir.is_dir() else [])
             if p.name != layout.LOCK_FILE]
  if not entries or layout.Workdir(workdir).holds_run():
    if not overwrite:
      layout.Workdir(workdir).check_saved_config(config_json)
    return
  if not overwrite:
    raise errors.ConfigError(f"workdir='{workdir}' is not empty and holds no bindjax run; "
                             "expected a new or empty directory or a run to resume, or pass "
                             "--overwrite")
  clashes = sorted(set(entries) & set(layout.OUTPUTS + (layout.REPORT_DIR, files.OUTPUTS_FILE)))
  if clashes:
    raise errors.ConfigError(f"workdir='{workdir}' holds {', '.join(clashes)}, which bindjax did "
                             "not record as its outputs; move them away (--overwrite removes "
                             "only what bindjax wrote)")


def check_replicas(workdir, coordinates):
  """errors.ConfigError when the workdir's replicas.json (of a run to resume or a finished one)
  is not `coordinates`, the replicas this config's grid expands to: one line naming the first
  replica that differs. A workdir without the file has nothing to compare."""
  path = layout.Workdir(workdir).replicas_file
  if not path.exists():
    return
  saved = files.read_json(path)
  expected = json.loads(files.dumps(coordinates))   # as the file holds them (tuples as lists)
  for i, (there, here) in enumerate(itertools.zip_longest(saved, expected)):
    if there != here:
      raise errors.ConfigError(f"{path} does not match this config's grid from replica {i} on: "
                               f"{_replica_difference(there, here)}; resume with the grid that "
                               "wrote it, or pass --overwrite")


def _replica_difference(there, here):
  """What differs between one replica's entry in replicas.json and in the grid."""
  if here is None:
    return f"the file has {there}, past the grid's last replica"
  if there is None:
    return f"the file ends before it, the grid has {here}"
  if not isinstance(there, dict):
    return f"the file has {there!r}, the grid {here}"
  keys = [k for k in dict.fromkeys([*there, *here]) if there.get(k) != here.get(k)]
  return ", ".join(f"{k} {there.get(k)!r} there, {here.get(k)!r} in the grid" for k in keys)


def remove_outputs(workdir):
  """What a previous run recorded as its outputs (a run older than the record: the names it
  writes), and the report's recorded files; a user's files stay."""
  legacy = layout.OUTPUTS if layout.Workdir(workdir).config_file.exists() else ()
  files.remove_recorded_outputs(workdir, legacy)
  report_dir = layout.Workdir(workdir).report
  if report_dir.is_dir():
    files.remove_recorded_outputs(report_dir)
    if not any(report_dir.iterdir()):
      report_dir.rmdir()


def finished(workdir, done, buckets, log):
  """A finished workdir's done record, after checking results.jsonl against it; a damaged file
  is rebuilt from the final checkpoints of `buckets` (the run's buckets, or the parts of them it
  trained; ValueError when they cannot rebuild it)."""
  run = layout.Workdir(workdir)
  path = run.results_file
  expected = done.get("results_sha256")
  if expected is None or not multihost.is_writer():
    return done
  content = path.read_bytes() if path.exists() else b""
  if hashlib.sha256(content).hexdigest() == expected:
    return done
  coordinates = {}
  rows = []
  for bucket in buckets:
    coordinates.update((r.index, r.coordinates()) for r in bucket.replicas)
    directory = bucket.checkpoint_dir(workdir)
    latest = None
    if directory.is_dir():
      with checkpoint.Checkpoints(directory) as ckpt:
        latest = ckpt.verified_metadata(log)
    if latest is None or "rows" not in latest[1]:
      rows = None
      break
    rows += results.unpack_rows(latest[1]["rows"], coordinates)
  rows = None if rows is None else results.sweep_order(rows)
  if rows is None or results.rows_digest(rows) != expected:
    raise ValueError(f"{path} does not match {layout.DONE_FILE} (damaged or edited) and the "
                     "checkpoints cannot rebuild it; restore it from a copy or pass --overwrite")
  run.write_rows(rows)
  run.write_summary(rows, [c for _, c in sorted(coordinates.items())])
  log(f"{path} did not match {layout.DONE_FILE} (damaged or edited); rebuilt it from the "
      "checkpoints")
  return done
