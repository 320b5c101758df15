"""A restricted unpickler for files written by PyTorch and numpy, without torch and without
running code from the file.

`pickle` turns every global a file names into a callable; a hostile file names `os.system`. This
unpickler resolves only a fixed table of globals, each to a small function of ours that builds
numpy data (torch tensor and storage rebuilds, torch dtypes and storage types, numpy arrays,
dtypes and scalars, `collections.OrderedDict`, `set`), and refuses every other global with
`RefusedGlobalError` naming it as `module.qualname`, before anything from the file is called.

PyTorch `nn.Module` objects (whole modules pickled by `torch.save(module)`) are the one case of
a class instance: only the classes in `MODULE_CLASSES` are allowed, and they come back as
`ModuleState` records holding the pickled attribute dict (parameters, buffers, submodules and
plain values). Nothing of the torch class runs: pickle's BUILD only hands the dict to
`ModuleState.__setstate__`, which stores it. Any other module class is refused.

Tensors become numpy arrays (bfloat16 -> float32; see `TORCH_STORAGE_DTYPES`).
"""
import _compat_pickle
import codecs
import collections
import io
import os
import pickle
import struct

import numpy as np


class RefusedGlobalError(pickle.UnpicklingError):
  """A pickle named a global outside the allow-list; nothing from the file was executed."""

  def __init__(self, name, path=None):
    self.name = name
    self.path = None if path is None else os.fspath(path)
    where = f"{self.path}: " if self.path else ""
    super().__init__(
        f"{where}refusing to load global {name!r} from a pickle: bindjax only reads torch "
        "tensors and "
        "storages, torch.nn Linear/containers as plain state, numpy arrays, "
        "collections.OrderedDict and sets (never code from the file)")


# Storage class name -> numpy dtype of its elements. bfloat16 has no numpy dtype: its storage is
# read as uint16 bit patterns and widened to float32 (a bfloat16 is the top half of a float32).
TORCH_STORAGE_DTYPES = {
    "DoubleStorage": np.dtype("float64"),
    "FloatStorage": np.dtype("float32"),
    "HalfStorage": np.dtype("float16"),
    "BFloat16Storage": np.dtype("uint16"),
    "LongStorage": np.dtype("int64"),
    "IntStorage": np.dtype("int32"),
    "ShortStorage": np.dtype("int16"),
    "CharStorage": np.dtype("int8"),
    "ByteStorage": np.dtype("uint8"),
    "BoolStorage": np.dtype("bool"),
    "UntypedStorage": np.dtype("uint8"),
}

# torch dtype attribute name -> storage class name (torch dtypes appear in _rebuild_tensor_v3).
TORCH_DTYPES = {
    "float64": "DoubleStorage", "double": "DoubleStorage",
    "float32": "FloatStorage", "float": "FloatStorage",
    "float16": "HalfStorage", "half": "HalfStorage",
    "bfloat16": "BFloat16Storage",
    "int64": "LongStorage", "long": "LongStorage",
    "int32": "IntStorage", "int": "IntStorage",
    "int16": "ShortStorage", "short": "ShortStorage",
    "int8": "CharStorage", "uint8": "ByteStorage", "bool": "BoolStorage",
}

# torch.nn classes that may appear as whole pickled modules; read as ModuleState.
MODULE_CLASSES = (
    "torch.nn.modules.linear.Linear",
    "torch.nn.modules.container.ModuleDict",
    "torch.nn.modules.container.ModuleList",
    "torch.nn.modules.container.Sequential",
)


class StorageType:
  """Stand-in for a torch storage class (torch.FloatStorage, ...)."""

  def __init__(self, name):
    self.name = name
    self.dtype = TORCH_STORAGE_DTYPES[name]

  def __repr__(self):
    return f"StorageType({self.name})"


class Storage:
  """A torch storage read into a flat numpy array (`data`, native byte order)."""

  def __init__(self, storage_type, data):
    self.storage_type = storage_type
    self.data = data

  @classmethod
  def from_bytes(cls, storage_type, raw, numel, byteorder="little"):
    """Storage of `numel` elements of `storage_type` from raw bytes."""
    dtype = storage_type.dtype.newbyteorder("<" if byteorder == "little" else ">")
    if storage_type.name == "UntypedStorage":
      dtype = np.dtype("uint8")
    needed = numel * dtype.itemsize
    if len(raw) < needed:
      raise ValueError(f"torch storage of {numel} x {storage_type.name} needs {needed} bytes, "
                       f"the file holds {len(raw)}")
    data = np.frombuffer(raw, dtype=dtype, count=numel).astype(dtype.newbyteorder("="))
    if storage_type.name == "BFloat16Storage":
      data = (data.astype(np.uint32) << 16).view(np.float32)
    return cls(storage_type, data)


class TorchDtype:
  """Stand-in for a torch dtype (torch.float32, ...)."""

  def __init__(self, name):
    self.name = name
    self.storage_type = StorageType(TORCH_DTYPES[name])

  def __repr__(self):
    return f"TorchDtype({self.name})"


