"""Result rows of a complexity grid: CSV, and the per-(model, fraction) summary over seeds.

A grid row is one fit (model, train fraction, seed, learning rate). Restarts are part of the
grid: `summarize_seeds` reports, per (model, train fraction, learning rate), the median and the
spread of the headline metrics over seeds (docs/complexity.md, "Restarts"). With one seed the
median is that fit's value, as the original code reports it.
"""
import csv
import io

import numpy as np

from bindjax.complexity import data as data_lib

CSV_COLUMNS = (
    "name", "family", "train_fraction", "seed", "learning_rate", "schedule", "steps", "solver",
    "identified", "identified_share", "num_parameters", "num_train_objects",
    "num_train_only_scenes", "num_test_only_scenes",
    "num_mixed_scenes", "best_test_object_acc", "best_step", "test_concept_acc_at_best",
    "best_test_concept_acc", "best_test_r2", "final_step", "final_train_loss", "diverged",
    *[f"final_{m}_{k}" for k in ("concept_acc", "object_acc", "mse", "r2")
      for m in data_lib.MASKS])

# Metrics summarised over seeds: the headline (best over evaluations) and the last evaluation.
SEED_METRICS = ("best_test_object_acc", "test_concept_acc_at_best", "best_test_r2",
                "final_test_only_object_acc", "final_test_only_concept_acc",
                "final_test_only_r2")
SUMMARY_COLUMNS = ("name", "train_fraction", "learning_rate", "num_seeds", *[
    f"{m}_{s}" for m in SEED_METRICS for s in ("median", "min", "max", "iqr")])


def rows_to_csv(rows, columns=CSV_COLUMNS):
  """CSV text of rows (only `columns`; history and other keys left out; None as empty)."""
  out = io.StringIO()
  writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
  writer.writeheader()
  for row in rows:
    writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
  return out.getvalue()


def summarize_seeds(rows):
  """One row per (model name, train fraction, learning rate) in first-appearance order:
  num_seeds and, per SEED_METRICS entry, its median, min, max and interquartile range over
  the seeds' fits (non-finite values, e.g. of a diverged fit, count as NaN)."""
  groups = {}
  for row in rows:
    key = (row["name"], row["train_fraction"], row.get("learning_rate"))
    groups.setdefault(key, []).append(row)
  summary = []
  for (name, fraction, lr), members in groups.items():
    out = {"name": name, "train_fraction": fraction, "learning_rate": lr,
           "num_seeds": len(members)}
    for metric in SEED_METRICS:
      values = np.asarray([np.nan if r.get(metric) is None else r[metric] for r in members],
                          np.float64)
      if np.isnan(values).all():
        stats = dict.fromkeys(("median", "min", "max", "iqr"), None)
      else:
        q25, median, q75 = np.nanpercentile(values, [25, 50, 75])
        stats = {"median": float(median), "min": float(np.nanmin(values)),
                 "max": float(np.nanmax(values)), "iqr": float(q75 - q25)}
      out.update({f"{metric}_{k}": v for k, v in stats.items()})
    summary.append(out)
  return summary
