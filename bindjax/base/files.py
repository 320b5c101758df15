"""Result files: atomic writes, JSONL reads that tolerate only a torn last line, and the record
of a directory's bindjax outputs.

Every module that writes a result goes through here, so a killed process never leaves a
half-written file under the final name. Paths are `etils.epath` paths: a local path, or any URI
epath serves (gs://, s3://, ...). Locally a file is written under a temporary name in the same
directory, fsynced and renamed onto its name. Object stores have no rename (epath emulates it
by copy and delete), so there the file is written to a local temporary file and uploaded in one
write: a store such as GCS or S3 publishes an object whole when its upload completes, so a
killed writer leaves the previous object or none, never a part of one.
"""
import contextlib
import json
import math
import os
import secrets
import shutil
import tempfile
import warnings
import zipfile

from etils import epath
import numpy as np


def is_local(path):
  """Whether `path` is on the local file system (not a URI such as gs://), the one with atomic
  renames, appends, fsync and locks."""
  return "://" not in os.fspath(path)


def as_path(path):
  """`path` as an `epath.Path`: a local one made absolute, a URI as it is."""
  path = epath.Path(path)
  return epath.Path(os.path.abspath(path)) if is_local(path) else path


@contextlib.contextmanager
def atomic_path(path):
  """Yields a local temporary file name; on success it becomes `path`, on failure it is removed.

  Locally the temporary file lies next to `path` and is renamed onto it; for a non-local `path`
  it lies in the local temporary directory and is uploaded to `path` in one write (see the
  module's docstring for what each guarantees). The temporary name keeps `path`'s extension, so
  writers that pick a format from it (np.savez, Figure.savefig) behave as they would with
  `path`. Parent directories are created.
  """
  path = as_path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  local = is_local(path)
  directory = os.fspath(path.parent) if local else tempfile.gettempdir()
  tmp = os.path.join(directory, f".{path.name}.tmp{os.getpid()}-{secrets.token_hex(4)}"
                     f"{os.path.splitext(path.name)[1]}")
  try:
    yield tmp
    if local:
      os.replace(tmp, path)
    else:
      with open(tmp, "rb") as src, path.open("wb") as dst:
        shutil.copyfileobj(src, dst)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def write_atomic(path, data):
  """Writes text or bytes to `path` atomically (fsynced before the rename)."""
  mode = "wb" if isinstance(data, (bytes, bytearray, memoryview)) else "w"
  with atomic_path(path) as tmp:
    with open(tmp, mode) as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())


def to_jsonable(value):
  """`value` with numpy scalars/arrays and tuples as JSON types, and NaN/±inf as None (strict
  JSON, which json.dumps would otherwise write as the non-standard NaN/Infinity)."""
  if isinstance(value, dict):
    return {str(k): to_jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_jsonable(v) for v in value]
  if isinstance(value, np.ndarray):
    return to_jsonable(value.tolist())
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def dumps(value, **kwargs):
  """Strict JSON text of `value` (through `to_jsonable`: NaN and ±inf become null)."""
  return json.dumps(to_jsonable(value), allow_nan=False, **kwargs)


def write_json(path, value, *, indent=2, sort_keys=False):
  """Writes `value` as one strict JSON document with a trailing newline, atomically."""
  write_atomic(path, dumps(value, indent=indent, sort_keys=sort_keys) + "\n")


def write_jsonl(path, rows):
  """Writes `rows` as strict JSON lines, atomically."""
  write_atomic(path, "".join(dumps(row) + "\n" for row in rows))


def append_jsonl(f, rows):
  """Appends `rows` to the open file `f` as strict JSON lines, in one write, flushed.

  One write of whole lines: a writer killed mid-append leaves at most a torn last line, which
  `read_jsonl` skips with a warning.
  """
  f.write("".join(dumps(row) + "\n" for row in rows))
  f.flush()


class TornLineWarning(UserWarning):
  """The last line of a JSONL file is cut short (a writer was killed mid-append); skipped."""


def _parse_line(raw):
  """The JSON object of one line, or None when the line is not one."""
  try:
    value = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError):
    return None
  return value if isinstance(value, dict) else None


