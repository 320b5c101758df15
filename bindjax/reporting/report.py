"""Phase-transition report of a coverage sweep: figure, critical coverage ρ*, scaling law.

Reads the rows that `bindjax.training.sweep` appends to WORKDIR/results.jsonl, picks one evaluation per
replica (by default its final step, which selects nothing on held-out objects; "best" picks the
step of highest held-out accuracy and is optimistic), and fits, per object-space size |O|, a
logistic curve acc(ρ) = sigmoid(k·(ρ − ρ*)) to held-out object accuracy on scenes with the
maximum number of objects (binding is needed there; one-object scenes are reported apart since
matching concepts alone solves them). ρ* is where the curve crosses 0.5.

Statistics (docs/training.md, "Critical coverage and its interval"): every seed is one replicate
of the whole experiment (its own held-out objects, initialisation and data order), so ρ* is fitted
to each seed's curve alone, the estimate is the mean of those per-seed values and its interval is
the Student t interval over seeds, which holds its level with few seeds where a bootstrap over
2–4 seeds does not. With three or more sizes, ρ*(|O|) is fitted by a power law and by a
log-linear law, with intervals from draws of every size's ρ* within its own interval.

Outputs, in WORKDIR/report/: phase_transition.png/.pdf, scaling_law.png/.pdf (two or more sizes
with a ρ*), critical_coverage.md/.json, points.json (the aggregated curves).
"""
import collections
import math
import os

import numpy as np
from scipy import optimize
from scipy import stats

from bindjax.base import files
from bindjax.workdir import results

# Metric names of bindjax.training.train.eval_step; results.ROW_K stands for each row's K (the maximum
# number of objects per scene).
BINDING_METRIC = results.object_accuracy(results.HELDOUT, results.ROW_K)
ONE_OBJECT_METRIC = results.object_accuracy(results.HELDOUT, 1)
CONCEPT_METRIC = results.concept_accuracy(results.HELDOUT)
# ρ* may be read off either held-out figure (docs/objectives.md#binding): set-separation accuracy
# on max-object scenes, or the binding figure (both objects above every cross object).
RHO_METRICS = {"accuracy": BINDING_METRIC, "binding": results.binding(results.HELDOUT)}
# Every metric the report aggregates and draws (the ρ* metric first).
REPORT_METRICS = (BINDING_METRIC, results.binding(results.HELDOUT),
                  results.object_accuracy(results.TRAIN, results.ROW_K),
                  results.binding(results.TRAIN), ONE_OBJECT_METRIC, CONCEPT_METRIC)
THRESHOLD = 0.5
LEVEL = 0.95
# The critical coverages the study reports (|O|, ρ*): about 50 % at |O| = 400 and about 30 % at
# |O| >= 2,500 (docs/targets.md); the scaling-law figure marks them as the study's.
STUDY_RHO_STARS = ((400, 0.5), (2500, 0.3))
READOUT_WORDS = {"none": "plain towers", "both": "product read-out",
                 "query": "product read-out in the query tower"}
# Which sweep a row came from, set only when several sweeps are reported and two of them hold
# the same series: their configs may differ outside the rows (a model setting, the steps).
SWEEP = "sweep"
# Replica settings that are not seeds: replicas differing only in seed are averaged; any other
# difference besides coverage makes a separate curve.
SERIES_KEYS = (results.NUM_CONCEPTS, results.NUM_VALUES, results.MAX_OBJECTS, results.SPACE_SIZE,
               results.MODEL, results.LEARNING_RATE, results.WEIGHT_DECAY, SWEEP)
# Settings a label never lists as varying: |O|, C and V open every label, K goes with the space.
LABEL_KEYS = (results.NUM_CONCEPTS, results.NUM_VALUES, results.MAX_OBJECTS, results.SPACE_SIZE)


def series_label(key):
  """Legend text of a series: |O| with (C, V), plus any non-default hyperparameters."""
  values = dict(zip(SERIES_KEYS, key))
  v = values[results.NUM_VALUES]
  v = "×".join(map(str, v)) if isinstance(v, (list, tuple)) else v
  label = f"|O|={values[results.SPACE_SIZE]:,} (C={values[results.NUM_CONCEPTS]}, V={v})"
  return label


