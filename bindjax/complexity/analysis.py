"""The `bindjax complexity` analysis: frozen probes, the batch-fitted grid, optional trees, and
the result files (docs/complexity.md).

`run(settings, workdir)` writes workdir/results.json (config, probe source, timings, fit rows with
histories, the summary over seeds), workdir/results.csv (one row per fit), workdir/summary.csv
(median and spread over seeds per model and train fraction) and workdir/complexity.png; with
`description_length=True` also workdir/description_length.json and .csv (one row per model and
seed; docs/complexity.md, "Description length"). Its settings are a `ComplexityConfig`, whose
dataclasses hold every default; `to_config` spells them as the flat ConfigDict that `--config`
overrides, and `settings_from` reads one back (presets: experiments/complexity.py).
"""
import dataclasses
import os
import time

import jax.numpy as jnp
import ml_collections
import numpy as np

from bindjax.base import config_values
from bindjax.base import errors
from bindjax.base import files
from bindjax.base import progress as progress_lib
from bindjax.complexity import data as data_lib
from bindjax.complexity import description_length as description_length_lib
from bindjax.complexity import families
from bindjax.complexity import figure
from bindjax.complexity import fit_programs
from bindjax.complexity import fit_settings
from bindjax.complexity import fitting
from bindjax.complexity import grid_fits
from bindjax.complexity import results
from bindjax.complexity import trees
from bindjax.frozen import embeddings
from bindjax.frozen.probes import linear
from bindjax.frozen.probes import probe_analysis

RESULTS_FILE = "results.json"
# Object splits of the grid: "random" draws one per train fraction and seed; "coverage" uses the
# set's own coverage split (a set extracted from a trained model, data_lib.recorded_split).
SPLITS = ("random", "coverage")
# Where the frozen probes come from (`frozen_probes`).
PROBE_SOURCES = ("auto", "stored", "fit")
OUTPUT_FILES = (RESULTS_FILE, "results.csv", "summary.csv", "complexity.png")
DESCRIPTION_LENGTH_FILES = ("description_length.json", "description_length.csv")
# The config spells the frozen probes' fit as probe_<field> and the code as dl_<field>; every
# FitConfig field but the probe similarity, which frozen_probes fixes, has its own name.
PROBE_FIELDS = ("steps", "similarity")
PROBE_PREFIX, CODE_PREFIX = "probe_", "dl_"
SECTIONS = ("fit", "probe", "code")


@dataclasses.dataclass(frozen=True)
class ComplexityConfig(fit_settings.EngineConfig):
  """Settings of `bindjax complexity` (docs/complexity.md): the grid, each fit's FitConfig, the
  frozen probes' fit and the prequential code."""
  embeddings: str = ""          # the embedding set's directory
  probes: str = "auto"          # PROBE_SOURCES
  probes_file: str = ""         # a probes.npz of `bindjax probe`, instead of `probes`
  # A comma string, not a tuple: ml_collections cannot parse "mlp:64,product" as a tuple
  # override (the colon), and a comma list is what a researcher types.
  models: str = "mlp:1024,product,sum_product"
  train_fractions: tuple = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)   # for split "random"
  split: str = "random"         # SPLITS
  seeds: tuple = (0,)           # object split and initialisation of each fit
  learning_rates: tuple = (fit_settings.LEARNING_RATE,)
  trees: bool = False           # also fit tree approximators (bindjax.complexity.trees)
  tree_models: str = "random_forest"   # comma string, like models
  tree_estimators: int = 100
  description_length: bool = False     # also measure every model's description length
  fit: fit_settings.FitConfig = fit_settings.FitConfig()
  probe: linear.ProbeConfig = linear.ProbeConfig()
  code: description_length_lib.CodeConfig = description_length_lib.CodeConfig()

  def validate(self):
    """Returns self; ValueError naming the bad field (as the config spells it)."""
    super().validate()
    self.fit.validate()
    self.probe.validate()
    if self.description_length:
      try:
        self.code.validate()
      except ValueError as e:  # The messages start with the CodeConfig field's name.
        raise ValueError(f"{CODE_PREFIX}{e}") from None
    if self.probes not in PROBE_SOURCES:
      raise ValueError(f"probes={self.probes!r}: expected one of {PROBE_SOURCES}")
    if self.split not in SPLITS:
      raise ValueError(f"split={self.split!r}: expected one of {SPLITS}")
    if self.split == "coverage" and (self.trees or self.description_length):
      raise ValueError("split='coverage' fits the grid's models only; set trees=False and "
                       "description_length=False")
    return self


