"""Phase-transition report of a coverage sweep: figure, critical coverage ρ*, scaling law.

Reads the rows that `bindjax.sweep` appends to WORKDIR/results.jsonl, picks one evaluation per
replica (its best or final step), averages over seeds and fits, per object-space size |O|, a
logistic curve acc(ρ) = sigmoid(k·(ρ − ρ*)) to held-out object accuracy on scenes with the
maximum number of objects (binding is needed there; one-object scenes are reported apart since
matching concepts alone solves them). ρ* is where the curve crosses 0.5; its interval comes from
a bootstrap over seeds. With three or more sizes, ρ*(|O|) is fitted by a power law and by a
log-linear law.

Outputs, in WORKDIR/report/: phase_transition.png/.pdf, critical_coverage.md/.json,
points.json (the aggregated curves).
"""
import collections
import math
import os

import numpy as np
from scipy import optimize

from bindjax import files
from bindjax import results

# Metric names of bindjax.train.eval_step; "{K}" is the maximum number of objects per scene.
BINDING_METRIC = "heldout/object_accuracy_{K}obj"
ONE_OBJECT_METRIC = "heldout/object_accuracy_1obj"
CONCEPT_METRIC = "heldout/concept_accuracy"
# ρ* may be read off either held-out figure (docs/objectives.md#binding): set-separation accuracy
# on max-object scenes, or the binding figure (both objects above every cross object).
RHO_METRICS = {"accuracy": BINDING_METRIC, "binding": "heldout/binding"}
# Every metric the report aggregates and draws (the ρ* metric first).
REPORT_METRICS = (BINDING_METRIC, "heldout/binding", "train/object_accuracy_{K}obj",
                  "train/binding", ONE_OBJECT_METRIC, CONCEPT_METRIC)
THRESHOLD = 0.5
# Replica settings that are not seeds: replicas differing only in seed are averaged; any other
# difference besides coverage makes a separate curve.
SERIES_KEYS = ("C", "V", "K", "space_size", "model", "learning_rate", "weight_decay")


def _metric(row, name):
  """A row's metric; "{K}" in the name becomes the row's maximum number of objects."""
  return row.get(name.replace("{K}", str(row.get("K"))))


def series_label(key):
  """Legend text of a series: |O| with (C, V), plus any non-default hyperparameters."""
  values = dict(zip(SERIES_KEYS, key))
  v = values["V"]
  v = "×".join(map(str, v)) if isinstance(v, (list, tuple)) else v
  label = f"|O|={values['space_size']:,} (C={values['C']}, V={v})"
  return label


def aggregate(selected, metrics=(BINDING_METRIC, ONE_OBJECT_METRIC, CONCEPT_METRIC)):
  """Groups selected rows into series (one per setting) and coverage points over seeds.

  Returns a list of dicts sorted by |O|: {"key", "label", "space_size", "points": [{"coverage",
  "seeds", metric: {"mean", "std", "min", "max", "values"}}], "per_seed": {seed: [(coverage,
  value of metrics[0])]}}.
  """
  series = collections.defaultdict(lambda: collections.defaultdict(list))
  for row in selected:
    key = tuple(_hashable(row.get(k)) for k in SERIES_KEYS)
    series[key][float(row["coverage"])].append(row)
  out = []
  varying = _varying_keys(series.keys())
  for key in sorted(series, key=lambda k: tuple(map(str, k))):
    points = []
    per_seed = collections.defaultdict(list)
    for coverage in sorted(series[key]):
      rows = series[key][coverage]
      point = {"coverage": coverage, "seeds": [r["seed"] for r in rows],
               "diverged": sum(bool(r.get("diverged")) for r in rows)}
      for metric in metrics:
        values = [_metric(r, metric) for r in rows]
        values = np.array([np.nan if v is None else v for v in values], dtype=float)
        finite = values[np.isfinite(values)]
        point[metric] = {
            "mean": float(finite.mean()) if finite.size else None,
            "std": float(finite.std()) if finite.size else None,
            "min": float(finite.min()) if finite.size else None,
            "max": float(finite.max()) if finite.size else None,
            "values": [None if not np.isfinite(v) else float(v) for v in values]}
      for r in rows:
        value = _metric(r, metrics[0])
        if value is not None and np.isfinite(value):
          per_seed[r["seed"]].append((coverage, float(value)))
      points.append(point)
    values = dict(zip(SERIES_KEYS, key))
    label = series_label(key)
    extras = [f"{k}={values[k]}" for k in varying if k not in ("C", "V", "K", "space_size")]
    if extras:
      label += " " + ", ".join(extras)
    out.append({"key": files.to_jsonable(values), "label": label,
                "space_size": values["space_size"], "points": points,
                "per_seed": {str(s): v for s, v in sorted(per_seed.items())}})
  out.sort(key=lambda s: (s["space_size"], s["label"]))
  return out


