"""3-D MDS figures of quadruples (bindjax.frozen.geometry.mds results): one, or a grid of
several."""
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from bindjax.base import files  # pylint: disable=g-import-not-at-top,wrong-import-position

_STYLE = {  # kind -> (marker, colour)
    "attribute": ("s", "tab:red"),
    "shape": ("^", "tab:blue"),
    "object": ("o", "tab:green"),
    "composite": ("*", "black"),
    "sum": ("P", "tab:orange"),
}


def draw_quadruple(ax, result, annotate=True):
  """Draws one MDS result on a 3-D axis: points by kind, dashed lines sum -> composite."""
  points = result["points"]
  for kind, (marker, colour) in _STYLE.items():
    xyz = [p["coords"] for p in points if p["kind"] == kind]
    if xyz:
      ax.scatter(*zip(*xyz), marker=marker, color=colour, s=50, label=kind, depthshade=False)
  for s, c in result["lines"]:
    ax.plot(*zip(points[s]["coords"], points[c]["coords"]), "--", color="gray", lw=1)
  if annotate:
    for p in points:
      if p["kind"] != "sum":
        ax.text(*p["coords"], p["label"], fontsize=7)
  ax.set_title(f"{result['quadruple']} ({result['bank']}, stress-1 {result['stress_1']:.3f})",
               fontsize=9)
  ax.set_xticklabels([]); ax.set_yticklabels([]); ax.set_zticklabels([])


def _save(fig, path):
  try:
    files.save_figure(fig, path, dpi=120, bbox_inches="tight")
  finally:
    plt.close(fig)


def plot_quadruple(result, path):
  """One quadruple's MDS figure as a PNG at `path`."""
  fig = plt.figure(figsize=(6, 5))
  ax = fig.add_subplot(projection="3d")
  draw_quadruple(ax, result)
  ax.legend(fontsize=7, loc="upper left")
  _save(fig, path)
  return path


def plot_grid(results, path, columns=3):
  """Several quadruples side by side as one PNG."""
  if not results:
    raise ValueError("plot_grid: expected at least one MDS result")
  columns = min(columns, len(results))
  rows = math.ceil(len(results) / columns)
  fig = plt.figure(figsize=(5 * columns, 4.5 * rows))
  for i, result in enumerate(results):
    ax = fig.add_subplot(rows, columns, i + 1, projection="3d")
    draw_quadruple(ax, result, annotate=len(results) <= 4)
    if i == 0:
      ax.legend(fontsize=7, loc="upper left")
  _save(fig, path)
  return path
