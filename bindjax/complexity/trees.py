"""Tree approximators (scikit-learn) on the same object-level splits and scoring as the neural
approximators (docs/complexity.md, "Trees").

A non-neural check of the binding-function analysis: a random forest (or gradient boosting,
one booster per output dimension, so only practical for small D) maps one-hot slot values to the
embedding, is fitted on a split's train-only scenes and scored on all scenes with the frozen
linear probes (`fit_programs.evaluate_predictions`).
"""
import time

import numpy as np
from sklearn import ensemble
from sklearn import multioutput

from bindjax.complexity import data as data_lib
from bindjax.complexity import families
from bindjax.complexity import fit_programs

TREE_MODELS = ("random_forest", "gradient_boosting")


def make_regressor(kind, num_estimators, seed=0):
  """An sklearn multi-output regressor of the given kind."""
  if kind == "random_forest":
    return ensemble.RandomForestRegressor(n_estimators=num_estimators, random_state=seed,
                                          n_jobs=1)
  if kind == "gradient_boosting":
    return multioutput.MultiOutputRegressor(ensemble.HistGradientBoostingRegressor(
        max_iter=num_estimators, random_state=seed))
  raise ValueError(f"tree model {kind!r}: expected one of {TREE_MODELS}")


def fit_trees(kind, data, probes, fractions, seeds, num_estimators, similarity="dot"):
  """Fits one tree model per (fraction, seed) and scores it like the neural approximators.

  Returns result rows with the same keys as `grid_fits.fit_grid` rows (history of one
  evaluation, after fitting).
  """
  values = np.asarray(data.values_NxKxC)
  targets = np.asarray(data.targets_NxD)
  features = np.asarray(families.one_hot_slots(values, data.labels.values_per_concept))
  points = data_lib.make_points(data.num_unique, fractions, seeds, [0.0] * len(fractions))
  rows = []
  for m, (fraction, seed) in enumerate(zip(fractions, seeds)):
    masks = np.asarray(data_lib.scene_masks(data.object_ids_NxK, points.permutation_MxU[m],
                                            points.num_train_M[m]))
    start = time.perf_counter()
    regressor = make_regressor(kind, num_estimators, seed)
    regressor.fit(features[masks[0]], targets[masks[0]])
    pred = regressor.predict(features).astype(np.float32)
    fit_s = time.perf_counter() - start
    metrics = {k: np.asarray(v) for k, v in fit_programs.evaluate_predictions(
        pred, data, probes, masks, similarity).items()}
    test = data_lib.MASKS.index("test_only")
    row = {
        "family": kind, "name": kind, "widths": [], "learned_w": False, "embed_dim": 0,
        "num_parameters": None, "train_fraction": float(fraction), "seed": int(seed),
        "learning_rate": None, "schedule": None, "steps": None,
        "num_train_objects": int(points.num_train_M[m]),
        **{f"num_{mask}_scenes": int(masks[k].sum())
           for k, mask in enumerate(data_lib.MASKS)},
        "best_test_object_acc": float(metrics["object_acc"][test]), "best_step": None,
        "final_step": None,
        "test_concept_acc_at_best": float(metrics["concept_acc"][test]),
        "best_test_concept_acc": float(metrics["concept_acc"][test]),
        "best_test_r2": float(metrics["r2"][test]), "final_train_loss": float(
            metrics["mse"][0]), "diverged": False, "fit_s": fit_s,
    }
    for key in ("concept_acc", "object_acc", "mse", "r2"):
      for k, mask in enumerate(data_lib.MASKS):
        row[f"final_{mask}_{key}"] = float(metrics[key][k])
    row["history"] = {key: [value.tolist()] for key, value in metrics.items()}
    rows.append(row)
  return rows
