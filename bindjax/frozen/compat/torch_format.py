"""Reading and writing PyTorch `torch.save` files without torch.

Formats read by `load`:
- zip (torch >= 1.6 default): `<root>/data.pkl` pickles the object; each storage is a persistent
  id `('storage', storage_type, key, location, numel)` whose raw bytes are `<root>/data/<key>`
  (byte order in `<root>/byteorder`, little when absent).
- legacy (`_use_new_zipfile_serialization=False`, and the bytes inside a pickled storage):
  consecutive pickles of the magic number, protocol 1001 and sys-info, then the object with
  persistent ids `('storage', type, key, location, numel, view_metadata)`, then the list of
  storage keys, then per key an int64 element count and the raw bytes.
- plain pickles (numpy arrays, dicts, tensors pickled with `pickle.dump`).

Everything goes through `safe_pickle` (no code from the file runs); tensors become numpy arrays.
"""
import io
import os
import pickle
import struct
import zipfile

import numpy as np

from bindjax.base import files
from bindjax.frozen.compat import safe_pickle

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
_REBUILDS = ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter",
             "_rebuild_parameter_with_state", "_rebuild_from_type_v2")


def load(path):
  """Reads a torch.save zip, a legacy torch.save file or a plain pickle at `path`.

  Returns Python objects with numpy arrays in place of tensors; whole torch.nn modules come back
  as `safe_pickle.ModuleState`. Raises ValueError naming the file when it cannot be read.
  """
  path = os.fspath(path)
  try:
    if zipfile.is_zipfile(path):
      with zipfile.ZipFile(path) as archive:
        return _load_zip(archive)
    with open(path, "rb") as f:
      return _load_stream(f)
  except safe_pickle.RefusedGlobalError as e:
    raise safe_pickle.RefusedGlobalError(e.name, path) from None
  except safe_pickle.READ_ERRORS + (zipfile.BadZipFile,) as e:
    raise ValueError(f"{path}: not a readable torch.save file or pickle: {e}") from e


def load_bytes(raw):
  """Like `load`, for the bytes of a file (zip, legacy or plain pickle)."""
  if raw[:4] == b"PK\x03\x04":
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
      return _load_zip(archive)
  return _load_stream(io.BytesIO(raw))


# A storage pickled on its own (pickle.dump(tensor)) carries a whole torch.save stream; its
# handler needs this module, so it is added here rather than in safe_pickle's table.
_NESTED_STREAMS = {"torch.storage._load_from_bytes": load_bytes}


def _load_zip(archive):
  pickles = sorted((n for n in archive.namelist() if n.endswith("data.pkl")),
                   key=lambda n: n.count("/"))
  if not pickles:
    raise ValueError("zip file has no <root>/data.pkl member (not a torch.save file)")
  root = pickles[0][:-len("data.pkl")]
  byteorder = "little"
  if f"{root}byteorder" in archive.namelist():
    byteorder = archive.read(f"{root}byteorder").decode().strip()
  storages = {}

  def persistent_load(pid):
    kind, storage_type, key, _, numel = _check_pid(pid, 5)
    del kind
    if key not in storages:
      raw = archive.read(f"{root}data/{key}")
      storages[key] = safe_pickle.Storage.from_bytes(storage_type, raw, int(numel), byteorder)
    return storages[key]

  with archive.open(pickles[0]) as f:
    return safe_pickle.load(io.BytesIO(f.read()), persistent_load, _NESTED_STREAMS)


def _check_pid(pid, length):
  if (not isinstance(pid, tuple) or len(pid) < length or pid[0] != "storage" or
      not isinstance(pid[1], safe_pickle.StorageType)):
    raise pickle.UnpicklingError(f"unsupported persistent id {pid!r} (expected a torch storage)")
  return pid


def _module_class(pid):
  """The class of a legacy ('module', class, source file, source) persistent id, else None.

  Legacy torch.save names each whole nn.Module class this way; the class itself was already
  resolved through safe_pickle's allow-list, so only ModuleState stand-ins can arrive here.
  """
  if (isinstance(pid, tuple) and len(pid) == 4 and pid[0] == "module" and
      isinstance(pid[1], type) and issubclass(pid[1], safe_pickle.ModuleState)):
    return pid[1]
  return None


def _load_stream(f):
  start = f.tell()
  first = safe_pickle.load(f, extra_globals=_NESTED_STREAMS)
  if not (isinstance(first, int) and first == LEGACY_MAGIC):
    return first
  protocol = safe_pickle.load(f)
  if protocol != LEGACY_PROTOCOL:
    raise pickle.UnpicklingError(f"legacy torch file with protocol {protocol!r}, expected "
                                 f"{LEGACY_PROTOCOL} (file starts at byte {start})")
  sys_info = safe_pickle.load(f)
  byteorder = "little" if sys_info.get("little_endian", True) else "big"
  object_start = f.tell()
  # The storage bytes come after the object: first learn each storage's type and size with
  # tensor rebuilds switched off, then read the bytes, then unpickle the object for real.
  storage_types = {}

  def record(pid):
    module_class = _module_class(pid)
    if module_class is not None:
      return module_class
    _, storage_type, key, _, _, _ = _check_pid(pid, 6)
    storage_types[key] = storage_type

  _DryRunUnpickler(f, record, _NESTED_STREAMS, encoding="latin1").load()
  keys = safe_pickle.load(f)
  count_format = "<q" if byteorder == "little" else ">q"
  roots = {}
  for key in keys:
    if key not in storage_types:
      raise pickle.UnpicklingError(f"legacy torch file lists storage {key!r} that the object "
                                   "never uses")
    storage_type = storage_types[key]
    (numel,) = struct.unpack(count_format, f.read(8))
    itemsize = 1 if storage_type.name == "UntypedStorage" else storage_type.dtype.itemsize
    raw = f.read(numel * itemsize)
    roots[key] = safe_pickle.Storage.from_bytes(storage_type, raw, numel, byteorder)
  data_end = f.tell()

  def persistent_load(pid):
    module_class = _module_class(pid)
    if module_class is not None:
      return module_class
    _, storage_type, key, _, _, view = _check_pid(pid, 6)
    if view is None:
      if key not in roots:
        raise pickle.UnpicklingError(f"legacy torch file: storage {key!r} has no data")
      return roots[key]
    _, offset, size = view  # a storage that is a slice of root storage `key`, in elements
    return safe_pickle.Storage(storage_type, roots[key].data[int(offset):int(offset) + int(size)])

  f.seek(object_start)
  obj = safe_pickle.load(f, persistent_load, _NESTED_STREAMS)
  f.seek(data_end)
  return obj


