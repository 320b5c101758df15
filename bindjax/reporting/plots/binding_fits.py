"""Binding-fit figure: each replica's held-out accuracy against how well an approximator family
fits its embeddings on scenes of objects it never saw; one panel per family (docs/binding.md)."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
import numpy as np  # noqa: E402

from bindjax.base import files  # noqa: E402
from bindjax.reporting.plots import phase_transition  # noqa: E402
from bindjax.workdir import results  # noqa: E402

# R² below this is drawn at it (hollow marker): a failed fit's R² can be any negative number,
# and Spearman's ρ depends on ranks only.
R2_FLOOR = -1.0


def plot(rows, correlations, path_stem, step, accuracy_column, quality_column,
         formats=("png", "pdf")):
  """Draws one panel per `correlations` entry from the fitted `rows` (colour: |O|), titled
  with Spearman's ρ and its bootstrap interval; returns the written file paths."""
  panels = max(1, len(correlations))
  # At most two panels a row keeps the figure within 2.5:1.
  columns = min(panels, 2)
  grid_rows = -(-panels // columns)
  fig, grid = plt.subplots(grid_rows, columns, figsize=(3.6 * columns, 3.4 * grid_rows),
                           sharey=True, constrained_layout=True, squeeze=False)
  axes = list(grid.flat)
  for ax in axes[panels:]:
    ax.axis("off")
  sizes = sorted({r[results.SPACE_SIZE] for r in rows if r["status"] == "fitted"})
  colors = phase_transition.PALETTE
  for ax, entry in zip(axes, correlations):
    for i, size in enumerate(sizes):
      fitted = [r for r in rows if r["status"] == "fitted" and r["name"] == entry["name"]
                and r[results.SPACE_SIZE] == size and r[quality_column] is not None
                and r[accuracy_column] is not None]
      x = np.array([r[quality_column] for r in fitted], float)
      y = np.array([r[accuracy_column] for r in fitted], float)
      low = x < R2_FLOOR
      color = colors[i % len(colors)]
      marker = phase_transition.MARKERS[i % len(phase_transition.MARKERS)]
      ax.scatter(x[~low], y[~low], s=16, color=color, marker=marker,
                 label=f"a replica, |O| = {size:,}")
      ax.scatter(np.full(low.sum(), R2_FLOOR), y[low], s=16, facecolors="none",
                 edgecolors=color, marker=marker,
                 label=f"a replica whose R² < {R2_FLOOR:g}, drawn at {R2_FLOOR:g}"
                 if low.any() and i == 0 else None)
    c = entry["test_only"]
    title = f"approximator family: {entry['name']}"
    if c["rho"] is not None:
      title += f"\nρ = {c['rho']:.2f}"
      if c["interval"]:
        title += f" [{c['interval'][0]:.2f}, {c['interval'][1]:.2f}]"
    ax.set_title(title + f", {c['num_points']} replicas", fontsize=8)
    ax.set_xlabel(f"test-only fit R² (hollow: < {R2_FLOOR:g})", fontsize=8)
    ax.set_xlim(R2_FLOOR - 0.08, 1.05)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
  for ax in grid[:, 0]:
    ax.set_ylabel(f"held-out object accuracy, 2-object scenes ({step} step)", fontsize=8)
  if sizes:
    axes[0].legend(fontsize=7, loc="upper left")
  fig.suptitle("Does a replica's binding function, fitted on its training objects, predict its "
               "held-out accuracy?\nρ: Spearman's rank correlation over replicas, with its 95% "
               "bootstrap interval", fontsize=9)
  paths = files.save_figures(fig, path_stem, formats, dpi=150)
  plt.close(fig)
  return paths