class TorchClass:
  """Stand-in for torch.Tensor / torch.nn.Parameter as an argument of _rebuild_from_type_v2."""

  def __init__(self, name):
    self.name = name


class ModuleState:
  """The pickled state of a whole torch.nn module, as data only.

  `torch_class` names the module class; `parameters`, `buffers` and `modules` are the module's
  `_parameters`, `_buffers` and `_modules` dicts (arrays / ModuleState); `attributes` the other
  plain attributes (e.g. in_features).
  """
  torch_class = "torch.nn.Module"

  def __setstate__(self, state):
    if not isinstance(state, dict):
      raise pickle.UnpicklingError(
          f"{self.torch_class}: expected a dict of module attributes, got {type(state).__name__}")
    self.parameters = dict(state.get("_parameters") or {})
    self.buffers = dict(state.get("_buffers") or {})
    self.modules = dict(state.get("_modules") or {})
    self.attributes = {k: v for k, v in state.items() if not k.startswith("_")}

  def __getitem__(self, key):
    return self.modules[str(key)]

  def state_dict(self, prefix=""):
    """Flat {dotted name: array} like torch's state_dict() (None entries skipped)."""
    out = collections.OrderedDict()
    for name, value in list(self.parameters.items()) + list(self.buffers.items()):
      if value is not None:
        out[prefix + name] = value
    for name, module in self.modules.items():
      if module is not None:
        out.update(module.state_dict(f"{prefix}{name}."))
    return out

  def __repr__(self):
    return f"ModuleState({self.torch_class}, {list(self.state_dict())})"


def _module_class(qualified_name):
  return type(qualified_name.rsplit(".", 1)[1], (ModuleState,), {"torch_class": qualified_name})


def rebuild_tensor(storage, storage_offset, size, stride):
  """numpy copy of the tensor view (offset, size, stride in elements) into `storage`."""
  if not isinstance(storage, Storage):
    raise pickle.UnpicklingError(f"tensor rebuild expected a torch storage, got {storage!r}")
  size = tuple(int(s) for s in size)
  stride = tuple(int(s) for s in stride)
  storage_offset = int(storage_offset)
  if len(size) != len(stride) or any(s < 0 for s in size + stride) or storage_offset < 0:
    raise pickle.UnpicklingError(f"bad tensor geometry: size {size}, stride {stride}, "
                                 f"offset {storage_offset}")
  data = storage.data
  if 0 in size:
    return np.zeros(size, dtype=data.dtype)
  last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
  if last >= data.shape[0]:
    raise pickle.UnpicklingError(
        f"tensor of size {size}, stride {stride}, offset {storage_offset} reads element {last} "
        f"of a storage of {data.shape[0]}")
  view = np.lib.stride_tricks.as_strided(
      data[storage_offset:], shape=size, strides=tuple(s * data.itemsize for s in stride),
      writeable=False)
  return np.array(view, order="C")


def _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad=False,
                       backward_hooks=None, metadata=None):
  del requires_grad, backward_hooks, metadata
  return rebuild_tensor(storage, storage_offset, size, stride)


def _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad, backward_hooks,
                       dtype, metadata=None):
  del requires_grad, backward_hooks, metadata
  if (isinstance(storage, Storage) and isinstance(dtype, TorchDtype) and
      storage.storage_type.name == "UntypedStorage"):
    storage = Storage.from_bytes(dtype.storage_type, storage.data.tobytes(),
                                 storage.data.size // dtype.storage_type.dtype.itemsize)
  return rebuild_tensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None, state=None):
  del requires_grad, backward_hooks, state
  return data


def _rebuild_from_type_v2(func, new_type, args, state):
  del state
  if not isinstance(new_type, TorchClass):
    raise pickle.UnpicklingError(f"tensor subclass {new_type!r} is not supported")
  if func not in (_rebuild_tensor_v2, _rebuild_tensor_v3, _rebuild_parameter):
    raise pickle.UnpicklingError(f"{func!r} is not a tensor rebuild function")
  return func(*args)


def _np_reconstruct(subtype, shape, dtype):
  if subtype is not np.ndarray:
    raise pickle.UnpicklingError(f"numpy array subclass {subtype!r} is not supported")
  if isinstance(dtype, bytes):
    dtype = dtype.decode("latin1")
  return np.ndarray.__new__(np.ndarray, shape, dtype)


def _np_scalar(dtype, raw=None):
  if not isinstance(dtype, np.dtype):
    raise pickle.UnpicklingError(f"numpy scalar with dtype {dtype!r}")
  if dtype.hasobject:
    return raw
  if isinstance(raw, str):  # protocol 0-2 pickles from Python 2 carry str
    raw = raw.encode("latin1")
  return np.frombuffer(raw, dtype=dtype, count=1)[0]


def _np_frombuffer(buffer, dtype, shape, order):
  # numpy arrays pickled with protocol 5 (out-of-band capable buffers).
  if not isinstance(dtype, np.dtype) or dtype.hasobject:
    raise pickle.UnpicklingError(f"numpy buffer with dtype {dtype!r}")
  return np.frombuffer(buffer, dtype=dtype).reshape(shape, order=order).copy(order="K")


