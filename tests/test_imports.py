"""The bindjax package's import graph: no cycles, and the library never imports the CLI.

Both module-level and function-level imports count: an import inside a function only delays a
cycle, it does not remove it.
"""
import ast
import collections
import os

import numpy as np
import scipy.sparse.csgraph

import bindjax

PACKAGE_DIR = os.path.dirname(bindjax.__file__)


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


def test_library_does_not_import_the_command_line():
  graph = import_graph()
  offenders = sorted(m for m, imported in graph.items()
                     if not m.startswith("bindjax.commands") and m != "bindjax.commands.main"
                     and any(i.startswith("bindjax.commands") for i in imported))
  assert not offenders, f"library modules importing bindjax.commands: {offenders}"


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
