"""Phase-transition figure (held-out accuracy vs coverage, one line per object-space size) and
scaling-law figure (critical coverage vs |O|).

Each figure explains itself: a legend names every mark (seed mean, the band over seeds, single
seeds, ρ* and its interval, the fitted law and where it is extrapolated, the study's reported
values), the title says what was run in words, and the colours are the Okabe-Ito palette, which
stays distinct under the common colour-vision deficiencies, each series with its own line style
and marker so that none hides another. Metric definitions: docs/objectives.md
("set-separation accuracy", "binding figure").
"""
import textwrap

import numpy as np

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
from matplotlib import lines as mlines  # noqa: E402
from matplotlib import patches as mpatches  # noqa: E402
from matplotlib import ticker  # noqa: E402

from bindjax.base import files  # noqa: E402
from bindjax.workdir import results  # noqa: E402

PANELS = (
    (results.object_accuracy(results.HELDOUT, results.ROW_K),
     "held-out objects: accuracy, scenes of K objects"),
    (results.binding(results.HELDOUT), "held-out objects: binding figure"),
    (results.object_accuracy(results.TRAIN, results.ROW_K),
     "training objects: accuracy, scenes of K objects"),
    (results.binding(results.TRAIN), "training objects: binding figure"),
    (results.object_accuracy(results.HELDOUT, 1), "held-out objects: accuracy, 1-object scenes"),
)
# Okabe & Ito's palette (black first), distinct for the common colour-vision deficiencies.
PALETTE = ("#000000", "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9",
           "#F0E442")
LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P")
DEFINITIONS = (
    "accuracy (set separation): the share of scenes that score every object they hold above "
    "every object they do not; K: the most objects a scene holds; binding figure: on 2-object "
    "scenes whose objects differ in every concept, the share that score both objects above "
    "every object mixing their concepts (chance 1/6 at C = 2); docs/objectives.md")
TITLE_WIDTH = 70  # characters of a title across the scaling-law figure


def _style(i):
  """(colour, line style, marker) of the i-th series."""
  return (PALETTE[i % len(PALETTE)], LINE_STYLES[i % len(LINE_STYLES)],
          MARKERS[i % len(MARKERS)])


def _save(fig, path_stem, formats):
  paths = files.save_figures(fig, path_stem, formats, dpi=150)
  plt.close(fig)
  return paths