def to_config(settings):
  """The ConfigDict spelling of ComplexityConfig `settings` (flat: docs/complexity.md)."""
  return ml_collections.ConfigDict({
      **config_values.fields(settings, exclude=SECTIONS),
      **config_values.fields(settings.fit, exclude=("probe_similarity",)),
      **config_values.fields(settings.probe, PROBE_PREFIX, only=PROBE_FIELDS),
      **config_values.fields(settings.code, CODE_PREFIX)})


def default_config():
  """The ConfigDict of the default settings (presets: experiments/complexity.py)."""
  return to_config(ComplexityConfig())


def settings_from(config):
  """The validated ComplexityConfig of a complexity ConfigDict; ValueError naming a bad field."""
  values = config.to_dict()
  # Frozen probes always score as dot products (frozen_probes turns cosine probes into those).
  fit = config_values.pop_settings(fit_settings.FitConfig, values, probe_similarity="dot")
  probe = config_values.pop_settings(linear.ProbeConfig, values, PROBE_PREFIX)
  code = config_values.pop_settings(description_length_lib.CodeConfig, values, CODE_PREFIX)
  settings = config_values.pop_settings(ComplexityConfig, values, fit=fit, probe=probe,
                                        code=code)
  config_values.check_all_used(values, "config.")
  return settings.validate()


def frozen_probes(embedding_set, source, probe_config, progress=False):
  """Probe weights that score predictions: stored ones or freshly fitted on all scenes.

  source (PROBE_SOURCES): "stored" (EmbeddingSet.probes, error if missing), "fit", or "auto"
  (stored when the set has every head, else fit). Fitted probes use all scenes, as the original
  scores with probes of the full set. Returns (ProbeWeights, description string).
  """
  vpc = tuple(embedding_set.values_per_concept)
  heads = [f"concept_{c}" for c in range(len(vpc))] + ["object"]
  stored = embedding_set.probes or {}
  has_all = all(h in stored for h in heads)
  if source == "stored" or (source == "auto" and has_all):
    return linear.probes_to_weights(stored, vpc), "stored"
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


def run_description_length(models, data, probes, settings, workdir, log=print, progress=True):
  """Measures the description length of every model and seed; writes DESCRIPTION_LENGTH_FILES
  to workdir and returns the rows."""
  fit_config, code_config = settings.fit, settings.code
  points, _ = description_length_lib.candidates(data.num_unique, settings.seeds,
                                                settings.learning_rates, code_config)
  num_fits = len(points.num_train_M)
  bar, on_eval = progress_lib.loss_bar(len(models) * num_fits * fit_config.steps, "model-step",
                                       progress)
  start = time.perf_counter()
  try:
    rows = description_length_lib.measure(
        models, data, settings.seeds, settings.learning_rates, code_config, fit_config, probes,
        chunk_size=settings.chunks, memory_bytes=settings.memory, on_eval=on_eval)
  finally:
    bar.close()
  seconds = time.perf_counter() - start
  for row in rows:
    log(f"{row['name']:>20} seed={row['seed']}: description length {row['bits_per_scene']:.1f} "
        f"bits/scene ({row['total_bits']:.0f} bits, {row['num_scenes']} scenes; baseline "
        f"{row['baseline_bits_per_scene']:.1f}), {row['num_parameters']} parameters")
  json_file, csv_file = (os.path.join(workdir, name) for name in DESCRIPTION_LENGTH_FILES)
  files.write_atomic(csv_file, results.rows_to_csv(rows, description_length_lib.CSV_COLUMNS))
  files.write_json(json_file, files.to_jsonable({
      "code_config": dataclasses.asdict(code_config), "steps": fit_config.steps,
      "schedule": fit_config.schedule, "learning_rates": list(settings.learning_rates),
      "fits_per_model": num_fits, "seconds": seconds, "rows": rows}), indent=1)
  log(f"description length: wrote {json_file} and {csv_file}")
  return rows


