"""The `bindjax complexity` analysis: frozen probes, the batch-fitted grid, optional trees, and
the result files (docs/complexity.md).

`run(config, workdir)` writes workdir/results.json (config, probe source, timings, fit rows with
histories, the summary over seeds), workdir/results.csv (one row per fit), workdir/summary.csv
(median and spread over seeds per model and train fraction) and workdir/complexity.png; with
`description_length=True` also workdir/description_length.json and .csv (one row per model and
seed; docs/complexity.md, "Description length").
"""
import dataclasses
import os
import time

import jax.numpy as jnp
import numpy as np

from bindjax import config_values
from bindjax import embeddings
from bindjax import errors
from bindjax import files
from bindjax import parallel
from bindjax import progress as progress_lib
from bindjax.complexity import data as data_lib
from bindjax.complexity import description_length
from bindjax.complexity import families
from bindjax.complexity import figure
from bindjax.complexity import fitting
from bindjax.complexity import results
from bindjax.complexity import trees
from bindjax.probes import linear

RESULTS_FILE = "results.json"
# Object splits of the grid: "random" draws one per train fraction and seed; "coverage" uses the
# set's own coverage split (a set extracted from a trained model, data_lib.recorded_split).
SPLITS = ("random", "coverage")
OUTPUT_FILES = (RESULTS_FILE, "results.csv", "summary.csv", "complexity.png")
DESCRIPTION_LENGTH_FILES = ("description_length.json", "description_length.csv")


def frozen_probes(embedding_set, source="auto", probe_config=None, progress=False):
  """Probe weights that score predictions: stored ones or freshly fitted on all scenes.

  source: "stored" (EmbeddingSet.probes, error if missing), "fit", or "auto" (stored when the
  set has every head, else fit). Fitted probes use all scenes, as the original scores with
  probes of the full set. Returns (ProbeWeights, description string).
  """
  vpc = tuple(embedding_set.values_per_concept)
  heads = [f"concept_{c}" for c in range(len(vpc))] + ["object"]
  stored = embedding_set.probes or {}
  has_all = all(h in stored for h in heads)
  if source == "stored" or (source == "auto" and has_all):
    return linear.probes_to_weights(stored, vpc), "stored"
  if source not in ("auto", "fit"):
    raise ValueError(f"probes={source!r}: expected 'auto', 'stored' or 'fit'")
  probe_config = probe_config or linear.ProbeConfig()
  labels = linear.labels_from_set(embedding_set)
  n = embedding_set.embeddings.shape[0]
  bar, on_chunk = progress_lib.loss_bar(probe_config.steps, "step", progress)
  try:
    weights, _ = linear.fit_probes(embedding_set.embeddings, labels, np.ones(n, bool),
                                   probe_config, on_chunk)
  finally:
    bar.close()
  if probe_config.similarity == "cosine":  # Rank-equivalent dot probes (see weights_to_probes).
    weights = linear.probes_to_weights(linear.weights_to_probes(weights, vpc, "cosine"), vpc)
  return weights, f"fit on all {n} scenes, {probe_config.steps} steps"


def fit_config_from(config):
  """FitConfig of a complexity ConfigDict (ValueError naming a bad field)."""
  return fitting.FitConfig(steps=int(config.steps), eval_every=int(config.eval_every),
                           schedule=config.schedule, probe_similarity="dot",
                           eval_cadence=config.eval_cadence,
                           restarts=int(config.restarts),
                           restart_steps=int(config.restart_steps),
                           restart_holdout=float(config.restart_holdout),
                           standardize=bool(config.standardize),
                           weight_decay=config.weight_decay).validate()


def code_config_from(config):
  """CodeConfig of a complexity ConfigDict's dl_* fields (ValueError naming a bad field)."""
  try:
    return description_length.CodeConfig(
        block_fractions=tuple(config.dl_block_fractions), restarts=int(config.dl_restarts),
        precision=float(config.dl_precision)).validate()
  except ValueError as e:  # The messages start with the CodeConfig field's name.
    raise ValueError(f"dl_{e}") from None


def run_description_length(models, data, probes, config, fit_config, code_config, workdir,
                           log=print, progress=True):
  """Measures the description length of every model and seed; writes DESCRIPTION_LENGTH_FILES
  to workdir and returns the rows."""
  points, _ = description_length.candidates(data.num_unique, config.seeds, config.learning_rates,
                                            code_config)
  num_fits = len(points.num_train_M)
  bar, on_eval = progress_lib.loss_bar(len(models) * num_fits * fit_config.steps, "model-step",
                                       progress)
  start = time.perf_counter()
  try:
    rows = description_length.measure(
        models, data, config.seeds, config.learning_rates, code_config, fit_config, probes,
        chunk_size=parallel.chunk_setting(config.chunk_size),
        memory_bytes=int(config.memory_bytes) or None, on_eval=on_eval)
  finally:
    bar.close()
  seconds = time.perf_counter() - start
  for row in rows:
    log(f"{row['name']:>20} seed={row['seed']}: description length {row['bits_per_scene']:.1f} "
        f"bits/scene ({row['total_bits']:.0f} bits, {row['num_scenes']} scenes; baseline "
        f"{row['baseline_bits_per_scene']:.1f}), {row['num_parameters']} parameters")
  json_file, csv_file = (os.path.join(workdir, name) for name in DESCRIPTION_LENGTH_FILES)
  files.write_atomic(csv_file, results.rows_to_csv(rows, description_length.CSV_COLUMNS))
  files.write_json(json_file, files.to_jsonable({
      "code_config": dataclasses.asdict(code_config), "steps": fit_config.steps,
      "schedule": fit_config.schedule, "learning_rates": list(config.learning_rates),
      "fits_per_model": num_fits, "seconds": seconds, "rows": rows}), indent=1)
  log(f"description length: wrote {json_file} and {csv_file}")
  return rows