def _hashable(v):
  return tuple(v) if isinstance(v, list) else v


def _varying_keys(keys):
  keys = list(keys)
  return [name for i, name in enumerate(SERIES_KEYS) if len({k[i] for k in keys}) > 1]


def _sigmoid(x):
  return 0.5 * (1.0 + np.tanh(0.5 * x))


def fit_logistic(coverage, accuracy, start=None):
  """Least-squares fit of acc = sigmoid(k·(ρ − ρ*)); returns {"rho_star", "slope", "status"}.

  status: "fit"; "above" when every point is above 0.5 (ρ* below the smallest coverage,
  reported as None); "below" when none reaches 0.5 (ρ* beyond the largest coverage); "too_few"
  with fewer than two distinct coverages. start: (ρ*, slope) to start from (bootstrap refits),
  else a few starting slopes are tried.
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
  if start is not None:
    starts = [(float(np.clip(start[0], lower[0], upper[0])),
               float(np.clip(np.log(start[1]), lower[1], upper[1])))]
  else:
    starts = [(start_rho, np.log(k / span)) for k in (4.0, 20.0, 100.0)]
  best = None
  for x0 in starts:
    result = optimize.least_squares(residuals, x0=x0, jac=jacobian, bounds=(lower, upper))
    if best is None or result.cost < best.cost:
      best = result
  rho, log_slope = best.x
  return {"rho_star": float(rho), "slope": float(np.exp(log_slope)), "status": "fit"}


def bootstrap_rho_star(per_seed, num_samples=1000, seed=0, level=0.95, start=None):
  """Percentile interval of ρ* over bootstrap resamples of seeds (each seed keeps its curve)."""
  seeds = sorted(per_seed)
  if len(seeds) < 2:
    return None
  rng = np.random.default_rng(seed)
  estimates = []
  for _ in range(num_samples):
    picked = rng.choice(len(seeds), size=len(seeds), replace=True)
    pairs = [p for i in picked for p in per_seed[seeds[i]]]
    fit = fit_logistic([p[0] for p in pairs], [p[1] for p in pairs], start=start)
    if fit["status"] == "fit":
      estimates.append(fit["rho_star"])
  if len(estimates) < num_samples // 2:
    return None
  low, high = np.percentile(estimates, [50 * (1 - level), 100 - 50 * (1 - level)])
  return [float(low), float(high)]


def critical_coverages(series, num_bootstrap=1000):
  """ρ* (logistic fit over all seeds' points) and its bootstrap interval for every series."""
  table = []
  for s in series:
    pairs = [p for seed_pairs in s["per_seed"].values() for p in seed_pairs]
    fit = fit_logistic([p[0] for p in pairs], [p[1] for p in pairs])
    interval = (bootstrap_rho_star(s["per_seed"], num_bootstrap,
                                   start=(fit["rho_star"], fit["slope"]))
                if fit["status"] == "fit" else None)
    table.append({"label": s["label"], **s["key"], "rho_star": fit["rho_star"],
                  "interval": interval, "slope": fit["slope"], "status": fit["status"],
                  "num_seeds": len(s["per_seed"]),
                  "coverages": [p["coverage"] for p in s["points"]]})
  return table


def fit_scaling_laws(space_sizes, rho_stars):
  """Fits ρ* = a·|O|^b (log-log) and ρ* = a + b·log10|O|; None with fewer than 3 sizes.

  Returns {"power_law": {"a", "b", "r2"}, "log_linear": {"a", "b", "r2"}, "best": name}.
  """
  n = np.asarray(space_sizes, dtype=float)
  rho = np.asarray(rho_stars, dtype=float)
  keep = np.isfinite(rho) & (rho > 0) & (n > 0)
  n, rho = n[keep], rho[keep]
  if np.unique(n).size < 3:
    return None
  laws = {}
  log_n = np.log10(n)
  b, log_a = np.polyfit(np.log(n), np.log(rho), 1)
  laws["power_law"] = {"formula": "rho* = a * |O|^b", "a": float(np.exp(log_a)), "b": float(b),
                       "r2": _r2(rho, np.exp(log_a) * n ** b)}
  b, a = np.polyfit(log_n, rho, 1)
  laws["log_linear"] = {"formula": "rho* = a + b * log10|O|", "a": float(a), "b": float(b),
                        "r2": _r2(rho, a + b * log_n)}
  laws["best"] = max(("power_law", "log_linear"), key=lambda k: laws[k]["r2"])
  laws["num_points"] = int(n.size)
  return laws


def _r2(y, y_hat):
  total = float(((y - y.mean()) ** 2).sum())
  return 1.0 - float(((y - y_hat) ** 2).sum()) / total if total > 0 else 1.0


def markdown_table(table, laws, step, metric="accuracy"):
  """The ρ* table (and scaling law) as Markdown; `metric` names the figure ρ* is read from."""
  what = {"accuracy": "held-out set-separation accuracy on max-object scenes",
          "binding": "held-out binding figure on two-object scenes"}[metric]
  lines = [f"# Critical coverage ρ* ({step} step; {what} (`{RHO_METRICS[metric]}`), "
           f"crossing {THRESHOLD})", "",
           "| series | \\|O\\| | seeds | ρ* | 95% interval | slope | status |",
           "|---|---:|---:|---:|---|---:|---|"]
  for row in table:
    rho = "–" if row["rho_star"] is None else f"{row['rho_star']:.3f}"
    interval = ("–" if not row["interval"] else
                f"[{row['interval'][0]:.3f}, {row['interval'][1]:.3f}]")
    slope = "–" if row["slope"] is None else f"{row['slope']:.1f}"
    status = {"fit": "fit", "above": "above 0.5 at every coverage",
              "below": "never reaches 0.5", "too_few": "fewer than 2 coverages"}[row["status"]]
    label = row["label"].replace("|", "\\|")  # |O| must not split the Markdown cells
    lines.append(f"| {label} | {row['space_size']:,} | {row['num_seeds']} | {rho} | "
                 f"{interval} | {slope} | {status} |")
  lines.append("")
  if laws:
    lines.append(f"Scaling law over {laws['num_points']} sizes (best: {laws['best']}):")
    lines.append("")
    for name in ("power_law", "log_linear"):
      law = laws[name]
      lines.append(f"- {name}: `{law['formula']}`, a = {law['a']:.4g}, b = {law['b']:.4g}, "
                   f"R² = {law['r2']:.3f}")
  else:
    lines.append("Scaling law: needs ρ* at three or more object-space sizes.")
  return "\n".join(lines) + "\n"


def make_report(workdir, step="best", num_bootstrap=1000, out_dir=None, formats=("png", "pdf"),
                metric="accuracy"):
  """Writes figure, ρ* table and scaling law for the sweep in workdir; returns the summary dict.

  metric: "accuracy" or "binding", the held-out figure ρ* is fitted to (RHO_METRICS).
  The summary's "finished" is False for a sweep without its done file (still running, or
  killed): the report then covers the rows written so far.
  """
  if metric not in RHO_METRICS:
    raise ValueError(f"metric={metric!r}: expected one of {sorted(RHO_METRICS)}")
  rho_metric = RHO_METRICS[metric]
  from bindjax.plots import phase_transition  # matplotlib only when drawing

  path = os.path.join(workdir, results.RESULTS_FILE)
  rows = results.read_rows(workdir)
  # A live or killed sweep: what exists is drawn, and the summary says it is unfinished.
  finished = os.path.exists(os.path.join(workdir, results.DONE_FILE))
  if not rows:
    raise ValueError(f"workdir={workdir!r}: no result rows in {path}; run `bindjax sweep` first")
  selected = results.select_evaluations(rows, step)
  if not selected:
    raise ValueError(f"{path}: no evaluation rows (kind='eval') yet")
  series = aggregate(selected, (rho_metric,) + tuple(
      m for m in REPORT_METRICS if m != rho_metric))
  table = critical_coverages(series, num_bootstrap)
  # A scaling law needs one ρ* per |O|: use series that differ only in size.
  fitted = [r for r in table if r["rho_star"] is not None]
  laws = None
  if len({r["space_size"] for r in fitted}) == len(fitted):
    laws = fit_scaling_laws([r["space_size"] for r in fitted], [r["rho_star"] for r in fitted])
  out_dir = out_dir or os.path.join(workdir, results.REPORT_DIR)
  os.makedirs(out_dir, exist_ok=True)
  files.record_outputs(out_dir, [f"phase_transition.{f}" for f in formats] + [
      "critical_coverage.json", "critical_coverage.md", "points.json"])
  figures = phase_transition.plot(series, table, os.path.join(out_dir, "phase_transition"),
                                  step=step, formats=formats, rho_metric=rho_metric)
  summary = {"workdir": os.path.abspath(workdir), "step": step, "threshold": THRESHOLD,
             "metric": rho_metric, "critical_coverage": table, "scaling_law": laws,
             "finished": finished, "num_replicas": len(selected),
             "num_diverged": sum(bool(r["diverged"]) for r in selected), "figures": figures}
  files.write_json(os.path.join(out_dir, "critical_coverage.json"), summary)
  files.write_atomic(os.path.join(out_dir, "critical_coverage.md"),
                     markdown_table(table, laws, step, metric))
  files.write_json(os.path.join(out_dir, "points.json"), series)
  return summary
