"""Grids of fits (docs/complexity.md, "Fitting"): entries, batches of similar training counts
and the result rows.

`fit_grid` fits every (approximator, train fraction, seed, learning rate) entry, one
`fitting.fit_models` batch per approximator shape and training-count group, and returns one
result row per entry: its grid coordinates, scene counts, summary and evaluation history.
"""
import dataclasses

import jax
import numpy as np

from bindjax.complexity import data as data_lib
from bindjax.complexity import families
from bindjax.complexity import fitting
from bindjax.runtime import parallel

# fit_grid puts splits in one batch while the largest training count is at most this many times
# the smallest: padding then costs at most a quarter of a batch's training arithmetic.
PAD_RATIO = 1.25


def summarize(history, config):
  """Per-model summary of a history: best test-only object accuracy (headline), best test-only
  R² over evaluations and the values at the last evaluation (what the original reports)."""
  test = data_lib.MASKS.index("test_only")
  steps = fitting.eval_steps(config)
  object_acc_MxE = history["object_acc"][..., test]
  best_E_index = object_acc_MxE.argmax(-1)
  rows = []
  for m, e in enumerate(best_E_index):
    row = {
        "best_test_object_acc": float(object_acc_MxE[m, e]),
        "best_step": steps[e],
        "final_step": steps[-1],
        "test_concept_acc_at_best": float(history["concept_acc"][m, e, test]),
        "best_test_concept_acc": float(history["concept_acc"][m, :, test].max()),
        "best_test_r2": float(history["r2"][m, :, test].max()),
        "final_train_loss": float(history["train_loss"][m, -1]),
        # A diverged model is flagged, not fatal: its metrics are whatever NaNs gave.
        "diverged": bool(not np.isfinite(history["train_loss"][m]).all()),
    }
    for key in ("concept_acc", "object_acc", "mse", "r2"):
      for i, mask in enumerate(data_lib.MASKS):
        row[f"final_{mask}_{key}"] = float(history[key][m, -1, i])
    rows.append(row)
  return rows


@dataclasses.dataclass(frozen=True)
class GridEntry:
  """One fit of a grid: approximator, train fraction, seed, learning rate."""
  model: families.Approximator
  train_fraction: float
  seed: int
  learning_rate: float
  # (permutation, training count) to use instead of the seed's random split of train_fraction.
  split: tuple | None = None
  # Row of fit_grid's `own` whose targets and probes this fit uses (None: the data's).
  own_index: int | None = None


def grid_entries(models, fractions, seeds, learning_rates):
  """Every (model, fraction, seed, lr) combination, model-major."""
  return [GridEntry(m, float(f), int(s), float(lr)) for m in models for f in fractions
          for s in seeds for lr in learning_rates]


def batches_by_count(counts, pad_ratio=PAD_RATIO):
  """Groups of indices into `counts` (train-only scene counts) that are fitted together.

  Sorted by count; a group's largest count is at most pad_ratio times its smallest (≥ 1);
  pad_ratio=inf makes one group.
  """
  order = np.argsort(-np.asarray(counts), kind="stable")
  groups = []
  for i in order:
    if groups and max(counts[groups[-1][0]], 1) <= pad_ratio * max(counts[i], 1):
      groups[-1].append(int(i))
    else:
      groups.append([int(i)])
  return [sorted(g) for g in groups]


def fit_grid(entries, data, probes, config, mesh=None, chunk_size=parallel.AUTO,
             memory_bytes=None, on_eval=None, own=None, pad_ratio=PAD_RATIO):
  """Fits every entry: one jit(vmap) per approximator shape and training-count batch.

  Returns (result rows in entry order, infos per batch). Each row holds the grid coordinates,
  scene counts per mask, the summary of `summarize` and the full evaluation history (lists
  over evaluations; masks in data.MASKS order). on_eval: as in `fit_models`. own: a
  data_lib.OwnTargets whose rows the entries' own_index select (all entries then need one).
  pad_ratio: as in `batches_by_count` (fewer compiled batches against more padded arithmetic).
  """
  config.validate()
  by_model = {}
  for i, entry in enumerate(entries):
    by_model.setdefault(entry.model, []).append(i)
  rows = [None] * len(entries)
  infos = []
  for model, indices in by_model.items():
    group = [entries[i] for i in indices]
    points = data_lib.make_points(data.num_unique, [e.train_fraction for e in group],
                                  [e.seed for e in group], [e.learning_rate for e in group],
                                  [e.split for e in group])
    counts = data_lib.mask_counts(data, points)
    for batch in batches_by_count(counts[:, 0], pad_ratio):
      sub = jax.tree_util.tree_map(lambda x, b=batch: np.asarray(x)[b], points)
      own_sub = None if own is None else jax.tree_util.tree_map(
          lambda x, b=batch: np.asarray(x)[[group[i].own_index for i in b]], own)
      history, info = fitting.fit_models(model, data, probes, sub, config, mesh, chunk_size,
                                 memory_bytes, on_eval, own=own_sub)
      infos.append(info)
      for j, (b, summary) in enumerate(zip(batch, summarize(history, config))):
        e = group[b]
        rows[indices[b]] = {
            "family": model.family, "name": model.name, "widths": list(model.widths),
            "learned_w": model.learned_w, "embed_dim": model.width,
            "num_parameters": model.num_parameters(),
            "train_fraction": float(e.train_fraction), "seed": int(e.seed),
            "learning_rate": float(e.learning_rate), "schedule": config.schedule,
            "steps": config.steps, "solver": info["solver"], "restarts": info["restarts"],
            "standardize": config.standardize, "weight_decay": config.decay_for(model.family),
            **{key: None if info[key] is None else info[key][j]
               for key in ("restart_candidate", "restart_error")},
            # Coordinate solver: the share of coordinates whose predictions on unseen scenes
            # the training scenes determine; a fit below 1 reports test-only metrics of one
            # of many equally good fits (docs/complexity.md, "Identifiability").
            "identified_share": None if info["identified"] is None else info["identified"][j],
            "identified": None if info["identified"] is None else info["identified"][j] == 1.0,
            "num_train_objects": int(points.num_train_M[b]),
            **{f"num_{mask}_scenes": int(counts[b, k]) for k, mask in enumerate(data_lib.MASKS)},
            **summary,
            "history": {key: np.asarray(v[j]).tolist() for key, v in history.items()},
        }
  return rows, infos
