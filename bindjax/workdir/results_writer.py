"""The result rows of a running sweep and results.jsonl, the file that shows them.

Rows are kept by bucket (`ResultsWriter`); process 0 appends them to results.jsonl as they come.
Each checkpoint of a bucket holds the bucket's rows up to its step, so a resumed sweep takes
them from its checkpoints and rewrites the file to hold exactly those before it appends; rows
lost or damaged before a checkpoint come back, and the run says so. Row contents and the workdir
layout are `bindjax.workdir.results`' and `bindjax.workdir.layout`'s.

On a workdir that is not local (gs://, ...) the file cannot be appended to (objects are written
whole), so there it is rewritten whole (`layout.Workdir.write_rows`) at every checkpoint and at
the end instead: it shows the rows up to the last checkpoint, not each logged step as it comes.
"""
import collections
import os

from bindjax.base import files
from bindjax.runtime import multihost
from bindjax.workdir import event_files
from bindjax.workdir import layout
from bindjax.workdir import results


class ResultsWriter:
  """The rows of one sweep, by bucket; results.jsonl (process 0 writes it) is their view.

  Each checkpoint of a bucket holds the bucket's rows up to its step (`packed`), so a resumed
  sweep takes every row its checkpoints cover from them (`restore`) and rewrites the file to
  hold exactly those (`publish`) once the restores succeeded, before appending new rows.
  """

  def __init__(self, workdir, replicas, log, tensorboard=False):
    self.workdir = layout.Workdir(workdir)
    self.path = self.workdir.results_file
    self.writer = multihost.is_writer()
    # The rows as TensorBoard curves too (`bindjax.workdir.event_files`), written by process 0.
    self.events = event_files.EventWriter(workdir) if tensorboard and self.writer else None
    self.published = False
    self.log = log
    self.coordinates = {r.index: r.coordinates() for r in replicas}
    self.by_bucket = {}  # Bucket.key (a bucket, or a part of one) -> its rows, in order
    self.diverged = {}   # replica index -> divergence step already reported
    self.file = None
    self._file_rows = None

  def rows(self):
    """Every row so far, in the order an uninterrupted sweep writes them."""
    return results.sweep_order([row for rows in self.by_bucket.values() for row in rows])

  def restore(self, bucket, step, metadata, is_logged):
    """Takes `bucket`'s rows up to checkpoint `step` from the checkpoint's metadata.

    Checkpoints written before they held rows leave results.jsonl as the only copy: its rows
    of the bucket up to `step` are kept if they are complete (every replica at every logged
    step, up to its divergence), else ValueError saying which rows are missing.
    """
    if not step:
      rows = []
    elif "rows" in metadata:
      rows = results.unpack_rows(metadata["rows"], self.coordinates)
    else:
      if self._file_rows is None:
        self._file_rows = self.workdir.read_rows()
      members = {r.index for r in bucket.replicas}
      rows = [r for r in self._file_rows
              if r[results.REPLICA] in members and r[results.STEP] <= step]
      missing = _missing_rows(rows, bucket, [s for s in range(1, step + 1) if is_logged(s)])
      if missing:
        replica, at = missing[0]
        raise ValueError(
            f"{self.path} lacks {len(missing)} rows of {bucket.name} up to its checkpoint "
            f"at step {step} (first: replica {replica}, step {at}), and that checkpoint predates "
            "checkpoints holding rows, so they cannot be rebuilt; restore the file from a copy or "
            "pass --overwrite to start the run over")
    self.by_bucket[bucket.key] = rows
    self.diverged.update(results.diverged_steps(rows))

  def packed(self, bucket):
    """The bucket's rows so far, packed for its checkpoint's metadata."""
    return results.pack_rows(self.by_bucket[bucket.key], self.coordinates)

  def publish(self):
    """Makes results.jsonl hold exactly the rows so far and, on a local workdir, opens it for
    appending (once)."""
    if not self.published and self.writer:
      self._match_file("rebuilt them from the checkpoints")
      if files.is_local(self.path):
        self.file = self.path.open("a")
    self.published = True

  def _match_file(self, repair):
    """Rewrites results.jsonl when it differs from the rows so far; says so when rows the file
    should have held were missing or damaged (rows past a checkpoint are dropped silently: they
    are recomputed)."""
    rows = self.rows()
    text = results.rows_text(rows)
    old = self.path.read_bytes() if self.path.exists() else b""
    if old == text.encode():
      return
    present = set(old.split(b"\n"))
    lines = text.encode().split(b"\n")[:-1]
    missing = sum(line not in present for line in lines)
    if missing:
      self.log(f"{self.path}: {missing} of the {len(lines)} rows it should hold were missing or "
               f"damaged; {repair}")
    self.workdir.write_rows(rows)

  def add(self, bucket, step, train_metrics, eval_metrics):
    """Rows of the valid replicas of `bucket` at `step` from host metric arrays [R]."""
    rows = []
    for i, replica in enumerate(bucket.replicas):
      if replica.index in self.diverged:
        continue
      diverged_step = int(train_metrics[results.DIVERGED_STEP][i])
      rows.append(results.make_row(
          replica.coordinates(), step, {k: v[i] for k, v in train_metrics.items()},
          None if eval_metrics is None else {k: v[i] for k, v in eval_metrics.items()},
          diverged_step))
      if diverged_step >= 0:
        self.diverged[replica.index] = diverged_step
    self.by_bucket[bucket.key].extend(rows)
    if self.events is not None:
      self.events.add(rows)
    if self.file is not None and rows:
      try:
        files.append_jsonl(self.file, rows)
      except OSError as e:
        raise OSError(e.errno, f"cannot write {self.path}: {e.strerror or e}") from None

  def all_diverged(self, bucket):
    """Whether every replica of `bucket` has a "diverged" row."""
    return all(replica.index in self.diverged for replica in bucket.replicas)

  def sync(self):
    """Makes the rows so far durable: flushed and fsynced, or on a non-local workdir written
    whole."""
    if self.events is not None:
      self.events.sync()
    if self.file is not None:
      self.file.flush()
      os.fsync(self.file.fileno())
    elif self.writer and self.published:
      self.workdir.write_rows(self.rows())

  def finish(self):
    """Closes the file, first making sure it holds every row (rewritten when it does not)."""
    self.close()
    if self.events is not None:
      self.events.sync()
    if self.writer:
      self._match_file("rewrote the file")

  def close(self):
    """Closes the file, as it is."""
    if self.file is not None:
      self.file.close()
      self.file = None


def _missing_rows(rows, bucket, logged_steps):
  """(replica, step) of rows a bucket must have at `logged_steps` but `rows` lack: each replica
  has a row at every logged step until its "diverged" row."""
  steps = collections.defaultdict(list)
  for row in rows:
    steps[row[results.REPLICA]].append(row[results.STEP])
  ended = results.diverged_steps(rows)
  missing = []
  for replica in bucket.replicas:
    have = steps[replica.index]
    expected = logged_steps[:len(have)] if replica.index in ended else logged_steps
    missing += [(replica.index, s) for s in expected if s not in have]
  return missing