def run(settings, workdir, embedding_set=None, log=print, progress=True):
  """The `bindjax complexity` flow for a validated ComplexityConfig (`settings_from`); writes
  the result files and returns the fit rows.

  A setting the data cannot serve (a model of the wrong shape) raises errors.ConfigError, bad
  input data ValueError (docs/cli.md). Replaces earlier results in `workdir` (the command
  refuses a non-empty one first).
  """
  if embedding_set is None:
    embedding_set = embeddings.read_embeddings(settings.embeddings)
  vpc = tuple(embedding_set.values_per_concept)
  with errors.config_errors():
    models = families.parse_models(settings.models, vpc, embedding_set.objects.shape[1],
                                   embedding_set.embeddings.shape[1], settings.embed_dim)
  start = time.perf_counter()
  if settings.probes_file:
    probes = probe_analysis.weights_from_file(settings.probes_file, vpc)
    probe_source = settings.probes_file
  else:
    probes, probe_source = frozen_probes(embedding_set, settings.probes, settings.probe, progress)
  probe_s = time.perf_counter() - start
  data, _ = data_lib.from_set(embedding_set)
  split = data_lib.recorded_split(embedding_set) if settings.split == "coverage" else None
  probe_check = _probe_check(data, probes)
  log(f"probes ({probe_source}) on the real {data.num_scenes} K-object scenes: concept acc "
      f"{probe_check['concept_acc']:.3f}, object acc {probe_check['object_acc']:.3f}")
  with errors.config_errors():
    fractions = settings.train_fractions if split is None else (split[1] / data.num_unique,)
    entries = [dataclasses.replace(e, split=split) for e in grid_fits.grid_entries(
        models, fractions, settings.seeds, settings.learning_rates)]
  fit_config = settings.fit
  start = time.perf_counter()
  bar, on_eval = progress_lib.loss_bar(len(entries) * fitting.eval_steps(fit_config)[-1],
                                       "model-step", progress)
  try:
    rows, infos = grid_fits.fit_grid(entries, data, probes, fit_config,
                                     chunk_size=settings.chunks, memory_bytes=settings.memory,
                                     on_eval=on_eval)
  finally:
    bar.close()
  grid_s = time.perf_counter() - start
  if settings.trees:
    for kind in config_values.names(settings.tree_models, "tree_models"):
      fractions = [f for f in settings.train_fractions for _ in settings.seeds]
      seeds = [s for _ in settings.train_fractions for s in settings.seeds]
      rows += trees.fit_trees(kind, data, probes, fractions, seeds, settings.tree_estimators)
  for row in rows:
    log(_row_line(row))
  if settings.description_length:
    run_description_length(models, data, probes, settings, workdir, log, progress)
  summary_rows = results.summarize_seeds(rows)
  summary = {
      "config": to_config(settings).to_dict(), "embeddings": embedding_set.provenance,
      "num_scenes": data.num_scenes, "num_objects": data.num_unique, "split": settings.split,
      "probes": probe_source, "probe_accuracy_on_real": probe_check, "probe_s": probe_s,
      "grid_s": grid_s, "eval_steps": fitting.eval_steps(fit_config), "buckets": infos,
      "masks": list(data_lib.MASKS), "summary": summary_rows, "rows": rows,
  }
  _write_outputs(workdir, rows, summary)
  return rows


def _probe_check(data, probes):
  """The probes' concept and object accuracy on the real embeddings of every scene."""
  all_rows = np.ones(data.num_scenes, bool)
  return {
      k: float(np.asarray(v)[0]) for k, v in fit_programs.evaluate_predictions(
          data.targets_NxD, data, probes, jnp.asarray(np.stack([all_rows] * 3))).items()
      if k in ("concept_acc", "object_acc")}


def _row_line(row):
  """The log line of one fit's row."""
  return (f"{row['name']:>20} f={row['train_fraction']:.2f} seed={row['seed']}: best test-only "
          f"object acc {row['best_test_object_acc']:.3f} (concept acc "
          f"{row['test_concept_acc_at_best']:.3f}); test-only R² best "
          f"{row['best_test_r2']:.3f}, final {row['final_test_only_r2']:.3f} (the original "
          "reports the final)")


def _write_outputs(workdir, rows, summary):
  """results.csv, summary.csv, complexity.png and the results JSON of a run."""
  files.write_atomic(os.path.join(workdir, "results.csv"), results.rows_to_csv(rows))
  files.write_atomic(os.path.join(workdir, "summary.csv"),
                     results.rows_to_csv(summary["summary"], results.SUMMARY_COLUMNS))
  figure.save_figure(rows, os.path.join(workdir, "complexity.png"))
  files.write_json(os.path.join(workdir, RESULTS_FILE), files.to_jsonable(summary), indent=1)