def read_jsonl(path):
  """The JSON objects of a JSONL file, one per line; [] when the file is missing.

  Only the last line may be bad: a writer killed mid-append leaves a torn last line, which is
  skipped with a `TornLineWarning`. A line anywhere else that is not a JSON object is damage
  that must not pass unseen: ValueError naming the file and line.
  """
  path = as_path(path)
  if not path.exists():
    return []
  lines = path.read_bytes().split(b"\n")
  if lines[-1] == b"":
    lines.pop()   # the newline that ends the last line
  rows = []
  for number, raw in enumerate(lines, 1):
    row = _parse_line(raw)
    if row is not None:
      rows.append(row)
    elif number == len(lines):
      warnings.warn(f"{path}:{number}: skipped a torn last line (a writer was killed while "
                    "appending it)", TornLineWarning, stacklevel=2)
    else:
      raise ValueError(f"{path}:{number}: not a JSON object ({_preview(raw)}); the file is "
                       f"damaged before its last line ({len(lines)} lines)")
  return rows


def _preview(raw, limit=40):
  text = raw.decode("utf-8", errors="replace")
  return repr(text if len(text) <= limit else text[:limit] + "…")


def read_json(path):
  """The JSON document at `path`; ValueError naming the file when it is unreadable."""
  try:
    with as_path(path).open() as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: unreadable ({type(e).__name__}: {e})") from None


def read_arrays(path):
  """The array of a .npy file or {name: array} of a .npz file, never unpickling; ValueError
  naming the file when it is unreadable or holds objects instead of numbers."""
  try:
    with as_path(path).open("rb") as f:
      if os.fspath(path).endswith(".npz"):
        with np.load(f, allow_pickle=False) as arrays:
          return {name: arrays[name] for name in arrays.files}
      return np.load(f, allow_pickle=False)
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    raise ValueError(f"{path}: unreadable as numpy arrays ({type(e).__name__}: {e}); expected "
                     "arrays of numbers (object arrays are refused: they would be unpickled)"
                     ) from None


# The record of what bindjax wrote into a directory, so that --overwrite removes only that.
OUTPUTS_FILE = "bindjax_outputs.json"


def recorded_outputs(directory):
  """The names bindjax recorded as its outputs in `directory` (None when it recorded none)."""
  path = as_path(directory) / OUTPUTS_FILE
  if not path.exists():
    return None
  try:
    names = read_json(path)["outputs"]
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path}: unreadable record of bindjax's outputs ({e})") from None
  return [str(n) for n in names]


def record_outputs(directory, names):
  """Adds `names` (files or folders relative to `directory`) to its record of outputs.

  Record before writing: a name recorded but never written costs nothing, a file written but
  not recorded would survive --overwrite.
  """
  path = as_path(directory) / OUTPUTS_FILE
  recorded = recorded_outputs(directory) or []
  added = [n for n in names if n not in recorded]
  if added or not path.exists():
    write_json(path, {"outputs": recorded + added})


def remove_recorded_outputs(directory, names=()):
  """Removes what `directory`'s record names (`names` for a directory without a record), and
  the record; a recorded folder goes whole. Returns the paths removed; nothing else is touched,
  so a user's file beside bindjax's outputs survives.
  """
  directory = as_path(directory)
  recorded = recorded_outputs(directory)
  removed = [os.fspath(directory / name) for name in
             (recorded if recorded is not None else names) if _remove(directory / name)]
  if recorded is not None:
    (directory / OUTPUTS_FILE).unlink()
  return removed


def _remove(path):
  """Removes the file or the whole folder at `path` (a link, not what it points to); whether
  there was one."""
  if is_local(path) and os.path.islink(path):
    os.remove(path)
  elif path.is_dir():
    path.rmtree()
  elif path.exists():
    path.unlink()
  else:
    return False
  return True


def save_figure(fig, path, **savefig_kwargs):
  """Saves a matplotlib figure to `path` atomically; the caller still owns (and closes) `fig`."""
  with atomic_path(path) as tmp:
    fig.savefig(tmp, **savefig_kwargs)


def save_figures(fig, path_stem, formats, **savefig_kwargs):
  """Saves `fig` as path_stem.<format> for every format (atomically); returns the paths."""
  paths = [f"{path_stem}.{fmt}" for fmt in formats]
  for fmt, path in zip(formats, paths):
    save_figure(fig, path, format=fmt, **savefig_kwargs)
  return paths
