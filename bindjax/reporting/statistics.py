"""Statistics of a sweep's report (docs/training.md, "Critical coverage and its interval").

ρ* of a curve is where a logistic fit acc(ρ) = sigmoid(k·(ρ − ρ*)) crosses 0.5. Every seed is
one replicate of the whole experiment (its own held-out objects, initialisation and data
order), so ρ* is fitted to each seed's curve alone, the estimate is the mean of those per-seed
values and its interval is the Student t interval over seeds. Across object-space sizes, ρ*(|O|)
is fitted by a power law and a log-linear law, with intervals from draws of every size's ρ*
within its own interval.
"""
import math

import numpy as np
from scipy import optimize
from scipy import stats

from bindjax.workdir import results

THRESHOLD = 0.5
LEVEL = 0.95
# The critical coverages the study reports (|O|, ρ*): about 50 % at |O| = 400 and about 30 % at
# |O| >= 2,500 (docs/targets.md); the scaling-law figure marks them as the study's.
STUDY_RHO_STARS = ((400, 0.5), (2500, 0.3))


def _sigmoid(x):
  return 0.5 * (1.0 + np.tanh(0.5 * x))


def fit_logistic(coverage, accuracy):
  """Least-squares fit of acc = sigmoid(k·(ρ − ρ*)); returns {"rho_star", "slope", "status"}.

  status: "fit"; "above" when every point is above 0.5 (ρ* below the smallest coverage,
  reported as None); "below" when none reaches 0.5 (ρ* beyond the largest coverage); "too_few"
  with fewer than two distinct coverages. A few starting slopes are tried.
  """
  x = np.asarray(coverage, dtype=float)
  y = np.clip(np.asarray(accuracy, dtype=float), 0.0, 1.0)
  keep = np.isfinite(x) & np.isfinite(y)
  x, y = x[keep], y[keep]
  if np.unique(x).size < 2:
    return {"rho_star": None, "slope": None, "status": "too_few"}
  if (y > THRESHOLD).all():
    return {"rho_star": None, "slope": None, "status": "above"}
  if (y < THRESHOLD).all():
    return {"rho_star": None, "slope": None, "status": "below"}
  # Start at the first coverage where the mean curve crosses 0.5.
  xs = np.unique(x)
  ys = np.array([y[x == v].mean() for v in xs])
  above = np.nonzero(ys >= THRESHOLD)[0]
  start_rho = xs[above[0]] if above.size else xs.mean()
  span = float(xs.max() - xs.min())

  def residuals(theta):
    rho, log_slope = theta
    return _sigmoid(np.exp(log_slope) * (x - rho)) - y

  def jacobian(theta):
    rho, log_slope = theta
    slope = np.exp(log_slope)
    p = _sigmoid(slope * (x - rho))
    dp = p * (1 - p)
    return np.stack([-slope * dp, slope * (x - rho) * dp], axis=1)

  lower, upper = [xs.min() - span, -5.0], [xs.max() + span, 12.0]
  starts = [(start_rho, np.log(k / span)) for k in (4.0, 20.0, 100.0)]
  best = None
  for x0 in starts:
    result = optimize.least_squares(residuals, x0=x0, jac=jacobian, bounds=(lower, upper))
    if best is None or result.cost < best.cost:
      best = result
  rho, log_slope = best.x
  return {"rho_star": float(rho), "slope": float(np.exp(log_slope)), "status": "fit"}


def seed_rho_stars(per_seed):
  """Each seed's own logistic fit of its curve: {seed: fit_logistic(...) dict}."""
  return {seed: fit_logistic([p[0] for p in pairs], [p[1] for p in pairs])
          for seed, pairs in sorted(per_seed.items())}


def t_interval(estimates, level=LEVEL):
  """Student t interval for the mean of independent per-seed estimates: (mean, [low, high], se).

  None for the interval and se with fewer than two estimates.
  """
  x = np.asarray(estimates, dtype=float)
  mean = float(x.mean())
  if x.size < 2:
    return mean, None, None
  se = float(x.std(ddof=1) / math.sqrt(x.size))
  half = float(stats.t.ppf(0.5 + level / 2, x.size - 1)) * se
  return mean, [mean - half, mean + half], se


