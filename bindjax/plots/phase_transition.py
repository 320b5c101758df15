"""Phase-transition figure: held-out accuracy vs coverage, one line per object-space size."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)

from bindjax import files  # noqa: E402

PANELS = (
    ("heldout/object_accuracy_{K}obj", "held-out objects, max-object scenes"),
    ("heldout/binding", "held-out binding figure"),
    ("train/object_accuracy_{K}obj", "training objects, max-object scenes"),
    ("train/binding", "training binding figure"),
    ("heldout/object_accuracy_1obj", "held-out objects, 1-object scenes"),
)


def plot(series, critical, path_stem, step="best", formats=("png", "pdf"),
         rho_metric=PANELS[0][0]):
  """Draws the panels (mean ± std over seeds, dots per seed) and saves them.

  series: `bindjax.report.aggregate` output holding every panel's metric; critical:
  `critical_coverages` rows in the same order, drawn (dashed ρ*) on the `rho_metric` panel.
  Returns the written file paths.
  """
  fig, axes = plt.subplots(1, len(PANELS), figsize=(3.6 * len(PANELS), 3.4), sharey=True,
                           constrained_layout=True)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, (s, crit) in enumerate(zip(series, critical)):
    color = colors[i % len(colors)]
    for ax, (metric, title) in zip(axes, PANELS):
      xs, mean, low, high = [], [], [], []
      for p in s["points"]:
        m = p.get(metric)
        if m is None or m["mean"] is None:
          continue
        xs.append(p["coverage"])
        mean.append(m["mean"])
        low.append(m["mean"] - m["std"])
        high.append(m["mean"] + m["std"])
        values = [v for v in m["values"] if v is not None]
        ax.scatter([p["coverage"]] * len(values), values, s=8, color=color, alpha=0.35,
                   linewidths=0)
      label = s["label"] if ax is axes[0] else None
      ax.plot(xs, mean, "-o", color=color, markersize=3, label=label)
      ax.fill_between(xs, low, high, color=color, alpha=0.15, linewidth=0)
      if metric == rho_metric and crit["rho_star"] is not None:
        ax.axvline(crit["rho_star"], color=color, linestyle="--", linewidth=1)
        if crit["interval"]:
          ax.axvspan(*crit["interval"], color=color, alpha=0.07)
  for ax, (_, title) in zip(axes, PANELS):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("coverage ρ")
    ax.set_ylim(-0.02, 1.02)
    ax.axhline(0.5, color="0.7", linewidth=0.6, zorder=0)
    ax.grid(alpha=0.3)
  axes[0].set_ylabel(f"accuracy ({step} step)")
  axes[0].legend(fontsize=7, loc="upper left")
  paths = files.save_figures(fig, path_stem, formats, dpi=150)
  plt.close(fig)
  return paths
