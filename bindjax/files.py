"""Result files: atomic writes (temp name in the same directory, then os.replace) and JSONL reads.

Every module that writes a result goes through here, so a killed process never leaves a
half-written file under the final name.
"""
import contextlib
import json
import math
import os
import secrets

import numpy as np


@contextlib.contextmanager
def atomic_path(path):
  """Yields a temporary path next to `path`; renamed onto `path` on success, removed on failure.

  The temporary name keeps `path`'s extension, so writers that pick a format from it (np.savez,
  Figure.savefig) behave as they would with `path`. Parent directories are created.
  """
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  name = os.path.basename(path)
  tmp = os.path.join(directory, f".{name}.tmp{os.getpid()}-{secrets.token_hex(4)}"
                     f"{os.path.splitext(name)[1]}")
  try:
    yield tmp
    os.replace(tmp, path)
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
  `read_jsonl` skips.
  """
  f.write("".join(dumps(row) + "\n" for row in rows))
  f.flush()


def read_jsonl(path):
  """Rows of a JSONL file; [] when it is missing.

  A torn last line (a writer killed mid-append) is skipped: reading stops at the first line
  without a newline or that does not parse.
  """
  rows = []
  if not os.path.exists(path):
    return rows
  with open(path) as f:
    for line in f:
      if not line.endswith("\n"):
        break
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        break
  return rows


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