def aggregate(selected, metrics=(BINDING_METRIC, ONE_OBJECT_METRIC, CONCEPT_METRIC)):
  """Groups selected rows into series (one per setting) and coverage points over seeds.

  Returns a list of dicts sorted by |O|: {"key", "label", "space_size", "points": [{"coverage",
  "seeds", "steps", "heldout_objects", "diverged", "fitted" (False: at most K held-out objects,
  left out of the ρ* fits), metric: {"mean", "std", "min", "max",
  "values"}}], "per_seed": {seed: [(coverage, value of metrics[0])]}}.
  """
  series = collections.defaultdict(lambda: collections.defaultdict(list))
  for row in selected:
    key = _series_key(row)
    series[key][float(row[results.COVERAGE])].append(row)
  out = []
  varying = _varying_keys(series.keys())
  for key in sorted(series, key=lambda k: tuple(map(str, k))):
    points = []
    per_seed = collections.defaultdict(list)
    for coverage in sorted(series[key]):
      rows = series[key][coverage]
      point = {"coverage": coverage, "seeds": [r[results.SEED] for r in rows],
               "steps": [r[results.STEP] for r in rows],
               "heldout_objects": sorted({r[results.SPACE_SIZE] - r[results.NUM_TRAIN_OBJECTS]
                                          for r in rows if results.NUM_TRAIN_OBJECTS in r}),
               "diverged": sum(bool(r.get(results.DIVERGED)) for r in rows)}
      for metric in metrics:
        values = [results.metric_value(r, metric) for r in rows]
        values = np.array([np.nan if v is None else v for v in values], dtype=float)
        finite = values[np.isfinite(values)]
        point[metric] = {
            "mean": float(finite.mean()) if finite.size else None,
            "std": float(finite.std()) if finite.size else None,
            "min": float(finite.min()) if finite.size else None,
            "max": float(finite.max()) if finite.size else None,
            "values": [None if not np.isfinite(v) else float(v) for v in values]}
      point["fitted"] = not any(_trivially_separated(r) for r in rows)
      for r in rows:
        value = results.metric_value(r, metrics[0])
        if value is not None and np.isfinite(value) and point["fitted"]:
          per_seed[r[results.SEED]].append((coverage, float(value)))
      points.append(point)
    values = dict(zip(SERIES_KEYS, key))
    if values[SWEEP] is None:
      del values[SWEEP]
    label = series_label(key)
    extras = [f"{k}={values[k]}" for k in varying if k not in LABEL_KEYS]
    if extras:
      label += " " + ", ".join(extras)
    out.append({"key": files.to_jsonable(values), "label": label,
                "space_size": values[results.SPACE_SIZE], "points": points,
                "per_seed": {str(s): v for s, v in sorted(per_seed.items())}})
  out.sort(key=lambda s: (s["space_size"], s["label"]))
  return out


def _trivially_separated(row):
  """Whether the replica holds out at most K objects (K objects per scene): every held-out
  scene then holds all the candidates, so held-out accuracy is 1 by construction and says
  nothing about generalisation; such points are drawn but left out of the ρ* fits."""
  if results.NUM_TRAIN_OBJECTS not in row:
    return False
  held_out = row[results.SPACE_SIZE] - row[results.NUM_TRAIN_OBJECTS]
  return 0 < held_out <= row[results.MAX_OBJECTS]


def _series_key(row):
  """The row's values of SERIES_KEYS: rows with equal keys are one series."""
  return tuple(_hashable(row.get(k)) for k in SERIES_KEYS)


def _hashable(v):
  return tuple(v) if isinstance(v, list) else v


def _varying_keys(keys):
  keys = list(keys)
  return [name for i, name in enumerate(SERIES_KEYS) if len({k[i] for k in keys}) > 1]


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


STEP_WORDS = {"final": "final step, no selection on held-out objects",
              "best": "best step, chosen on held-out objects themselves (optimistic)"}
STATUS_WORDS = {"fit": "fit", "above": "above 0.5 at every coverage",
                "below": "never reaches 0.5", "too_few": "fewer than 2 coverages"}
