"""Progress bars of host-driven compiled loops: tqdm on stderr, set up as the sweep's bar is.

The newest bar is remembered (`position`), so a command stopped by Ctrl-C can say how far it got.
"""
import sys

import numpy as np
from tqdm import tqdm

_newest = []


class _Bar(tqdm):
  """A tqdm bar that knows its position even when disabled (a disabled tqdm keeps none)."""

  def __init__(self, *, total, unit, initial=0, **kwargs):
    super().__init__(total=total, unit=unit, initial=initial, **kwargs)
    self.done, self.planned, self.unit_name = initial, total, unit

  def update(self, n=1):
    self.done += n
    return super().update(n)


def bar(total, unit, enabled=True, initial=0):
  """A tqdm bar on stderr over `total` units (from `initial`), remembered as the newest bar."""
  new = _Bar(total=total, initial=initial, unit=unit, unit_scale=True, dynamic_ncols=True,
             disable=not enabled, file=sys.stderr, mininterval=1.0)
  _newest[:] = [new]
  return new


def forget():
  """Forgets the newest bar (a command starting in a process that ran another)."""
  _newest.clear()


def position():
  """(units done, total, unit) of the newest bar, whether or not it is closed; None before any."""
  if not _newest:
    return None
  newest = _newest[0]
  return int(newest.done), int(newest.planned), newest.unit_name


def loss_bar(total, unit, enabled=True):
  """(tqdm bar over `total` units, callback(units_done, loss_M)) for a loop whose compiled chunks
  report one training loss per model: the callback advances the bar by units_done × M and shows
  the median loss (NaN-aware). The caller closes the bar."""
  loss_bar_ = bar(total, unit, enabled)

  def advance(units_done, loss_M):
    loss_M = np.atleast_1d(np.asarray(loss_M, np.float64))
    loss_bar_.update(units_done * len(loss_M))
    median = np.nanmedian(loss_M) if np.isfinite(loss_M).any() else float("nan")
    loss_bar_.set_postfix({"train_loss": f"{median:.4g}"}, refresh=False)

  return loss_bar_, advance