def critical_coverages(series, level=LEVEL):
  """ρ* of every series: per-seed logistic fits, their mean and its t interval over seeds.

  A series in which some seed's curve never crosses 0.5 gets the logistic fit of all seeds'
  points pooled as its ρ* and no interval ("censored_seeds" lists those seeds): the per-seed
  values it would need lie outside the measured coverages.
  """
  table = []
  for s in series:
    pairs = [p for seed_pairs in s["per_seed"].values() for p in seed_pairs]
    pooled = fit_logistic([p[0] for p in pairs], [p[1] for p in pairs])
    per_seed = seed_rho_stars(s["per_seed"])
    censored = [seed for seed, fit in per_seed.items() if fit["status"] != "fit"]
    rho, interval, se = pooled["rho_star"], None, None
    if pooled["status"] == "fit" and not censored:
      rho, interval, se = t_interval([fit["rho_star"] for fit in per_seed.values()], level)
    table.append({"label": s["label"], **s["key"], "rho_star": rho, "interval": interval,
                  "standard_error": se, "level": level, "pooled_rho_star": pooled["rho_star"],
                  "slope": pooled["slope"], "status": pooled["status"],
                  "seed_rho_stars": {str(seed): fit["rho_star"] for seed, fit in per_seed.items()},
                  "censored_seeds": censored, "num_seeds": len(s["per_seed"]),
                  "coverages": [p["coverage"] for p in s["points"]]})
  return table


def fit_scaling_laws(space_sizes, rho_stars, num_concepts=None):
  """Fits ρ* = a·|O|^b (log-log) and ρ* = a + b·log10|O|; None with fewer than 3 sizes.

  Returns {"power_law": {"a", "b", "r2", "curve"}, "log_linear": {…}, "best": name}; "curve"
  ({"space_size", "rho_star"}) is the law over a log grid that spans the sizes. Given
  `num_concepts` (C of every size) with more than one C, also "concept_log_linear":
  ρ* = a + b·log10|O| + c·C (`fit_concept_law`), which asks whether C moves ρ* beyond what
  |O| = V^C says; it never competes for "best" (with three sizes it passes through them all).
  """
  n = np.asarray(space_sizes, dtype=float)
  rho = np.asarray(rho_stars, dtype=float)
  concepts = None if num_concepts is None else np.asarray(num_concepts, dtype=float)
  keep = np.isfinite(rho) & (rho > 0) & (n > 0)
  n, rho = n[keep], rho[keep]
  if np.unique(n).size < 3:
    return None
  formulas = {"power_law": "rho* = a * |O|^b", "log_linear": "rho* = a + b * log10|O|"}
  grid = _law_grid(n)
  laws = {}
  for name, (a, b) in _law_parameters(n, rho).items():
    laws[name] = {"formula": formulas[name], "a": a, "b": b,
                  "r2": _r2(rho, _law_value(name, a, b, n)),
                  "curve": {"space_size": grid.tolist(),
                            "rho_star": _law_value(name, a, b, grid).tolist()}}
  laws["best"] = max(("power_law", "log_linear"), key=lambda k: laws[k]["r2"])
  laws["num_points"] = int(n.size)
  if concepts is not None:
    concept_law = fit_concept_law(n, concepts[keep], rho)
    if concept_law:
      laws["concept_log_linear"] = concept_law
  return laws


def fit_concept_law(space_sizes, num_concepts, rho_stars):
  """Fits ρ* = a + b·log10|O| + c·C by least squares; None unless C varies and a, b, c are
  determined (a full-rank design: at least two sizes at one C, or three points in general).

  Returns {"formula", "a", "b", "c", "residual_dof", "r2", "curves": {C: {"space_size",
  "rho_star"}}}; residual_dof 0 means the law passes through every point, and only the points'
  own intervals (`scaling_law_intervals`) say how well c is known.
  """
  n = np.asarray(space_sizes, dtype=float)
  concepts = np.asarray(num_concepts, dtype=float)
  rho = np.asarray(rho_stars, dtype=float)
  design = _concept_design(n, concepts)
  if np.unique(concepts).size < 2 or np.linalg.matrix_rank(design) < 3:
    return None
  a, b, c = _concept_parameters(design, rho)
  grid = _law_grid(n)
  return {"formula": "rho* = a + b * log10|O| + c * C", "a": a, "b": b, "c": c,
          "residual_dof": int(n.size - 3), "r2": _r2(rho, design @ np.array([a, b, c])),
          "curves": {str(int(k)): {"space_size": grid.tolist(),
                                   "rho_star": (a + b * np.log10(grid) + c * k).tolist()}
                     for k in np.unique(concepts)}}


def _concept_design(n, concepts):
  return np.stack([np.ones_like(n), np.log10(n), concepts], axis=1)


def _concept_parameters(design, rho):
  a, b, c = np.linalg.lstsq(design, rho, rcond=None)[0]
  return float(a), float(b), float(c)