def run(config, workdir, embedding_set=None, log=print, progress=True):
  """The `bindjax complexity` flow; writes the result files and returns the fit rows.

  A bad config value raises errors.ConfigError (before any fit); bad input data ValueError (docs/cli.md).
  Replaces earlier results in `workdir` (the command refuses a non-empty one first).
  """
  results_path = os.path.join(workdir, RESULTS_FILE)
  with errors.config_errors():
    fit_config = fit_config_from(config)
    chunk_size = parallel.chunk_setting(config.chunk_size)
    code_config = code_config_from(config) if config.get("description_length") else None
    split_kind = config.get("split", "random")
    if split_kind not in SPLITS:
      raise ValueError(f"split={split_kind!r}: expected one of {SPLITS}")
    if split_kind == "coverage" and (config.trees or code_config is not None):
      raise ValueError("split='coverage' fits the grid's models only; set trees=False and "
                       "description_length=False")
  if embedding_set is None:
    embedding_set = embeddings.read_embeddings(config.embeddings)
  vpc = tuple(embedding_set.values_per_concept)
  with errors.config_errors():
    models = families.parse_models(config.models, vpc, embedding_set.objects.shape[1],
                                   embedding_set.embeddings.shape[1], int(config.embed_dim))
  start = time.perf_counter()
  if config.probes_file:
    probes, probe_source = linear.weights_from_file(config.probes_file, vpc), config.probes_file
  else:
    probe_config = linear.ProbeConfig(steps=int(config.probe_steps),
                                      similarity=config.probe_similarity)
    probes, probe_source = frozen_probes(embedding_set, config.probes, probe_config, progress)
  probe_s = time.perf_counter() - start
  data, _ = data_lib.from_set(embedding_set)
  split = data_lib.recorded_split(embedding_set) if split_kind == "coverage" else None
  all_rows = np.ones(data.num_scenes, bool)
  probe_check = {
      k: float(np.asarray(v)[0]) for k, v in fitting.evaluate_predictions(
          data.targets_NxD, data, probes, jnp.asarray(np.stack([all_rows] * 3))).items()
      if k in ("concept_acc", "object_acc")}
  log(f"probes ({probe_source}) on the real {data.num_scenes} K-object scenes: concept acc "
      f"{probe_check['concept_acc']:.3f}, object acc {probe_check['object_acc']:.3f}")
  with errors.config_errors():
    fractions = config.train_fractions if split is None else (split[1] / data.num_unique,)
    entries = [dataclasses.replace(e, split=split) for e in fitting.grid_entries(
        models, fractions, config.seeds, config.learning_rates)]
  start = time.perf_counter()
  bar, on_eval = progress_lib.loss_bar(len(entries) * fitting.eval_steps(fit_config)[-1],
                                   "model-step", progress)
  try:
    rows, infos = fitting.fit_grid(entries, data, probes, fit_config, chunk_size=chunk_size,
                                   memory_bytes=int(config.memory_bytes) or None,
                                   on_eval=on_eval)
  finally:
    bar.close()
  grid_s = time.perf_counter() - start
  if config.trees:
    for kind in config_values.names(config.tree_models, "tree_models"):
      fractions = [f for f in config.train_fractions for _ in config.seeds]
      seeds = [s for _ in config.train_fractions for s in config.seeds]
      rows += trees.fit_trees(kind, data, probes, fractions, seeds, int(config.tree_estimators))
  for row in rows:
    log(f"{row['name']:>20} f={row['train_fraction']:.2f} seed={row['seed']}: best test-only "
        f"object acc {row['best_test_object_acc']:.3f} (concept acc "
        f"{row['test_concept_acc_at_best']:.3f}); test-only R² best {row['best_test_r2']:.3f}, "
        f"final {row['final_test_only_r2']:.3f} (the original reports the final)")
  if code_config is not None:
    run_description_length(models, data, probes, config, fit_config, code_config, workdir, log,
                           progress)
  summary_rows = results.summarize_seeds(rows)
  summary = {
      "config": config.to_dict(), "embeddings": embedding_set.provenance,
      "num_scenes": data.num_scenes, "num_objects": data.num_unique, "split": split_kind,
      "probes": probe_source, "probe_accuracy_on_real": probe_check, "probe_s": probe_s,
      "grid_s": grid_s, "eval_steps": fitting.eval_steps(fit_config), "buckets": infos,
      "masks": list(data_lib.MASKS), "summary": summary_rows, "rows": rows,
  }
  files.write_atomic(os.path.join(workdir, "results.csv"), results.rows_to_csv(rows))
  files.write_atomic(os.path.join(workdir, "summary.csv"),
                     results.rows_to_csv(summary_rows, results.SUMMARY_COLUMNS))
  figure.save_figure(rows, os.path.join(workdir, "complexity.png"))
  files.write_json(results_path, files.to_jsonable(summary), indent=1)
  return rows
