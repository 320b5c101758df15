"""Complexity figure: test-only object and concept accuracy vs train fraction, a line per model."""
import collections
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from bindjax import files  # pylint: disable=g-import-not-at-top,wrong-import-position


def curves(rows, key):
  """{model name: (fractions, mean over seeds/lrs of `key`)} sorted by fraction."""
  by_model = collections.defaultdict(lambda: collections.defaultdict(list))
  for row in rows:
    by_model[row["name"]][row["train_fraction"]].append(row[key])
  return {name: (np.array(sorted(points)), np.array([np.mean(points[f]) for f in sorted(points)]))
          for name, points in by_model.items()}


def figure(rows):
  """Two panels (test-only object accuracy at its best evaluation, concept accuracy there)."""
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
  panels = (("best_test_object_acc", "test-only object accuracy"),
            ("test_concept_acc_at_best", "test-only concept accuracy"))
  for ax, (key, title) in zip(axes, panels):
    for name, (x, y) in curves(rows, key).items():
      ax.plot(x, y, marker="o", label=name)
    ax.set_xlabel("train fraction of objects")
    ax.set_title(title)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("accuracy (frozen linear probes)")
  axes[1].legend(fontsize=8)
  fig.tight_layout()
  return fig


def save_figure(rows, path):
  """Writes the figure to path (PNG) atomically."""
  fig = figure(rows)
  try:
    files.save_figure(fig, path, format=os.path.splitext(path)[1][1:] or "png", dpi=120)
  finally:
    plt.close(fig)
  return path