def _law_parameters(n, rho):
  """(a, b) of both laws fitted to sizes n and critical coverages rho (all positive)."""
  b_power, log_a = np.polyfit(np.log(n), np.log(rho), 1)
  b_linear, a_linear = np.polyfit(np.log10(n), rho, 1)
  return {"power_law": (float(np.exp(log_a)), float(b_power)),
          "log_linear": (float(a_linear), float(b_linear))}


def _law_grid(n):
  """The sizes a law is drawn over: a log grid from a little below the measured sizes to a
  little beyond them and the study's reported sizes (`STUDY_RHO_STARS`), so the figure shows
  where the law, extrapolated, puts them."""
  largest = max(n.max(), max(size for size, _ in STUDY_RHO_STARS))
  return np.logspace(np.log10(n.min()) - 0.1, np.log10(largest) + 0.1, 60)


def _law_value(name, a, b, n):
  return a * n ** b if name == "power_law" else a + b * np.log10(n)


def scaling_law_intervals(rows, laws, num_draws=1000, seed=0, level=LEVEL, predict_at=()):
  """Intervals of the laws' parameters, and a band of ρ*(|O|), from draws of every size's ρ*.

  Each draw replaces every size's ρ* by ρ* + se·t (t Student-distributed with that size's seeds
  − 1 degrees of freedom, the distribution its interval comes from) and refits the laws. Adds
  "a_interval", "b_interval" and "band" ({"space_size", "low", "high"} over a log grid) to both
  size laws of `laws` in place, and "a_interval", "b_interval", "c_interval" to its
  "concept_log_linear"; returns `laws`. Nothing is added when a size has no interval.

  predict_at: (|O|, C) pairs of sizes not yet run. Adds "predictions": per pair, each law's
  ρ* there and its range over the same refits, so that a prediction is committed before the
  size runs and its hit or miss read afterwards.
  """
  if not laws or any(r["standard_error"] is None for r in rows):
    return laws
  n = np.array([r[results.SPACE_SIZE] for r in rows], dtype=float)
  rho = np.array([r["rho_star"] for r in rows], dtype=float)
  se = np.array([r["standard_error"] for r in rows], dtype=float)
  dof = np.array([r["num_seeds"] - 1 for r in rows], dtype=float)
  rng = np.random.default_rng(seed)
  draws = rho + se * rng.standard_t(dof, size=(num_draws, n.size))
  draws = draws[(draws > 0).all(axis=1)]
  grid = _law_grid(n)
  q = [50 * (1 - level), 100 - 50 * (1 - level)]
  fitted = [_law_parameters(n, d) for d in draws]
  predictions = [{results.SPACE_SIZE: int(size), results.NUM_CONCEPTS: int(concepts)}
                 for size, concepts in predict_at]
  for name in ("power_law", "log_linear"):
    ab = np.array([f[name] for f in fitted])
    curves = np.array([_law_value(name, a, b, grid) for a, b in ab])
    laws[name]["a_interval"] = np.percentile(ab[:, 0], q).tolist()
    laws[name]["b_interval"] = np.percentile(ab[:, 1], q).tolist()
    low, high = np.percentile(curves, q, axis=0)
    laws[name]["band"] = {"space_size": grid.tolist(), "low": low.tolist(),
                          "high": high.tolist()}
    for p in predictions:
      at = float(p[results.SPACE_SIZE])
      p[name] = {"rho_star": float(_law_value(name, laws[name]["a"], laws[name]["b"], at)),
                 "range": np.percentile([_law_value(name, a, b, at) for a, b in ab],
                                        q).tolist()}
  if "concept_log_linear" in laws:
    law = laws["concept_log_linear"]
    design = _concept_design(n, np.array([r[results.NUM_CONCEPTS] for r in rows], dtype=float))
    abc = np.array([_concept_parameters(design, d) for d in draws])
    for i, name in enumerate("abc"):
      law[f"{name}_interval"] = np.percentile(abc[:, i], q).tolist()
    for p in predictions:
      x = _concept_design(np.array([float(p[results.SPACE_SIZE])]),
                          np.array([float(p[results.NUM_CONCEPTS])]))[0]
      p["concept_log_linear"] = {
          "rho_star": float(x @ np.array([law["a"], law["b"], law["c"]])),
          "range": np.percentile(abc @ x, q).tolist()}
  if predictions:
    laws["predictions"] = predictions
  laws["num_draws"] = int(draws.shape[0])
  return laws


def _r2(y, y_hat):
  total = float(((y - y.mean()) ** 2).sum())
  return 1.0 - float(((y - y_hat) ** 2).sum()) / total if total > 0 else 1.0
