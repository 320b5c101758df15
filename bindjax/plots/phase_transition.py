"""Phase-transition figure (held-out accuracy vs coverage, one line per object-space size) and
scaling-law figure (critical coverage vs |O|).

Metric definitions: docs/objectives.md ("set-separation accuracy", "binding").
"""
import textwrap

import numpy as np

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)

from bindjax import files  # noqa: E402
from bindjax import results  # noqa: E402

PANELS = (
    (results.object_accuracy(results.HELDOUT, results.ROW_K),
     "held-out objects: accuracy, most-object scenes"),
    (results.binding(results.HELDOUT), "held-out objects: binding score"),
    (results.object_accuracy(results.TRAIN, results.ROW_K),
     "training objects: accuracy, most-object scenes"),
    (results.binding(results.TRAIN), "training objects: binding score"),
    (results.object_accuracy(results.HELDOUT, 1), "held-out objects: accuracy, 1-object scenes"),
)


TITLE_WIDTH = 60  # characters of a 9-point title across the scaling-law figure


def _save(fig, path_stem, formats):
  paths = files.save_figures(fig, path_stem, formats, dpi=150)
  plt.close(fig)
  return paths


def plot(series, critical, path_stem, step="final", formats=("png", "pdf"),
         rho_metric=PANELS[0][0], title=None):
  """Draws the panels (mean ± std over seeds, dots per seed) and saves them.

  series: `bindjax.report.aggregate` output holding every panel's metric; critical:
  `critical_coverages` rows in the same order, drawn (dashed ρ*, shaded interval) on the
  `rho_metric` panel. title: the figure's title (run, sizes, step). Returns the written paths.
  """
  fig, axes = plt.subplots(1, len(PANELS), figsize=(3.6 * len(PANELS), 3.4), sharey=True,
                           constrained_layout=True)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, (s, crit) in enumerate(zip(series, critical)):
    color = colors[i % len(colors)]
    for ax, (metric, _) in zip(axes, PANELS):
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
  for ax, (_, panel_title) in zip(axes, PANELS):
    ax.set_title(panel_title, fontsize=10)
    ax.set_xlabel("coverage ρ")
    ax.set_ylim(-0.02, 1.02)
    ax.axhline(0.5, color="0.6", linewidth=0.6, zorder=0, linestyle=":")
    ax.grid(alpha=0.3)
  axes[0].annotate("0.5: ρ* threshold", (0.02, 0.5), xycoords=("axes fraction", "data"),
                   xytext=(0, 2), textcoords="offset points", fontsize=7, color="0.4")
  axes[0].set_ylabel(f"score ({step} step)")
  axes[0].legend(fontsize=7, loc="upper left")
  if title:
    fig.suptitle(title, fontsize=11)
  return _save(fig, path_stem, formats)


def plot_scaling_law(critical, laws, path_stem, title=None, formats=("png", "pdf")):
  """ρ* with its interval against |O| (log axis; marker per number of concepts C), the best
  scaling law with its band when `laws` holds one, and the law with a term in C (dashed, one
  line per C) when it has that. Returns the written paths."""
  fig, ax = plt.subplots(figsize=(4.6, 3.6), constrained_layout=True)
  markers = {2: "o", 3: "s", 4: "^"}
  for c in sorted({r[results.NUM_CONCEPTS] for r in critical}):
    rows = [r for r in critical if r[results.NUM_CONCEPTS] == c]
    n = np.array([r[results.SPACE_SIZE] for r in rows], dtype=float)
    rho = np.array([r["rho_star"] for r in rows])
    low = np.array([r["rho_star"] - r["interval"][0] if r["interval"] else 0 for r in rows])
    high = np.array([r["interval"][1] - r["rho_star"] if r["interval"] else 0 for r in rows])
    ax.errorbar(n, rho, yerr=[low, high], fmt=markers.get(c, "D"), capsize=3,
                label=f"C = {c}", color="k" if c == 2 else "tab:blue")
  if laws:
    law = laws[laws["best"]]
    if "band" in law:
      band = law["band"]
      ax.fill_between(band["space_size"], band["low"], band["high"], color="tab:orange",
                      alpha=0.2, linewidth=0)
    ax.plot(law["curve"]["space_size"], law["curve"]["rho_star"], color="tab:orange",
            label=f"{law['formula']}, b = {law['b']:.3g}")
    concept_law = laws.get("concept_log_linear")
    for c, curve in (concept_law or {}).get("curves", {}).items():
      ax.plot(curve["space_size"], curve["rho_star"], linestyle="--", linewidth=0.9,
              color="k" if c == "2" else "tab:blue",
              label=f"a + b·log10|O| + c·C at C = {c} (c = {concept_law['c']:.3g})")
  ax.set_xscale("log")
  ax.set_xlabel("object-space size |O|")
  ax.set_ylabel("critical coverage ρ*")
  ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  if title:
    # The figure is narrow: a report of several sweeps names them all, so wrap rather than crop.
    ax.set_title(textwrap.fill(title, width=TITLE_WIDTH), fontsize=9)
  return _save(fig, path_stem, formats)
