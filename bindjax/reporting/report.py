"""Phase-transition report of a coverage sweep: figure, critical coverage ρ*, scaling law.

Reads the rows that `bindjax.training.sweep` appends to WORKDIR/results.jsonl, picks one
evaluation per replica (by default its final step, which selects nothing on held-out objects;
"best" picks the step of highest held-out accuracy and is optimistic), and fits, per
object-space size |O|, a logistic curve acc(ρ) = sigmoid(k·(ρ − ρ*)) to held-out object
accuracy on scenes with the maximum number of objects (binding is needed there; one-object
scenes are reported apart since matching concepts alone solves them). ρ* is where the curve
crosses 0.5.

Statistics (`bindjax.reporting.statistics`; docs/training.md, "Critical coverage and its
interval"): ρ* is fitted to each seed's curve alone, the estimate is the mean of those
per-seed values and its interval is the Student t interval over seeds, which holds its level
with few seeds where a bootstrap over 2–4 seeds does not. With three or more sizes, ρ*(|O|) is
fitted by a power law and by a log-linear law, with intervals from draws of every size's ρ*
within its own interval.

Outputs, in WORKDIR/report/: phase_transition.png/.pdf, scaling_law.png/.pdf (two or more sizes
with a ρ*), critical_coverage.md/.json, points.json (the aggregated curves).
"""
import collections
import itertools
import os

import numpy as np

from bindjax.base import files
from bindjax.reporting import metrics
from bindjax.reporting import statistics
from bindjax.reporting import tables
from bindjax.workdir import layout
from bindjax.workdir import results

READOUT_WORDS = {"none": "plain towers", "both": "product read-out",
                 "query": "product read-out in the query tower"}
# Which sweep a row came from, set only when several sweeps are reported and two of them hold
# the same series: their configs may differ outside the rows (a model setting, the steps).
SWEEP = "sweep"
# The towers of a row's sweep in words (`towers_words`), set only when each kind of towers gets
# its own scaling law (`make_report(law_per_towers=True)`).
TOWERS = "towers"
# Replica settings that are not seeds: replicas differing only in seed are averaged; any other
# difference besides coverage makes a separate curve.
SERIES_KEYS = (results.NUM_CONCEPTS, results.NUM_VALUES, results.MAX_OBJECTS, results.SPACE_SIZE,
               results.MODEL, results.LEARNING_RATE, results.WEIGHT_DECAY, SWEEP, TOWERS)
# Settings of a series that, with its towers, make one kind of towers: one law per kind.
LAW_KEYS = (TOWERS, results.LEARNING_RATE, results.WEIGHT_DECAY)
# Settings a label never lists as varying: |O|, C and V open every label, K goes with the space.
LABEL_KEYS = (results.NUM_CONCEPTS, results.NUM_VALUES, results.MAX_OBJECTS, results.SPACE_SIZE)


def series_label(key):
  """Legend text of a series: |O| with (C, V), plus any non-default hyperparameters."""
  values = dict(zip(SERIES_KEYS, key))
  v = values[results.NUM_VALUES]
  v = "×".join(map(str, v)) if isinstance(v, (list, tuple)) else v
  label = f"|O|={values[results.SPACE_SIZE]:,} (C={values[results.NUM_CONCEPTS]}, V={v})"
  return label


