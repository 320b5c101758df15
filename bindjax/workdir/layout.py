"""A training workdir: the one module that names the files under it, and reads and writes them
whole (`Workdir`).

`bindjax sweep` and `bindjax train` (a sweep of one replica) write the same layout
(docs/training.md, "Workdir"):

  config.json          the config (a single run's config gains the one-point grid it ran as)
  replicas.json        one dict of grid coordinates per replica
  results.jsonl        one row per replica and logged step (`bindjax.workdir.results`)
  summary.csv          one line per replica: final and best evaluation, or when it diverged
  sweep_done.json      written last; a rerun into a finished workdir reports and returns
  checkpoints/bucket_NNN/<step>/   stacked replica states of one bucket, and its rows so far
                       (bucket_NNN_replicas_AAA_to_BBB/ for a part of one,
                       `bindjax.training.packing`)
  tensorboard/         the rows as TensorBoard event files (`bindjax.workdir.event_files`)
  report/              `bindjax report`'s figure and tables
  bindjax_outputs.json what bindjax wrote here (`files.record_outputs`): --overwrite removes that
  bindjax.lock         held by the run while it runs (`bindjax.workdir.lock`)

What the rows and the config mean is `bindjax.workdir.results`'; appending rows while a sweep
runs is `bindjax.workdir.results_writer`'s.
"""
import os

from bindjax.base import errors
from bindjax.base import files
from bindjax.workdir import results

CONFIG_FILE = "config.json"
REPLICAS_FILE = "replicas.json"
RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.csv"
DONE_FILE = "sweep_done.json"
CHECKPOINT_DIR = "checkpoints"
TENSORBOARD_DIR = "tensorboard"
REPORT_DIR = "report"
LOCK_FILE = "bindjax.lock"
# What a training run writes into its workdir (the report keeps its own record in report/).
OUTPUTS = (CONFIG_FILE, REPLICAS_FILE, RESULTS_FILE, SUMMARY_FILE, DONE_FILE, CHECKPOINT_DIR,
           TENSORBOARD_DIR)


class Workdir:
  """A training workdir at `path` (a str, an `etils.epath` path, or a Workdir): its paths, and
  the reads and whole writes of its files."""

  def __init__(self, path):
    self.path = path.path if isinstance(path, Workdir) else files.as_path(path)

  def __str__(self):
    return str(self.path)

  def __fspath__(self):
    return os.fspath(self.path)

  @property
  def config_file(self):
    return self.path / CONFIG_FILE

  @property
  def replicas_file(self):
    return self.path / REPLICAS_FILE

  @property
  def results_file(self):
    return self.path / RESULTS_FILE

  @property
  def summary_file(self):
    return self.path / SUMMARY_FILE

  @property
  def done_file(self):
    return self.path / DONE_FILE

  @property
  def checkpoints(self):
    return self.path / CHECKPOINT_DIR

  @property
  def tensorboard(self):
    return self.path / TENSORBOARD_DIR

  @property
  def report(self):
    return self.path / REPORT_DIR

  @property
  def lock_file(self):
    return self.path / LOCK_FILE

  def bucket_dir(self, bucket, members=None):
    """Checkpoint directory of bucket number `bucket`, or with members=(start, stop) of the
    part of it that holds its replicas at positions start..stop-1 (`bindjax.training.packing`)."""
    name = f"bucket_{bucket:03d}"
    if members is not None:
      name += f"_replicas_{members[0]:03d}_to_{members[1] - 1:03d}"
    return self.checkpoints / name

  def bucket_parts(self, bucket):
    """(start, stop) of each part of bucket number `bucket` that has a checkpoint directory
    (`bucket_dir` with members), in order; [] when it was trained whole."""
    prefix = self.bucket_dir(bucket).name + "_replicas_"
    spans = []
    for path in (self.checkpoints.iterdir() if self.checkpoints.is_dir() else []):
      first, _, last = path.name[len(prefix):].partition("_to_")
      if path.name.startswith(prefix) and first.isdigit() and last.isdigit():
        spans.append((int(first), int(last) + 1))
    return sorted(spans)

  def holds_run(self):
    """Whether a training run wrote here (its config, or a record of bindjax's outputs)."""
    return self.config_file.exists() or files.recorded_outputs(self.path) is not None

  def is_finished(self):
    """Whether the run here is finished: the one test of it (its done record exists, the file
    a run writes last)."""
    return self.done_file.exists()

  def done_record(self):
    """The done record of a finished run (`is_finished`), None while it is unfinished."""
    return files.read_json(self.done_file) if self.is_finished() else None

  def write_done(self, record):
    """Writes the done record: the last file a run writes."""
    files.write_json(self.done_file, record)

  def read_rows(self):
    """The rows of results.jsonl ([] when there is none).

    A torn last line is skipped with a warning (files.read_jsonl); any other line that is not a
    result row is a ValueError naming the file and line.
    """
    try:
      rows = files.read_jsonl(self.results_file)
    except ValueError as e:
      raise ValueError(f"{e}; rerun the sweep's command to rebuild it from the checkpoints"
                       ) from None
    for number, row in enumerate(rows, 1):
      if not results.is_row(row):
        raise ValueError(f"{self.results_file}:{number}: not a result row (expected kind in "
                         f"{results.KINDS}, an integer replica and step); rerun the sweep's "
                         "command to rebuild the file from the checkpoints")
    return rows

  def write_rows(self, rows):
    """Writes results.jsonl whole (atomically), holding `rows`: every whole write of the file
    goes through here; a running sweep's appends are `results_writer.ResultsWriter`'s."""
    files.write_atomic(self.results_file, results.rows_text(rows))

  def read_replicas(self):
    """The coordinates of every replica (replicas.json); ValueError when missing."""
    if not self.replicas_file.exists():
      raise ValueError(f"{self.replicas_file} does not exist; expected a `bindjax sweep` or "
                       "`bindjax train` workdir")
    return files.read_json(self.replicas_file)

  def write_summary(self, rows, replicas):
    """summary.csv with one line per replica with rows (atomic rewrite; none without rows)."""
    text = results.summary_csv(rows, replicas)
    if text is not None:
      files.write_atomic(self.summary_file, text)

  def check_saved_config(self, config):
    """errors.ConfigError when config.json exists and differs from `config` (a
    `results.config_json` dict); ValueError naming the file when it is unreadable.

    The message lists the differing fields (saved -> given), so a resumed run is never silently
    continued with other settings.
    """
    if not self.config_file.exists():
      return
    diff = results.config_difference(files.read_json(self.config_file), config)
    if not diff:
      return
    details = ", ".join(f"{k}: {saved!r} -> {given!r}" for k, saved, given in diff[:8])
    more = f" and {len(diff) - 8} more" if len(diff) > 8 else ""
    raise errors.ConfigError(f"workdir='{self}' holds a run with a different config "
                             f"({details}{more}); use a new --workdir or pass --overwrite")
