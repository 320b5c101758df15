"""Live curves: TensorBoard event files of a running sweep, one run per replica.

`bindjax sweep` and `bindjax train` write, beside results.jsonl, WORKDIR/tensorboard/<run>/
event files that `tensorboard --logdir=WORKDIR/tensorboard` shows while the sweep runs: one run
per replica, named by its grid coordinates (`run_name`), one scalar per numeric field of each
of its rows (train/loss, heldout/object_accuracy, ...) at the row's step. results.jsonl stays
the record the report reads; these files only show it.

The files are written here rather than through a library: an event file is a sequence of
TFRecords (length, masked CRC-32C of the length, data, masked CRC-32C of the data), each holding
an `Event` protocol buffer with a wall time, a step and a `Summary` of (tag, value) pairs; the
three messages need a dozen lines of protobuf wire format, where tensorboardX would add a
dependency and its protobuf code, and clu's writers TensorFlow. `read_scalars` reads them back
(and checks every CRC), for tests.

On a local workdir each row is appended to its replica's file as it comes (process 0 writes, at
the logging and evaluation cadence of results.jsonl). On a workdir that is not local (gs://)
files cannot be appended to, so the rows since the last checkpoint go to a new event file per
replica at every checkpoint and at the end; TensorBoard reads a run's files in name order. A
resumed run writes new files; the steps it recomputes after its checkpoint appear again with
the same values, and TensorBoard keeps the later ones.
"""
import collections
import os
import socket
import struct
import time

import numpy as np

from bindjax.base import files
from bindjax.workdir import layout
from bindjax.workdir import results

_FILE_PREFIX = "events.out.tfevents"
# Fields of a row that are not curves.
_NOT_SCALARS = frozenset(results.COORDINATES) | {results.KIND, results.STEP}


def run_name(coordinates):
  """A replica's run: its index and grid coordinates, e.g.
  "replica0003_O100_C2_coverage0.5_seed1_lr0.001_wd0.1" (and "_model<k>" for a model grid)."""
  c = coordinates
  name = (f"replica{c[results.REPLICA]:04d}_O{c[results.SPACE_SIZE]}_C{c[results.NUM_CONCEPTS]}"
          f"_coverage{c[results.COVERAGE]:g}_seed{c[results.SEED]}"
          f"_lr{c[results.LEARNING_RATE]:g}_wd{c[results.WEIGHT_DECAY]:g}")
  model = c.get(results.MODEL)
  return name + (f"_model{model}" if model not in (None, "", 0) else "")


class EventWriter:
  """Writes the rows of a sweep as TensorBoard scalars, one run directory per replica."""

  def __init__(self, workdir):
    self.root = layout.Workdir(workdir).tensorboard
    self.local = files.is_local(self.root)
    self.stem = f"{_FILE_PREFIX}.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
    self.pending = collections.defaultdict(list)   # run -> records not yet written (gs://)
    self.parts = 0

  def add(self, rows):
    """Writes (locally) or keeps (elsewhere) one event per row, at the row's step."""
    by_run = collections.defaultdict(list)
    now = time.time()
    for row in rows:
      by_run[run_name(row)].append(_record(_event(row, now)))
    for run, records in by_run.items():
      if self.local:
        self._append(run, b"".join(records))
      else:
        self.pending[run] += records

  def sync(self):
    """Writes the kept events (a workdir that is not local) as one new file per run."""
    if not self.pending:
      return
    self.parts += 1
    for run, records in self.pending.items():
      self._path(run, self.parts).write_bytes(_header() + b"".join(records))
    self.pending.clear()

  def _path(self, run, part=0):
    directory = self.root / run
    directory.mkdir(parents=True, exist_ok=True)
    return directory / (self.stem + (f".{part:05d}" if part else ""))

  def _append(self, run, data):
    path = self._path(run)
    fresh = not path.exists()
    with open(path, "ab") as f:
      f.write((_header() if fresh else b"") + data)


def _event(row, wall_time):
  """The Event of one row: its step and every finite numeric field as a scalar."""
  values = b"".join(
      _field(1, _field(1, tag.encode()) + _float_field(2, value))
      for tag, value in row.items()
      if tag not in _NOT_SCALARS and isinstance(value, (int, float, np.number))
      and not isinstance(value, bool) and np.isfinite(value))
  return _double_field(1, wall_time) + _varint_field(2, int(row[results.STEP])) + _field(
      5, values)


def _header():
  """The first record of every event file: the file version."""
  return _record(_double_field(1, time.time()) + _field(3, b"brain.Event:2"))


# Protocol buffer wire format: a key (field number << 3 | wire type) then the value.
def _varint(n):
  out = bytearray()
  while True:
    byte, n = n & 0x7F, n >> 7
    out.append(byte | (0x80 if n else 0))
    if not n:
      return bytes(out)


def _varint_field(number, n):
  return _varint(number << 3) + _varint(n)


def _double_field(number, x):
  return _varint(number << 3 | 1) + struct.pack("<d", x)


def _float_field(number, x):
  return _varint(number << 3 | 5) + struct.pack("<f", x)


def _field(number, data):
  return _varint(number << 3 | 2) + _varint(len(data)) + data


def _crc32c_table():
  table = []
  for i in range(256):
    c = i
    for _ in range(8):
      c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    table.append(c)
  return table


_CRC_TABLE = _crc32c_table()


def crc32c(data):
  """CRC-32C (Castagnoli) of `data`, as TFRecords use it."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _masked_crc(data):
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _record(data):
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", _masked_crc(length)) + data
          + struct.pack("<I", _masked_crc(data)))


def read_scalars(path):
  """[(step, tag, value)] of the event file at `path`; ValueError on a record whose CRC fails."""
  data = files.as_path(path).read_bytes()
  out, at = [], 0
  while at < len(data):
    (length,) = struct.unpack_from("<Q", data, at)
    (length_crc,) = struct.unpack_from("<I", data, at + 8)
    record = data[at + 12:at + 12 + length]
    (record_crc,) = struct.unpack_from("<I", data, at + 12 + length)
    if length_crc != _masked_crc(data[at:at + 8]) or record_crc != _masked_crc(record):
      raise ValueError(f"{path}: a record at byte {at} fails its CRC")
    fields = dict(_fields(record))
    for _, value in _fields(fields.get(5, b"")):
      value = dict(_fields(value))
      out.append((fields[2], value[1].decode(), struct.unpack("<f", value[2])[0]))
    at += 16 + length
  return out


def _fields(data):
  """(field number, value) of a protobuf message: ints for varints, bytes otherwise."""
  at = 0
  while at < len(data):
    key, at = _read_varint(data, at)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, at = _read_varint(data, at)
    elif wire == 1:
      value, at = data[at:at + 8], at + 8
    elif wire == 5:
      value, at = data[at:at + 4], at + 4
    else:
      length, at = _read_varint(data, at)
      value, at = data[at:at + length], at + length
    yield number, value


def _read_varint(data, at):
  n = shift = 0
  while True:
    byte = data[at]
    n |= (byte & 0x7F) << shift
    at += 1
    shift += 7
    if not byte & 0x80:
      return n, at