# Per-coverage columns of the Markdown table: (metric, header).
TABLE_METRICS = ((BINDING_METRIC, "held-out {K}-object accuracy"),
                 (results.binding(results.HELDOUT), "held-out binding"),
                 (results.object_accuracy(results.TRAIN, results.ROW_K),
                  "training {K}-object accuracy"))


def _number(x, digits=3):
  return "–" if x is None else f"{x:.{digits}f}"


def _escape(text):
  return text.replace("|", "\\|")  # |O| must not split the Markdown cells


def _rho_rows(table):
  lines = [f"| series | \\|O\\| | seeds | ρ* | {LEVEL:.0%} interval (t over seeds) | "
           "per-seed ρ* | slope | status |",
           "|---|---:|---:|---:|---|---|---:|---|"]
  for row in table:
    interval = ("–" if not row["interval"] else
                f"[{row['interval'][0]:.3f}, {row['interval'][1]:.3f}]")
    per_seed = " ".join(_number(v) for v in row["seed_rho_stars"].values())
    status = STATUS_WORDS[row["status"]]
    if row["censored_seeds"] and row["status"] == "fit":
      status += f"; seed(s) {', '.join(row['censored_seeds'])} never cross 0.5: no interval"
    lines.append(f"| {_escape(row['label'])} | {row[results.SPACE_SIZE]:,} | {row['num_seeds']} | "
                 f"{_number(row['rho_star'])} | {interval} | {per_seed} | "
                 f"{_number(row['slope'], 1)} | {status} |")
  return lines


def _coverage_rows(s):
  k = s["key"][results.MAX_OBJECTS]
  headers = [h.format(K=k) for _, h in TABLE_METRICS]
  lines = [f"### {_escape(s['label'])}", "",
           "Values per seed, in the order of the seeds column.", "",
           "| coverage | held-out objects | seeds | step | " + " | ".join(headers) + " |",
           "|---:|---:|---|---|" + "---|" * len(headers)]
  for p in s["points"]:
    cells = []
    for metric, _ in TABLE_METRICS:
      m = p.get(metric)
      if m is None or m["mean"] is None:
        cells.append("–")
        continue
      values = " ".join(_number(v) for v in m["values"])
      cells.append(f"{values} (mean {_number(m['mean'])})")
    heldout = ", ".join(map(str, p["heldout_objects"])) or "–"
    if not p.get("fitted", True):
      heldout += " (≤ K: not fitted)"
    steps = ", ".join(map(str, sorted(set(p["steps"]))))
    seeds = " ".join(map(str, p["seeds"]))
    lines.append(f"| {p['coverage']:g} | {heldout} | {seeds} | {steps} | "
                 + " | ".join(cells) + " |")
  return lines


def _law_lines(laws):
  if not laws:
    return ["Scaling law: needs ρ* at three or more object-space sizes."]
  lines = [f"Scaling law over {laws['num_points']} sizes (best: {laws['best']}):", ""]
  for name in ("power_law", "log_linear"):
    law = laws[name]
    a, b = f"{law['a']:.4g}", f"{law['b']:.4g}"
    if "a_interval" in law:
      a += " [{:.4g}, {:.4g}]".format(*law["a_interval"])
      b += " [{:.4g}, {:.4g}]".format(*law["b_interval"])
    lines.append(f"- {name}: `{law['formula']}`, a = {a}, b = {b}, R² = {law['r2']:.3f}")
  if "concept_log_linear" in laws:
    law = laws["concept_log_linear"]
    values = [f"{k} = {law[k]:.4g}" + (" [{:.4g}, {:.4g}]".format(*law[f"{k}_interval"])
                                      if f"{k}_interval" in law else "") for k in "abc"]
    fit = ("passes through every point" if law["residual_dof"] == 0 else
           f"R² = {law['r2']:.3f}, {law['residual_dof']} residual degrees of freedom")
    lines.append(f"- concept_log_linear: `{law['formula']}`, {', '.join(values)} ({fit}); "
                 "c ≠ 0 means C moves ρ* beyond |O| = V^C")
  if "num_draws" in laws:
    lines += ["", f"Intervals: {LEVEL:.0%} of {laws['num_draws']} refits with every size's ρ* "
              "drawn from its own t distribution."]
  if laws.get("predictions"):
    names = [k for k in ("power_law", "log_linear", "concept_log_linear")
             if k in laws["predictions"][0]]
    lines += ["", "Predicted ρ* at sizes not in the fit (95% range over the same refits):", "",
              "| \\|O\\| | C | " + " | ".join(names) + " |",
              "|---:|---:|" + "---|" * len(names)]
    for p in laws["predictions"]:
      cells = [f"{p[k]['rho_star']:.3f} [{p[k]['range'][0]:.3f}, {p[k]['range'][1]:.3f}]"
               for k in names]
      lines.append(f"| {p[results.SPACE_SIZE]:,} | {p[results.NUM_CONCEPTS]} | "
                   + " | ".join(cells) + " |")
  return lines