class _DryRunUnpickler(safe_pickle.RestrictedUnpickler):
  """Unpickles with tensor rebuilds returning None (storages are not read yet)."""

  def find_class(self, module, name):
    found = super().find_class(module, name)
    if module.startswith("torch") and name in _REBUILDS:
      return lambda *args: None
    return found


class _Global:
  """A global written into a pickle by name, without importing its module."""

  def __init__(self, module, name):
    self.module, self.name = module, name

  def __reduce__(self):
    return self.name

  def __call__(self, *args):
    raise TypeError(f"{self.module}.{self.name} is only a name to write into a pickle")


_REBUILD_TENSOR_V2 = _Global("torch._utils", "_rebuild_tensor_v2")
_ORDERED_DICT = _Global("collections", "OrderedDict")
_NUMPY_TO_STORAGE = {np.dtype(v): k for k, v in safe_pickle.TORCH_STORAGE_DTYPES.items()
                     if k not in ("BFloat16Storage", "UntypedStorage")}


class _StorageRef:

  def __init__(self, key, dtype, numel):
    self.key, self.dtype, self.numel = key, dtype, numel


class _TorchPickler(pickle._Pickler):  # pylint: disable=protected-access
  """Pickles numpy arrays as torch tensors on storages written as separate zip members."""

  def __init__(self, file):
    super().__init__(file, protocol=2)
    self.storages = []

  def persistent_id(self, obj):
    if isinstance(obj, _StorageRef):
      return ("storage", _Global("torch", _storage_name(obj.dtype)), obj.key, "cpu", obj.numel)
    return None

  def reducer_override(self, obj):
    if isinstance(obj, np.ndarray):
      _storage_name(obj.dtype)  # refuses dtypes torch has no storage for
      array = np.ascontiguousarray(obj).reshape(obj.shape)  # ascontiguousarray makes 0-d 1-d
      ref = _StorageRef(str(len(self.storages)), array.dtype, array.size)
      if array.dtype.name == "bfloat16":
        array = array.view(np.uint16)
      self.storages.append((ref.key, array))
      strides = tuple(int(np.prod(array.shape[i + 1:], dtype=np.int64))
                      for i in range(array.ndim))
      return (_REBUILD_TENSOR_V2,
              (ref, 0, tuple(array.shape), strides, False, _OrderedDictLiteral()))
    return NotImplemented

  def save_global(self, obj, name=None):
    if isinstance(obj, _Global):
      self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode("utf-8"))
      self.memoize(obj)
      return
    super().save_global(obj, name)


class _OrderedDictLiteral:
  """An empty collections.OrderedDict() (torch's backward_hooks argument)."""

  def __reduce__(self):
    return (_ORDERED_DICT, ())


def _storage_name(dtype):
  if dtype.name == "bfloat16":
    return "BFloat16Storage"
  dtype = np.dtype(dtype).newbyteorder("=")
  if dtype not in _NUMPY_TO_STORAGE:
    raise ValueError(f"cannot save a numpy array of dtype {dtype} as a torch tensor; expected "
                     f"one of {sorted(d.name for d in _NUMPY_TO_STORAGE)}")
  return _NUMPY_TO_STORAGE[dtype]


def save(obj, path, root="archive"):
  """Writes `obj` (dicts, lists, numbers, strings, numpy arrays) as a torch.save zip file.

  numpy arrays become CPU tensors (float64/32/16, int64/32/16/8, uint8, bool, ml_dtypes
  bfloat16). torch.load reads the result; so does `load`. Written to a temporary name first.
  """
  path = os.fspath(path)
  buffer = io.BytesIO()
  pickler = _TorchPickler(buffer)
  pickler.dump(obj)
  with files.atomic_path(path) as tmp:
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
      _write_aligned(archive, f"{root}/data.pkl", buffer.getvalue())
      _write_aligned(archive, f"{root}/byteorder", b"little")
      for key, array in pickler.storages:
        _write_aligned(archive, f"{root}/data/{key}", array.astype(array.dtype.newbyteorder("<"),
                                                                     copy=False).tobytes())
      _write_aligned(archive, f"{root}/version", b"3\n")


def _write_aligned(archive, name, data, alignment=64):
  # torch aligns each member's data to 64 bytes with a padding extra field, as it does.
  info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
  info.compress_type = zipfile.ZIP_STORED
  header = 30 + len(name.encode("utf-8"))
  offset = archive.fp.tell() + header + 4
  pad = (-offset) % alignment
  info.extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
  archive.writestr(info, data)