def _np_dtype(obj, align=False, copy=False):
  return np.dtype(obj, align=bool(align), copy=bool(copy))


def _codecs_encode(obj, encoding="utf-8", errors="strict"):
  # numpy arrays pickled with protocol <= 2 carry their bytes as encode(str, 'latin1').
  if codecs.lookup(encoding).name not in ("latin-1", "iso8859-1", "utf-8", "ascii"):
    raise pickle.UnpicklingError(f"_codecs.encode with codec {encoding!r} is not allowed")
  return codecs.encode(obj, encoding, errors)


def _allowed_globals():
  table = {
      "torch._utils._rebuild_tensor": rebuild_tensor,
      "torch._utils._rebuild_tensor_v2": _rebuild_tensor_v2,
      "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
      "torch._utils._rebuild_parameter": _rebuild_parameter,
      "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
      "torch._tensor._rebuild_from_type_v2": _rebuild_from_type_v2,
      "torch.Tensor": TorchClass("torch.Tensor"),
      "torch._tensor.Tensor": TorchClass("torch.Tensor"),
      "torch.nn.parameter.Parameter": TorchClass("torch.nn.Parameter"),
      "collections.OrderedDict": collections.OrderedDict,
      "builtins.set": set,
      "builtins.frozenset": frozenset,
      "_codecs.encode": _codecs_encode,
      "numpy.ndarray": np.ndarray,
      "numpy.dtype": _np_dtype,
  }
  for core in ("numpy.core.multiarray", "numpy._core.multiarray"):
    table[f"{core}._reconstruct"] = _np_reconstruct
    table[f"{core}.scalar"] = _np_scalar
  for numeric in ("numpy.core.numeric", "numpy._core.numeric"):
    table[f"{numeric}._frombuffer"] = _np_frombuffer
  for name in TORCH_STORAGE_DTYPES:
    table[f"torch.{name}"] = StorageType(name)
    table[f"torch.storage.{name}"] = StorageType(name)
    table[f"torch.cuda.{name}"] = StorageType(name)  # map_location="cpu" is implied
  for name in TORCH_DTYPES:
    table[f"torch.{name}"] = TorchDtype(name)
  for name in MODULE_CLASSES:
    table[name] = _module_class(name)
  return table


ALLOWED_GLOBALS = _allowed_globals()


class RestrictedUnpickler(pickle.Unpickler):
  """pickle.Unpickler resolving only ALLOWED_GLOBALS plus `extra_globals`.

  `persistent_load` is optional. `extra_globals` ({"module.qualname": object}) lets a caller that
  knows a format add its own safe handlers (torch_format adds the one for nested torch.save
  streams).
  """

  def __init__(self, file, persistent_load=None, extra_globals=None, **kwargs):
    super().__init__(file, **kwargs)
    self._persistent_load = persistent_load
    self._globals = {**ALLOWED_GLOBALS, **(extra_globals or {})}

  def find_class(self, module, name):
    # Python 2 names (protocol <= 2 pickles), mapped as pickle itself does.
    if (module, name) in _compat_pickle.NAME_MAPPING:
      module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    else:
      module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    qualified = f"{module}.{name}"
    if qualified not in self._globals:
      raise RefusedGlobalError(qualified)
    return self._globals[qualified]

  def persistent_load(self, pid):
    if self._persistent_load is None:
      raise pickle.UnpicklingError(f"persistent id {pid!r} in a plain pickle (expected a "
                                   "torch.save file)")
    return self._persistent_load(pid)


# What a damaged (truncated, empty, garbage) pickle raises while it is read.
READ_ERRORS = (pickle.UnpicklingError, EOFError, struct.error, KeyError, TypeError, ValueError,
               IndexError, AttributeError, UnicodeDecodeError)


def load(file_or_bytes, persistent_load=None, extra_globals=None):
  """Unpickles one object from a binary file, bytes or a path, allowing only safe globals.

  Raises RefusedGlobalError (a pickle.UnpicklingError) naming the first disallowed global;
  given a path, ValueError naming the file when it is not a readable pickle (truncated, empty).
  `extra_globals` as in RestrictedUnpickler.
  """
  if isinstance(file_or_bytes, (bytes, bytearray, memoryview)):
    file_or_bytes = io.BytesIO(file_or_bytes)
  if isinstance(file_or_bytes, (str, bytes)) or hasattr(file_or_bytes, "__fspath__"):
    with open(file_or_bytes, "rb") as f:
      try:
        return RestrictedUnpickler(f, persistent_load, extra_globals, encoding="latin1").load()
      except RefusedGlobalError as e:
        raise RefusedGlobalError(e.name, file_or_bytes) from None
      except READ_ERRORS as e:
        raise ValueError(f"{os.fspath(file_or_bytes)}: not a readable pickle "
                         f"({type(e).__name__}: {e}); expected a complete pickle file") from None
  return RestrictedUnpickler(file_or_bytes, persistent_load, extra_globals,
                             encoding="latin1").load()