def plot(series, critical, path_stem, step="final", formats=("png", "pdf"),
         rho_metric=PANELS[0][0], title=None, level=0.95):
  """Draws the panels (seed mean, ± 1 s.d. band, single seeds) and a legend panel; saves them.

  series: `bindjax.reporting.report.aggregate` output holding every panel's metric; critical:
  `bindjax.reporting.statistics.critical_coverages` rows in the same order, drawn (dashed ρ*,
  shaded `level` interval) on the `rho_metric` panel. title: the figure's title in words.
  Returns the written paths.
  """
  fig, grid = plt.subplots(2, 3, figsize=(11.0, 6.6), sharey=True, constrained_layout=True)
  axes, key = list(grid.flat[:len(PANELS)]), grid.flat[len(PANELS)]
  handles = []
  for i, (s, crit) in enumerate(zip(series, critical)):
    color, style, marker = _style(i)
    for ax, (metric, _) in zip(axes, PANELS):
      _draw_series(ax, s, metric, color, style, marker)
      if metric == rho_metric and crit["rho_star"] is not None:
        ax.axvline(crit["rho_star"], color=color, linestyle=(0, (4, 2)), linewidth=1.2)
        if crit["interval"]:
          ax.axvspan(*crit["interval"], color=color, alpha=0.1, linewidth=0)
    handles.append(mlines.Line2D([], [], color=color, linestyle=style, marker=marker,
                                 markersize=4, label=f"{s['label']}: mean over seeds"))
  for ax, (metric, panel_title) in zip(axes, PANELS):
    ax.set_title(panel_title + (" (ρ* read here)" if metric == rho_metric else ""),
                 fontsize=9)
    ax.set_xlabel("coverage ρ (share of objects trained on)", fontsize=8)
    ax.set_ylim(-0.02, 1.02)
    ax.axhline(0.5, color="0.55", linewidth=0.7, zorder=0, linestyle=":")
    ax.grid(alpha=0.3)
  for ax in grid[:, 0]:
    ax.set_ylabel(f"score at {'' if isinstance(step, int) else 'the '}"
                  f"{results.step_name(step)}")
  grey = "0.35"
  handles += [
      mpatches.Patch(color=grey, alpha=0.25, label="band: mean ± 1 s.d. over seeds"),
      mlines.Line2D([], [], color=grey, marker="o", linestyle="", markersize=3, alpha=0.5,
                    label="dots: single seeds"),
      mlines.Line2D([], [], color=grey, linestyle=(0, (4, 2)),
                    label="ρ*: coverage where the seeds' logistic fits cross 0.5 (mean)"),
      mpatches.Patch(color=grey, alpha=0.2,
                     label=f"shade: ρ*'s {level:.0%} t interval over seeds"),
      mlines.Line2D([], [], color="0.55", linestyle=":", label="0.5: the level that defines ρ*"),
  ]
  key.axis("off")
  key.legend(handles=handles, loc="upper left", fontsize=7.5, frameon=False)
  key.text(0.0, 0.02, textwrap.fill(DEFINITIONS, 62), fontsize=7, color="0.3",
           transform=key.transAxes, va="bottom")
  if title:
    fig.suptitle(textwrap.fill(title, width=2 * TITLE_WIDTH), fontsize=11)
  return _save(fig, path_stem, formats)


def _draw_series(ax, s, metric, color, style, marker):
  """One series on one panel: its seeds as dots, their mean as a line, ± 1 s.d. as a band."""
  xs, mean, std = [], [], []
  for p in s["points"]:
    m = p.get(metric)
    if m is None or m["mean"] is None:
      continue
    xs.append(p["coverage"])
    mean.append(m["mean"])
    std.append(m["std"])
    values = [v for v in m["values"] if v is not None]
    ax.scatter([p["coverage"]] * len(values), values, s=9, color=color, alpha=0.4,
               linewidths=0)
  mean, std = np.array(mean), np.array(std)
  ax.plot(xs, mean, linestyle=style, marker=marker, color=color, markersize=3.5, linewidth=1.3)
  ax.fill_between(xs, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)


def plot_scaling_law(critical, laws, path_stem, title=None, formats=("png", "pdf"),
                     study_points=(), level=0.95, groups=None):
  """ρ* with its interval against |O| (log axis; marker per number of concepts C), the best
  scaling law, solid over the measured sizes and dashed where extrapolated, with its band
  whole; the law with a term in C (one line per C) when `laws` has it; and the study's reported
  values (`study_points`: (|O|, ρ*) pairs) marked as the study's. `groups`, instead of
  critical and laws: [(label, critical rows, laws or None)], one law per kind of towers, each
  in its own colour. Returns the written paths."""
  fig, ax = plt.subplots(figsize=(6.4, 5.4) if groups is None else (7.6, 7.4),
                         constrained_layout=True)
  top = 1.0
  for g, (label, rows, group_laws) in enumerate(groups or [(None, critical, laws)]):
    top = max(top, _draw_law_group(ax, label, rows, group_laws, level,
                                   None if groups is None else PALETTE[(g + 1) % len(PALETTE)],
                                   first=g == 0))
  if study_points:
    n, rho = zip(*study_points)
    ax.scatter(n, rho, marker="*", s=110, facecolors="none", edgecolors=PALETTE[4], zorder=4,
               label="the study's reported ρ* (Uselis et al.): |O| = 400 ≈ 0.5, "
                     "|O| ≥ 2,500 ≈ 0.3")
  ax.set_xscale("log")
  ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:,.0f}"))
  ax.xaxis.set_minor_formatter(ticker.NullFormatter())
  ax.set_xlabel("object-space size |O| (log scale)")
  ax.set_ylabel("critical coverage ρ*")
  ax.set_ylim(0, top + 0.02)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False)
  if title:
    ax.set_title(textwrap.fill(title, width=TITLE_WIDTH), fontsize=9)
  return _save(fig, path_stem, formats)


