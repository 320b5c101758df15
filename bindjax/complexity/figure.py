"""Complexity figure: test-only object and concept accuracy against the train fraction.

One line per model: the median over seeds, with a band from the smallest to the largest seed's
value (no band with a single seed).
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

from bindjax.base import files  # pylint: disable=g-import-not-at-top,wrong-import-position
from bindjax.complexity import results  # pylint: disable=g-import-not-at-top,wrong-import-position

PANELS = (("best_test_object_acc", "test-only object accuracy (best evaluation)"),
          ("test_concept_acc_at_best", "test-only concept accuracy (there)"))


def curves(summary, metric):
  """{model name: (fractions, median, min, max)} of `results.summarize_seeds` rows, sorted by
  fraction (several learning rates of one model are separate names: "name lr=…")."""
  names = {(s["name"], s["learning_rate"]) for s in summary}
  several_lrs = len({lr for _, lr in names}) > 1
  by_model = {}
  for s in summary:
    label = s["name"] + (f" lr={s['learning_rate']:g}" if several_lrs and s["learning_rate"]
                         else "")
    by_model.setdefault(label, []).append(s)
  out = {}
  for label, rows in by_model.items():
    rows = sorted(rows, key=lambda s: s["train_fraction"])
    column = lambda k, rows=rows: np.array(
        [np.nan if s[f"{metric}_{k}"] is None else s[f"{metric}_{k}"] for s in rows])
    out[label] = (np.array([s["train_fraction"] for s in rows]), column("median"),
                  column("min"), column("max"))
  return out


def figure(rows):
  """Two panels (test-only object accuracy at its best evaluation, concept accuracy there)."""
  summary = results.summarize_seeds(rows)
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
  for ax, (metric, title) in zip(axes, PANELS):
    for label, (x, median, low, high) in curves(summary, metric).items():
      (line,) = ax.plot(x, median, marker="o", label=label)
      if not np.allclose(low, high, equal_nan=True):
        ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("train fraction of objects")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("accuracy (frozen linear probes)")
  axes[1].legend(fontsize=8)
  fig.tight_layout()
  return fig


def save_figure(rows, path):
  """Writes the figure of grid rows to path (format from its extension) atomically."""
  fig = figure(rows)
  try:
    files.save_figure(fig, path, format=os.path.splitext(path)[1][1:] or "png", dpi=120)
  finally:
    plt.close(fig)
  return path