def markdown_table(table, laws, step, metric="accuracy", series=()):
  """The ρ* table, the scaling law and (given `series`) per-coverage tables, as Markdown.

  `metric` names the figure ρ* is read from.
  """
  what = {"accuracy": "held-out set-separation accuracy on max-object scenes",
          "binding": "held-out binding figure on two-object scenes"}[metric]
  ks = sorted({row[results.MAX_OBJECTS] for row in table})
  name = RHO_METRICS[metric].replace(results.ROW_K, "/".join(map(str, ks)))
  lines = [f"# Critical coverage ρ* ({STEP_WORDS[step]}; {what} (`{name}`), "
           f"crossing {THRESHOLD})", ""]
  lines += _rho_rows(table) + [""] + _law_lines(laws) + [""]
  if series:
    lines += ["## Per coverage", ""]
    for s in series:
      lines += _coverage_rows(s) + [""]
  return "\n".join(lines)


def _rows_of_sweeps(workdirs, step):
  """The selected rows of every sweep. If two sweeps hold the same series, every row carries
  its sweep's name (SWEEP), so that no curve averages replicas of different sweeps."""
  per_sweep = [_selected_rows(w, step) for w in workdirs]
  keys = [{_series_key(r) for r in rows} for rows in per_sweep]
  if sum(map(len, keys)) == len(set().union(*keys)):
    return [row for rows in per_sweep for row in rows]
  names = [w.name for w in workdirs]
  if len(set(names)) < len(names):
    names = [str(w) for w in workdirs]
  return [dict(row, **{SWEEP: name}) for name, rows in zip(names, per_sweep) for row in rows]


def _selected_rows(workdir, step):
  """One evaluation row per replica of the sweep in workdir (results.select_evaluations)."""
  path = workdir / results.RESULTS_FILE
  rows = results.read_rows(workdir)
  if not rows:
    raise ValueError(f"workdir='{workdir}': no result rows in {path}; run `bindjax sweep` first")
  selected = results.select_evaluations(rows, step)
  if not selected:
    raise ValueError(f"{path}: no evaluation rows (kind='eval') yet")
  return selected


def describe(workdirs, series, step):
  """The figures' title in words, e.g. "|O| = 196, C = 2; product read-out, 2 layers,
  d_model 64; 15,000 steps; final step": the spaces of `series`, then the towers and the steps
  of the sweeps' config.json files (each distinct one once)."""
  by_concepts = collections.defaultdict(set)
  for s in series:
    by_concepts[s["key"][results.NUM_CONCEPTS]].add(s["space_size"])
  sizes = {c: ", ".join(f"{n:,}" for n in sorted(n)) for c, n in sorted(by_concepts.items())}
  spaces = (f"|O| = {sizes[c]}, C = {c}" for c in sizes) if len(sizes) == 1 else (
      "|O| = " + " and ".join(f"{sizes[c]} (C = {c})" for c in sizes),)
  towers, steps = [], []
  for workdir in workdirs:
    path = workdir / results.CONFIG_FILE
    if path.exists():
      config = files.read_json(path)
      model = config.get("model", {})
      words = (f"{READOUT_WORDS.get(model.get('product_readout', 'none'), 'plain towers')}, "
               f"{model.get('num_layers')} layers, d_model {model.get('d_model')}")
      towers += [words] if words not in towers else []
      steps += [config.get("num_steps", 0)] if config.get("num_steps", 0) not in steps else []
  parts = list(spaces) + [" / ".join(towers)] if towers else list(spaces)
  if steps:
    parts.append(", ".join(f"{n:,}" for n in sorted(steps)) + " steps")
  return "; ".join(parts + [f"{step} step"])


