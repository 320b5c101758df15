"""Progress bars of host-driven compiled loops: tqdm on stderr, set up as the sweep's bar is."""
import sys

import numpy as np
from tqdm import tqdm


def loss_bar(total, unit, enabled=True):
  """(tqdm bar over `total` units, callback(units_done, loss_M)) for a loop whose compiled chunks
  report one training loss per model: the callback advances the bar by units_done × M and shows
  the median loss (NaN-aware). The caller closes the bar."""
  bar = tqdm(total=total, unit=unit, unit_scale=True, dynamic_ncols=True, disable=not enabled,
             file=sys.stderr, mininterval=1.0)

  def advance(units_done, loss_M):
    loss_M = np.atleast_1d(np.asarray(loss_M, np.float64))
    bar.update(units_done * len(loss_M))
    median = np.nanmedian(loss_M) if np.isfinite(loss_M).any() else float("nan")
    bar.set_postfix({"train_loss": f"{median:.4g}"}, refresh=False)

  return bar, advance