def _draw_law_group(ax, label, critical, laws, level, color, first):
  """One kind of towers' measured ρ* and its laws; `color` None: points coloured by C and the
  law in its own colour (a figure of one kind). The legend's entries for what every group
  shares (band, extrapolation) come with the `first`. Returns the highest value drawn."""
  prefix = f"{label}:\n" if label else ""
  sizes = np.array([r[results.SPACE_SIZE] for r in critical], dtype=float)
  measured = (sizes.min(), sizes.max())
  concepts = sorted({r[results.NUM_CONCEPTS] for r in critical})
  top = 1.0
  for i, c in enumerate(concepts):
    rows = [r for r in critical if r[results.NUM_CONCEPTS] == c]
    n = np.array([r[results.SPACE_SIZE] for r in rows], dtype=float)
    rho = np.array([r["rho_star"] for r in rows])
    low = np.array([r["rho_star"] - r["interval"][0] if r["interval"] else 0 for r in rows])
    high = np.array([r["interval"][1] - r["rho_star"] if r["interval"] else 0 for r in rows])
    ax.errorbar(n, rho, yerr=[low, high], fmt=MARKERS[i % len(MARKERS)], capsize=3,
                color=color or PALETTE[i], zorder=3,
                label=f"{prefix}ρ* measured, C = {c}" + (
                    "" if label else f": mean over seeds, {level:.0%} t interval"))
  if not laws:
    return top
  law = laws[laws["best"]]
  law_color = color or PALETTE[2]
  if "band" in law:
    band = law["band"]
    ax.fill_between(band["space_size"], band["low"], band["high"], color=law_color, alpha=0.15,
                    linewidth=0, label=None if not first else
                    f"shade: {level:.0%} band of {'each' if label else 'the'} law (refits to "
                    "draws of ρ*)")
    top = max(top, float(np.max(band["high"])))
  formula = law["formula"].replace("rho*", "ρ*")
  _solid_inside(ax, law["curve"]["space_size"], law["curve"]["rho_star"], measured, law_color,
                f"{prefix}fit: {formula}, b = {law['b']:.3g}",
                "dashed: a law extrapolated beyond the measured sizes" if first else None)
  # Several kinds of towers in one figure: their laws in |O| alone, to stay readable.
  concept_law = None if label else laws.get("concept_log_linear")
  for c, curve in (concept_law or {}).get("curves", {}).items():
    i = concepts.index(int(c)) if int(c) in concepts else 0
    _solid_inside(ax, curve["space_size"], curve["rho_star"], measured, color or PALETTE[i],
                  f"{prefix}fit: ρ* = a + b·log10|O| + c·C at C = {c} "
                  f"(c = {concept_law['c']:.3g})", None, linewidth=0.9)
  return top


def _solid_inside(ax, x, y, span, color, label, outside_label, linewidth=1.5):
  """Draws y(x) solid over `span` (low, high) and dashed outside it."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  # Each part runs exactly to the smallest or largest measured size, so the parts meet.
  parts = ((np.concatenate([[span[0]], x[(x > span[0]) & (x < span[1])], [span[1]]]), "-"),
           (np.concatenate([x[x < span[0]], [span[0]]]), "--"),
           (np.concatenate([[span[1]], x[x > span[1]]]), "--"))
  for xs, style in parts:
    if len(xs) < 2:
      continue
    ys = np.interp(np.log(xs), np.log(x), y)
    ax.plot(xs, ys, color=color, linewidth=linewidth, linestyle=style,
            label=label if style == "-" else outside_label)
    if style == "--":
      outside_label = None