def make_report(workdir, step=results.DEFAULT_STEP, num_draws=1000, out_dir=None,
                formats=("png", "pdf"), metric="accuracy", predict_at=()):
  """Writes figures, ρ* table and scaling law for one sweep or several; returns the summary.

  workdir: a sweep's workdir, or a list of them (for example one sweep per object-space size),
  whose replicas are reported together; out_dir is then required. step: "final" (default) or
  "best" (results.select_evaluations). num_draws: refits behind the scaling law's intervals.
  metric: "accuracy" or "binding", the held-out figure ρ* is fitted to (RHO_METRICS).
  predict_at: (|O|, C) pairs at which each scaling law's ρ* is predicted, with its range over
  the refits (`scaling_law_intervals`).
  The summary's "finished" is False when a sweep has no done file (still running, or killed):
  the report then covers the rows written so far, and its title says so.
  """
  workdirs = [workdir] if isinstance(workdir, (str, os.PathLike)) else list(workdir)
  workdirs = [files.as_path(w) for w in workdirs]
  if len(workdirs) > 1 and out_dir is None:
    raise ValueError(f"workdir={[str(w) for w in workdirs]!r}: a report of several sweeps needs "
                     "an output directory")
  if metric not in RHO_METRICS:
    raise ValueError(f"metric={metric!r}: expected one of {sorted(RHO_METRICS)}")
  rho_metric = RHO_METRICS[metric]
  from bindjax.reporting.plots import phase_transition  # matplotlib only when drawing

  selected = _rows_of_sweeps(workdirs, step)
  # A live or killed sweep: what exists is drawn, and the summary says it is unfinished.
  finished = all((w / results.DONE_FILE).exists() for w in workdirs)
  series = aggregate(selected, (rho_metric,) + tuple(
      m for m in REPORT_METRICS if m != rho_metric))
  table = critical_coverages(series)
  # A scaling law needs one ρ* per |O|: use series that differ only in size.
  fitted = [r for r in table if r["rho_star"] is not None]
  laws = None
  if len({r[results.SPACE_SIZE] for r in fitted}) == len(fitted):
    laws = fit_scaling_laws([r[results.SPACE_SIZE] for r in fitted],
                            [r["rho_star"] for r in fitted],
                            [r[results.NUM_CONCEPTS] for r in fitted])
    laws = scaling_law_intervals(fitted, laws, num_draws, predict_at=predict_at)
  out_dir = files.as_path(out_dir or workdirs[0] / results.REPORT_DIR)
  out_dir.mkdir(parents=True, exist_ok=True)
  drawn = ("phase_transition", "scaling_law") if len(fitted) >= 2 else ("phase_transition",)
  files.record_outputs(out_dir, [f"{name}.{f}" for name in drawn for f in formats] + [
      "critical_coverage.json", "critical_coverage.md", "points.json"])
  title = describe(workdirs, series, step) + ("" if finished else " (unfinished)")
  figures = phase_transition.plot(series, table, out_dir / "phase_transition",
                                  step=step, formats=formats, rho_metric=rho_metric, title=title,
                                  level=LEVEL)
  if len(fitted) >= 2:
    figures += phase_transition.plot_scaling_law(
        fitted, laws, out_dir / "scaling_law", title="critical coverage against |O|: " + title,
        formats=formats, study_points=STUDY_RHO_STARS, level=LEVEL)
  summary = {"workdirs": [str(w) for w in workdirs], "step": step, "threshold": THRESHOLD,
             "metric": rho_metric, "critical_coverage": table, "scaling_law": laws,
             "finished": finished, "num_replicas": len(selected),
             "num_diverged": sum(bool(r[results.DIVERGED]) for r in selected),
             "figures": figures}
  files.write_json(out_dir / "critical_coverage.json", summary)
  files.write_atomic(out_dir / "critical_coverage.md",
                     markdown_table(table, laws, step, metric, series))
  files.write_json(out_dir / "points.json", series)
  return summary
