"""The bindjax package's import graph: one package per layer, each importing only from the
layers below it, and no cycles.

Both module-level and function-level imports count: an import inside a function only delays a
cycle or an upward dependency, it does not remove it.
"""
import ast
import collections
import os

import numpy as np
import scipy.sparse.csgraph

import bindjax

PACKAGE_DIR = os.path.dirname(bindjax.__file__)
# The layers, lowest first (bindjax/__init__.py says what each holds).
LAYERS = ("base", "core", "runtime", "workdir", "training", "reporting", "frozen", "complexity",
          "commands")


def _modules():
  """{module name: file path} of every module of the bindjax package."""
  out = {}
  root = os.path.dirname(PACKAGE_DIR)
  for directory, _, names in os.walk(PACKAGE_DIR):
    for name in names:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        module = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
        out[module.removesuffix(".__init__")] = path
  return out


def _imported(module, path, modules):
  """bindjax modules that `module` imports anywhere in its file (any nesting)."""
  is_package = path.endswith("__init__.py")
  found = set()
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = module.split(".")
        parent = parts if is_package else parts[:-1]
        parent = parent[:len(parent) - (node.level - 1)]
        base = ".".join(parent + ([base] if base else []))
      for alias in node.names:
        full = f"{base}.{alias.name}"
        found.add(full if full in modules else base)
  return {name for name in found if name in modules and name != module}


def import_graph():
  """{module: set of bindjax modules it imports} over the whole package."""
  modules = _modules()
  return {m: _imported(m, p, modules) for m, p in modules.items()}


def cycles(graph):
  """Strongly connected components with more than one module, as frozensets."""
  names = sorted(graph)
  adjacency_NxN = np.array([[b in graph[a] for b in names] for a in names], np.int8)
  _, labels = scipy.sparse.csgraph.connected_components(adjacency_NxN, connection="strong")
  components = collections.defaultdict(set)
  for name, label in zip(names, labels):
    components[label].add(name)
  return [frozenset(c) for c in components.values() if len(c) > 1]


def test_cycle_finder_sees_function_level_and_relative_imports(tmp_path):
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert cycles(graph) == [frozenset({"a", "b", "c"})]
  path = tmp_path / "w.py"
  path.write_text("def f():\n  from . import y\n  from bindjax import z\n")
  modules = {"bindjax.x", "bindjax.x.y", "bindjax.z"}
  assert _imported("bindjax.x.w", str(path), modules) == {"bindjax.x.y", "bindjax.z"}


def test_no_import_cycles():
  unexpected = [sorted(c) for c in cycles(import_graph())]
  assert not unexpected, f"import cycles in bindjax: {unexpected}"


def layer_of(module):
  """Index in LAYERS of `module`'s package; None for the root package itself."""
  parts = module.split(".")
  return LAYERS.index(parts[1]) if len(parts) > 1 else None


def upward_imports(graph):
  """(module, imported) pairs where a module imports from a higher layer or the root package
  imports anything."""
  out = []
  for module, imported in sorted(graph.items()):
    layer = layer_of(module)
    for name in sorted(imported):
      target = layer_of(name)
      if layer is None or target is None or target > layer:
        out.append((module, name))
  return out


def test_layer_check_sees_upward_and_root_imports():
  graph = {"bindjax": {"bindjax.base.files"}, "bindjax.core.world": {"bindjax.base.files"},
           "bindjax.base.files": {"bindjax.workdir.lock"}, "bindjax.workdir.lock": set()}
  assert upward_imports(graph) == [("bindjax", "bindjax.base.files"),
                                   ("bindjax.base.files", "bindjax.workdir.lock")]


def test_every_module_is_in_a_layer():
  outside = sorted(m for m in import_graph() if m != "bindjax" and m.split(".")[1] not in LAYERS)
  assert not outside, f"bindjax modules in no layer of {LAYERS}: {outside}"


def test_each_layer_imports_only_from_layers_below():
  upward = upward_imports(import_graph())
  assert not upward, f"imports against the layer order {LAYERS}: {upward}"


def test_importing_bindjax_changes_no_jax_setting():
  """Every jax.config value is the same before and after importing the whole library (one
  setting a library might want flipped is set against its default first)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = ("import jax\n"
          "jax.config.update('jax_threefry_partitionable', False)\n"
          "before = dict(jax.config.values)\n"
          "import importlib, pkgutil, bindjax\n"
          "for m in pkgutil.walk_packages(bindjax.__path__, 'bindjax.'):\n"
          "  importlib.import_module(m.name)\n"
          "changed = {k for k, v in jax.config.values.items() if before.get(k) != v}\n"
          "assert not changed, changed\n")
  subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


# Sizes a reader can hold in one sitting.
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 450, 60


def oversized(path):
  """(what, lines) of `path`'s module when over MAX_MODULE_LINES and of each function or method
  in it over MAX_FUNCTION_LINES (decorators and docstring included)."""
  with open(path) as f:
    source = f.read()
  out = []
  if source.count("\n") > MAX_MODULE_LINES:
    out.append(("module", source.count("\n")))
  for node in ast.walk(ast.parse(source, path)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      first = min([node.lineno] + [d.lineno for d in node.decorator_list])
      if node.end_lineno - first + 1 > MAX_FUNCTION_LINES:
        out.append((node.name, node.end_lineno - first + 1))
  return out


def test_size_check_sees_long_modules_and_functions(tmp_path):
  body = "".join(f"  x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
  path = tmp_path / "m.py"
  path.write_text("def short():\n  pass\n\n\ndef long():\n" + body)
  assert oversized(str(path)) == [("long", MAX_FUNCTION_LINES + 1)]
  path.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
  assert oversized(str(path)) == [("module", MAX_MODULE_LINES + 1)]


def test_no_module_or_function_is_over_its_size():
  over = {m: found for m, p in sorted(_modules().items()) if (found := oversized(p))}
  assert not over, (f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a "
                    f"function: {over}")
