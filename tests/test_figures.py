"""The report's figures explain themselves: legends name every mark, titles say what was run in
words, ticks read as numbers, and no figure is wider than 2.5:1."""
import os

import matplotlib
import numpy as np
import pytest

from bindjax.base import files
from bindjax.reporting.plots import binding_fits
from bindjax.reporting import report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOUR_SIZES = [os.path.join(REPO, "docs", "findings", "scaling_law", name)
              for name in ("cpu", "cpu_c3", "cpu_144", "cpu_196")]


@pytest.fixture
def figures(monkeypatch):
  """The figures the plots would save, by file stem, instead of saving them."""
  drawn = {}

  def keep(fig, path_stem, formats, **savefig_kwargs):
    del formats, savefig_kwargs
    drawn[os.path.basename(str(path_stem))] = fig
    return []
  monkeypatch.setattr(files, "save_figures", keep)
  yield drawn
  matplotlib.pyplot.close("all")


def _legend_texts(fig):
  return [t.get_text() for ax in fig.axes if ax.get_legend()
          for t in ax.get_legend().get_texts()]


def _width_over_height(fig):
  width, height = fig.get_size_inches()
  return width / height


def test_the_phase_transition_figure_names_every_mark(figures, tmp_path):
  report.make_report(FOUR_SIZES, out_dir=str(tmp_path), num_draws=50, formats=("png",))
  fig = figures["phase_transition"]
  legend = _legend_texts(fig)
  for size in ("|O|=100", "|O|=125", "|O|=144", "|O|=196"):
    assert any(text.startswith(size) and "mean over seeds" in text for text in legend), size
  for entry in ("band: mean ± 1 s.d. over seeds", "dots: single seeds",
                "ρ*: coverage where the seeds' logistic fits cross 0.5",
                "shade: ρ*'s 95% t interval over seeds", "0.5: the level that defines ρ*"):
    assert any(text.startswith(entry) for text in legend), entry
  title = fig.get_suptitle()
  assert "|O| = 100, 144, 196 (C = 2) and 125 (C = 3)" in title.replace("\n", " ")
  assert "product read-out" in title and "cpu_" not in title
  assert _width_over_height(fig) <= 2.5


def test_the_scaling_law_figure_names_the_fit_its_band_extrapolation_and_the_study(
    figures, tmp_path):
  report.make_report(FOUR_SIZES, out_dir=str(tmp_path), num_draws=50, formats=("png",))
  fig = figures["scaling_law"]
  legend = _legend_texts(fig)
  for entry in ("shade: 95% band of the law", "fit: ρ* = a * |O|^b", "dashed: a law extrapolated",
                "the study's reported ρ*", "ρ* measured, C = 2: mean over seeds, 95% t interval",
                "ρ* measured, C = 3"):
    assert any(text.startswith(entry) for text in legend), (entry, legend)
  (ax,) = fig.axes
  # The band is whole: the axis reaches its top.
  band = next(c for c in ax.collections if isinstance(c, matplotlib.collections.PolyCollection))
  assert ax.get_ylim()[1] >= band.get_paths()[0].vertices[:, 1].max()
  # The fit is solid exactly over the measured sizes, 100 to 196.
  solid = next(line for line in ax.get_lines() if line.get_label().startswith("fit: ρ* = a *"))
  assert solid.get_linestyle() == "-"
  assert np.allclose([solid.get_xdata()[0], solid.get_xdata()[-1]], [100, 196])
  fig.canvas.draw()
  ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
  assert ticks and all(t.replace(",", "").isdigit() for t in ticks), ticks
  assert {"100", "1,000"} <= set(ticks)
  assert _width_over_height(fig) <= 2.5


def test_the_binding_fits_figure_stays_within_its_aspect(figures, tmp_path):
  rows = [{"status": "fitted", "name": name, "space_size": 100, "r2": r2, "acc": acc}
          for name in ("additive", "sum_product", "mlp[128]", "product")
          for r2, acc in ((0.5, 0.6), (-3.0, 0.1), (0.9, 0.95))]
  correlations = [{"name": name, "test_only": {"rho": 0.8, "interval": [0.5, 0.9],
                                               "num_points": 3}}
                  for name in ("additive", "sum_product", "mlp[128]", "product")]
  binding_fits.plot(rows, correlations, tmp_path / "binding_fits", "final", "acc", "r2")
  fig = figures["binding_fits"]
  legend = _legend_texts(fig)
  assert "a replica, |O| = 100" in legend and any("drawn at -1" in t for t in legend)
  assert _width_over_height(fig) <= 2.5
