"""The complexity and probe packages sit below the commands and import nothing that imports them.

Walks every import statement of the library (module level and inside functions) and fails on an
import cycle through `bindjax.complexity` or `bindjax.probes`, and on any library module that
imports `bindjax.commands`.
"""
import ast
import os

import bindjax

ROOT = os.path.dirname(bindjax.__file__)


def library_imports():
  """{module: set of bindjax modules it imports} over every .py file of the package."""
  graph = {}
  for folder, _, names in os.walk(ROOT):
    for name in names:
      if not name.endswith(".py"):
        continue
      path = os.path.join(folder, name)
      parts = os.path.relpath(path, os.path.dirname(ROOT))[:-3].split(os.sep)
      is_package = parts[-1] == "__init__"
      module = ".".join(parts[:-1] if is_package else parts)
      package = module if is_package else module.rpartition(".")[0]
      with open(path) as f:
        tree = ast.parse(f.read())
      targets = set()
      for node in ast.walk(tree):
        if isinstance(node, ast.Import):
          targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
          base = node.module or ""
          if node.level:
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] +
                            ([base] if base else []))
          targets.update(f"{base}.{a.name}" for a in node.names)
          targets.add(base)
      graph[module] = {t for t in targets if t.startswith("bindjax")}
  # An import of a name inside a module (from bindjax.x import f) is an import of that module.
  return {m: {t if t in graph else t.rpartition(".")[0] for t in ts} & set(graph)
          for m, ts in graph.items()}


def reachable(graph, start):
  seen, stack = set(), [start]
  while stack:
    for nxt in graph.get(stack.pop(), ()):
      if nxt not in seen:
        seen.add(nxt)
        stack.append(nxt)
  return seen


def test_no_cycles_through_complexity_or_probes():
  graph = library_imports()
  assert "bindjax.complexity.fitting" in graph and "bindjax.probes.linear" in graph
  for module in graph:
    if module.startswith(("bindjax.complexity", "bindjax.probes")):
      assert module not in reachable(graph, module), f"{module} imports itself through a cycle"


def test_library_never_imports_the_commands():
  graph = library_imports()
  for module, targets in graph.items():
    if not module.startswith(("bindjax.commands", "bindjax.cli")):
      assert not any(t.startswith("bindjax.commands") for t in targets), module