def aggregate(selected, metric_names=(metrics.BINDING_METRIC, metrics.ONE_OBJECT_METRIC,
                                      metrics.CONCEPT_METRIC)):
  """Groups selected rows into series (one per setting) and coverage points over seeds.

  Returns a list of dicts sorted by |O|: {"key", "label", "space_size", "points": [{"coverage",
  "seeds", "steps", "heldout_objects", "diverged", "fitted" (False: at most K held-out objects,
  left out of the ρ* fits), metric: {"mean", "std", "min", "max",
  "values"}}], "per_seed": {seed: [(coverage, value of metric_names[0])]}}.
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
      for metric in metric_names:
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
        value = results.metric_value(r, metric_names[0])
        if value is not None and np.isfinite(value) and point["fitted"]:
          per_seed[r[results.SEED]].append((coverage, float(value)))
      points.append(point)
    values = {k: v for k, v in zip(SERIES_KEYS, key) if v is not None or k not in (SWEEP, TOWERS)}
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


# Config sections in which sweeps pooled into one curve may differ: the grid, whose coordinates
# every row carries, and the sweep's device layout, which sets no number.
POOLABLE_SECTIONS = ("grid", "sweep")


def _rows_of_sweeps(workdirs, step, pool=False, law_per_towers=False):
  """The selected rows of every sweep (with law_per_towers, each carrying its sweep's TOWERS).
  If two sweeps hold the same series, every row carries its sweep's name (SWEEP), so that no
  curve averages replicas of different sweeps, unless `pool`: then such sweeps' configs must
  agree outside POOLABLE_SECTIONS and no coverage and seed of a series may come from two sweeps
  (ValueError naming the first difference or repeat)."""
  per_sweep = [_selected_rows(w, step) for w in workdirs]
  if law_per_towers:
    per_sweep = [[dict(row, **{TOWERS: towers_words(_config(w))}) for row in rows]
                 for w, rows in zip(workdirs, per_sweep)]
  keys = [{_series_key(r) for r in rows} for rows in per_sweep]
  if pool:
    _check_poolable(workdirs, per_sweep, keys)
  if pool or sum(map(len, keys)) == len(set().union(*keys)):
    return [row for rows in per_sweep for row in rows]
  names = [w.name for w in workdirs]
  if len(set(names)) < len(names):
    names = [str(w) for w in workdirs]
  return [dict(row, **{SWEEP: name}) for name, rows in zip(names, per_sweep) for row in rows]


def _check_poolable(workdirs, per_sweep, keys):
  for i, j in itertools.combinations(range(len(workdirs)), 2):
    if not keys[i] & keys[j]:
      continue   # no series in common: nothing is pooled between the two
    differ = [d for d in results.config_difference(_config(workdirs[i]),
                                                   results.with_added_settings(_config(workdirs[j])))
              if d[0].split(".")[0] not in POOLABLE_SECTIONS]
    if differ:
      field, first, other = differ[0]
      raise ValueError(f"pooling {workdirs[j]} with {workdirs[i]}: their configs differ in "
                       f"{field} ({other!r} against {first!r}); only "
                       f"{' and '.join(POOLABLE_SECTIONS)} may differ between pooled sweeps")
  seen = {}
  for workdir, rows in zip(workdirs, per_sweep):
    for row in rows:
      point = (_series_key(row), row[results.COVERAGE], row[results.SEED])
      if point in seen:
        raise ValueError(f"pooling {workdir} with {seen[point]}: both hold coverage "
                         f"{row[results.COVERAGE]:g}, seed {row[results.SEED]} of "
                         f"{series_label(point[0])}")
      seen[point] = workdir


def _config(workdir):
  """The sweep's config.json ({} when it has none)."""
  path = layout.Workdir(workdir).config_file
  return files.read_json(path) if path.exists() else {}


def towers_words(config):
  """A sweep's towers in words, from its config.json: "product read-out, 2 layers, d_model 64,
  d_ff 256" ("" without a model section)."""
  model = config.get("model")
  if not model:
    return ""
  return (f"{READOUT_WORDS.get(model.get('product_readout', 'none'), 'plain towers')}, "
          f"{model.get('num_layers')} layers, d_model {model.get('d_model')}, "
          f"d_ff {model.get('d_ff')}")


def _selected_rows(workdir, step):
  """One evaluation row per replica of the sweep in workdir (results.select_evaluations)."""
  path = layout.Workdir(workdir).results_file
  rows = layout.Workdir(workdir).read_rows()
  if not rows:
    raise ValueError(f"workdir='{workdir}': no result rows in {path}; run `bindjax sweep` first")
  selected = results.select_evaluations(rows, step)
  if not selected:
    raise ValueError(f"{path}: no evaluation rows (kind='eval') yet")
  return selected


def describe(workdirs, series, step):
  """The figures' title in words, e.g. "|O| = 196, C = 2; product read-out, 2 layers,
  d_model 64, d_ff 256; 15,000 steps; final step": the spaces of `series`, then the towers and the steps
  of the sweeps' config.json files (each distinct one once)."""
  by_concepts = collections.defaultdict(set)
  for s in series:
    by_concepts[s["key"][results.NUM_CONCEPTS]].add(s["space_size"])
  sizes = {c: ", ".join(f"{n:,}" for n in sorted(n)) for c, n in sorted(by_concepts.items())}
  spaces = (f"|O| = {sizes[c]}, C = {c}" for c in sizes) if len(sizes) == 1 else (
      "|O| = " + " and ".join(f"{sizes[c]} (C = {c})" for c in sizes),)
  towers, steps = [], []
  for config in filter(None, map(_config, workdirs)):
    words = towers_words(config)
    towers += [words] if words and words not in towers else []
    steps += [config.get("num_steps", 0)] if config.get("num_steps", 0) not in steps else []
  parts = list(spaces) + [" / ".join(towers)] if towers else list(spaces)
  if steps:
    parts.append(", ".join(f"{n:,}" for n in sorted(steps)) + " steps")
  return "; ".join(parts + [results.step_name(step)])


def _scaling_laws(table, num_draws, predict_at, law_per_towers=False):
  """[(label, rows of `table` with a ρ*, their scaling laws with intervals or None)]: one entry
  labelled None, or with law_per_towers one per kind of towers (LAW_KEYS), in table order."""
  groups = collections.defaultdict(list)
  for row in table:
    if row["rho_star"] is not None:
      groups[_law_label(row) if law_per_towers else None].append(row)
  out = []
  for label, fitted in (groups.items() if groups else [(None, [])]):
    laws = None
    # A scaling law needs one ρ* per size: series that differ only in |O| and C (two C at one
    # |O| are what tells the law with a term in C from the size laws).
    sizes = {(r[results.SPACE_SIZE], r[results.NUM_CONCEPTS]) for r in fitted}
    if len(sizes) == len(fitted):
      laws = statistics.fit_scaling_laws([r[results.SPACE_SIZE] for r in fitted],
                                         [r["rho_star"] for r in fitted],
                                         [r[results.NUM_CONCEPTS] for r in fitted])
      laws = statistics.scaling_law_intervals(fitted, laws, num_draws, predict_at=predict_at)
    out.append((label, fitted, laws))
  return out


def _law_label(row):
  """A kind of towers in words: its towers, learning rate and weight decay."""
  return (f"{row.get(TOWERS) or 'towers'}; lr {row[results.LEARNING_RATE]:g}, weight decay "
          f"{row[results.WEIGHT_DECAY]:g}")


def _draw(series, table, groups, out_dir, title, step, formats, rho_metric, law_per_towers):
  """The phase-transition figure and, given law groups, the scaling-law figure; their files."""
  from bindjax.reporting.plots import phase_transition  # matplotlib only when drawing

  figures = phase_transition.plot(series, table, out_dir / "phase_transition",
                                  step=step, formats=formats, rho_metric=rho_metric, title=title,
                                  level=statistics.LEVEL)
  if groups:
    _, fitted, laws = groups[0]
    figures += phase_transition.plot_scaling_law(
        fitted, laws, out_dir / "scaling_law", title="critical coverage against |O|: " + title,
        formats=formats, study_points=statistics.STUDY_RHO_STARS, level=statistics.LEVEL,
        groups=groups if law_per_towers else None)
  return figures


def make_report(workdir, step=results.DEFAULT_STEP, num_draws=1000, out_dir=None,
                formats=("png", "pdf"), metric="accuracy", predict_at=(), pool=False,
                law_per_towers=False):
  """Writes figures, ρ* table and scaling law for one sweep or several; returns the summary.

  workdir: a sweep's workdir, or a list of them (for example one sweep per object-space size),
  whose replicas are reported together; out_dir is then required. step: "final" (default),
  "best", or a step number N (results.select_evaluations). num_draws: refits behind the scaling
  law's intervals.
  metric: "accuracy" or "binding", the held-out figure ρ* is fitted to (metrics.RHO_METRICS).
  predict_at: (|O|, C) pairs at which each scaling law's ρ* is predicted, with its range over
  the refits (`statistics.scaling_law_intervals`). pool: several sweeps that differ only in
  their grids (a coverage or seeds run later, say) make one curve (`_rows_of_sweeps`).
  law_per_towers: one scaling law per kind of towers (read-out, width, learning rate and weight
  decay; LAW_KEYS) instead of one over every series, in the summary's "scaling_laws".
  formats: the figures' file formats; empty, the tables alone (no figure is drawn).
  The summary's "finished" is False when a sweep has no done file (still running, or killed):
  the report then covers the rows written so far, and its title says so.
  """
  workdirs = [workdir] if isinstance(workdir, (str, os.PathLike)) else list(workdir)
  workdirs = [files.as_path(w) for w in workdirs]
  if len(workdirs) > 1 and out_dir is None:
    raise ValueError(f"workdir={[str(w) for w in workdirs]!r}: a report of several sweeps needs "
                     "an output directory")
  if metric not in metrics.RHO_METRICS:
    raise ValueError(f"metric={metric!r}: expected one of {sorted(metrics.RHO_METRICS)}")
  rho_metric = metrics.RHO_METRICS[metric]

  step = results.parse_step(step)
  selected = _rows_of_sweeps(workdirs, step, pool, law_per_towers)
  # A live or killed sweep: what exists is drawn, and the summary says it is unfinished.
  finished = all(layout.Workdir(w).is_finished() for w in workdirs)
  series = aggregate(selected, (rho_metric,) + tuple(
      m for m in metrics.REPORT_METRICS if m != rho_metric))
  table = statistics.critical_coverages(series)
  groups = _scaling_laws(table, num_draws, predict_at, law_per_towers)
  with_law = any(len(fitted) >= 2 for _, fitted, _ in groups)
  out_dir = files.as_path(out_dir or layout.Workdir(workdirs[0]).report)
  out_dir.mkdir(parents=True, exist_ok=True)
  drawn = ("phase_transition", "scaling_law") if with_law else ("phase_transition",)
  files.record_outputs(out_dir, [f"{name}.{f}" for name in drawn for f in formats] + [
      "critical_coverage.json", "critical_coverage.md", "points.json"])
  title = describe(workdirs, series, step) + ("" if finished else " (unfinished)")
  figures = _draw(series, table, groups if with_law else None, out_dir, title, step=step,
                  formats=formats, rho_metric=rho_metric,
                  law_per_towers=law_per_towers) if formats else []
  summary = {"workdirs": [str(w) for w in workdirs], "pooled": bool(pool), "step": step,
             "threshold": statistics.THRESHOLD, "metric": rho_metric,
             "critical_coverage": table,
             "scaling_law": None if law_per_towers else groups[0][2],
             "scaling_laws": [{"towers": label, "laws": laws} for label, _, laws in groups]
             if law_per_towers else None,
             "finished": finished, "num_replicas": len(selected),
             "num_diverged": sum(bool(r[results.DIVERGED]) for r in selected),
             "figures": figures}
  files.write_json(out_dir / "critical_coverage.json", summary)
  files.write_atomic(out_dir / "critical_coverage.md",
                     tables.markdown_table(table, groups, step, metric, series))
  files.write_json(out_dir / "points.json", series)
  return summary
