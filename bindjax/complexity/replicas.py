"""Every replica's binding function: the approximator families fitted to each replica of a sweep
on its own coverage split, beside the replica's held-out accuracy (docs/binding.md).

`run(settings, workdir, out, step)` is the `bindjax binding` flow, for a `BindingConfig` (whose
dataclasses hold every default; `to_config` and `settings_from` turn it into the ConfigDict
`--config` overrides and back; presets: experiments/binding.py). Per bucket of the sweep, one
checkpoint restore gives every replica's parameters (best or final, `extract.load_bucket`), one
vmapped forward pass embeds every two-object scene of the bucket's objects with each replica's
scene tower and gives each replica's concept and object probe vectors from its query tower
(`extract.encode_replicas`). Then every family is fitted to every replica's embeddings by the
complexity engine (`grid_fits.fit_grid` with `own` targets): one fit per replica, trained on the
scenes of that replica's training objects and scored by that replica's probes, so test-only
scenes hold only objects the replica never saw. Fits of one family in a bucket run as one
compiled batch per training-count group (`grid_fits.batches_by_count`).

Replicas that diverged in training, or have no evaluation at the chosen step, are reported with
that status and not fitted. Outputs (OUT): results.json (config, timings, every row, the rank
correlations), results.csv (one row per replica and family), correlations.md, the figure
binding_fits.png/.pdf and, with `save_embeddings`, each fitted replica's embedding set under
embeddings/replica_NNNN (as `bindjax extract --objects=all` writes it).
"""
import dataclasses
import time

import jax
import ml_collections
import numpy as np
from scipy import stats

from bindjax.base import config_values
from bindjax.base import errors
from bindjax.base import files
from bindjax.base import progress as progress_lib
from bindjax.complexity import data as data_lib
from bindjax.complexity import families
from bindjax.complexity import fit_settings
from bindjax.complexity import fitting
from bindjax.complexity import grid_fits
from bindjax.complexity import results as complexity_results
from bindjax.frozen import extract
from bindjax.frozen.probes import linear
from bindjax.reporting import metrics
from bindjax.runtime import engine
from bindjax.runtime import parallel
from bindjax.workdir import layout
from bindjax.workdir import results

RESULTS_FILE = "results.json"
CSV_FILE = "results.csv"
CORRELATIONS_FILE = "correlations.md"
FIGURE_STEM = "binding_fits"
EMBEDDINGS_DIR = "embeddings"
STATUSES = ("fitted", "diverged", "not_evaluated")
# The held-out figure the fits are compared with, and the fit quality on the x axis.
ACCURACY_COLUMN = results.object_accuracy(results.HELDOUT, results.MAX_K)
QUALITY_COLUMN = "final_test_only_r2"
# Replica columns from the sweep: its coordinates, then metrics of its evaluation row.
REPLICA_COLUMNS = results.COORDINATES
# Row name -> the sweep's metric: its name, with results.MAX_K for the replica's own K.
SWEEP_METRICS = {metric.replace(results.ROW_K, results.MAX_K): metric for metric in (
    results.SELECTION_METRIC, metrics.BINDING_METRIC, results.binding(results.HELDOUT),
    metrics.CONCEPT_METRIC, results.object_accuracy(results.TRAIN, results.ROW_K),
    results.binding(results.TRAIN))}
# Fit columns of a complexity row kept per replica and family.
FIT_COLUMNS = (
    "name", "family", "num_parameters", "steps", "solver", "restarts", "identified",
    "identified_share", "num_train_only_scenes",
    "num_test_only_scenes", "num_mixed_scenes", "final_train_loss", "best_test_r2",
    "best_test_object_acc", *[f"final_{m}_{k}" for k in ("r2", "object_acc", "concept_acc", "mse")
                              for m in data_lib.MASKS])
CSV_COLUMNS = (*REPLICA_COLUMNS, "status", results.STEP, "checkpoint", results.DIVERGED_STEP,
               *SWEEP_METRICS, "fit_learning_rate", "fit_seed", *FIT_COLUMNS, "fit_diverged")


@dataclasses.dataclass(frozen=True)
class BindingConfig(fit_settings.EngineConfig):
  """Settings of `bindjax binding` (docs/binding.md): the families fitted to every replica, one
  FitConfig and learning rate for all of them, and the encoding and statistics around the fits."""
  models: str = "additive,sum_product,per_object_sum_product,mlp:1024"   # comma string
  learning_rate: float = fit_settings.LEARNING_RATE
  fit_seed: int = 0             # the initialisation key of every fit
  fit: fit_settings.FitConfig = fit_settings.FitConfig()
  # Fits of one family whose training counts are within this factor run as one compiled batch
  # (inf: one batch per family and bucket, every replica padded to the largest count).
  pad_ratio: float = grid_fits.PAD_RATIO
  encode_batch: int = 1024      # scenes per replica per forward pass
  # CPU hosts: 0 JAX's default device; -1 one single-threaded device per core, as
  # config.sweep.cpu_devices of a sweep, under which the coordinate solver's first solve was
  # seen to wait without computing (docs/findings/binding_fits.md).
  cpu_devices: int = 0
  bootstrap: int = 1000         # resamples of the replicas for the interval of Spearman's ρ
  save_embeddings: bool = False   # also write every fitted replica's embedding set

  def validate(self):
    """Returns self; ValueError naming the bad field (as the config spells it)."""
    super().validate()
    try:
      self.fit.validate()
    except ValueError as e:
      raise ValueError(f"fit.{e}") from None
    self.model_names()
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate={self.learning_rate}: expected > 0")
    if not self.pad_ratio >= 1:
      raise ValueError(f"pad_ratio={self.pad_ratio}: expected ≥ 1 (inf: one batch)")
    for name in ("encode_batch", "bootstrap"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: expected ≥ 1")
    return self

  def model_names(self):
    """[(name, family)] of the models, in config order; ValueError naming a bad model."""
    # Names and families do not depend on the shapes of the data.
    return [(m.name, m.family)
            for m in families.parse_models(self.models, (2, 2), 2, 2, self.embed_dim)]


def to_config(settings):
  """The ConfigDict spelling of BindingConfig `settings` (every FitConfig field under fit)."""
  c = ml_collections.ConfigDict(config_values.fields(settings, exclude=("fit",)))
  c.fit = ml_collections.ConfigDict(config_values.fields(settings.fit))
  return c


def default_config():
  """The ConfigDict of the default settings (presets: experiments/binding.py)."""
  return to_config(BindingConfig())


def settings_from(config):
  """The validated BindingConfig of a binding ConfigDict; ValueError naming a bad field."""
  values = config.to_dict()
  fit_values = values.pop("fit")
  fit = config_values.pop_settings(fit_settings.FitConfig, fit_values)
  config_values.check_all_used(fit_values, "config.fit.")
  settings = config_values.pop_settings(BindingConfig, values, fit=fit)
  config_values.check_all_used(values, "config.")
  return settings.validate()


def replica_evaluations(workdir, step):
  """{replica index: (status, evaluation row or None, diverged step or None)} of every replica
  of the sweep in workdir at `step` ("best" | "final"; `results.select_evaluations`)."""
  workdir = layout.Workdir(workdir)
  rows = workdir.read_rows()
  if not rows:
    raise ValueError(f"workdir {workdir}: no result rows in {layout.RESULTS_FILE}; run "
                     "`bindjax sweep` first")
  chosen = {r[results.REPLICA]: r for r in results.select_evaluations(rows, step)}
  diverged_at = results.diverged_steps(rows)
  out = {}
  for coordinates in workdir.read_replicas():
    index = coordinates[results.REPLICA]
    row = chosen.get(index)
    if index in diverged_at:
      status = "diverged"
    else:
      status = "fitted" if row is not None else "not_evaluated"
    out[index] = (status, row, diverged_at.get(index))
  return out


def stacked_probes(sets):
  """ProbeWeights of embedding sets' stored probes, stacked along a leading set axis."""
  weights = [linear.probes_to_weights(s.probes, tuple(s.values_per_concept)) for s in sets]
  return jax.tree_util.tree_map(lambda *x: np.stack(x), *weights)


def _take(tree, positions):
  return jax.tree_util.tree_map(lambda x: np.asarray(x)[positions], tree)


def _check_steps(loaded, positions, evaluations, step):
  for p in positions:
    replica = loaded.replicas[p]
    row_step = evaluations[replica.index][1][results.STEP]
    if int(loaded.steps[p]) != row_step:
      raise ValueError(
          f"replica {replica.index}: its {loaded.checkpoints[p]} parameters in the checkpoint are "
          f"from step {int(loaded.steps[p])} but its {step} evaluation in "
          f"{layout.RESULTS_FILE} is at step {row_step} (is the sweep finished; does it keep "
          "the best parameters, config.checkpoint.keep_best?)")


def _mesh(num_models, mesh):
  return mesh if mesh is not None else engine.auto_mesh(num_models)


def encode_bucket(loaded, positions, batch_size, mesh=None):
  """(embedding sets, seconds) of the replicas at `positions` of a TrainedBucket: every ordered
  pair of all objects through one vmapped forward pass of the replicas, sharded over the mesh."""
  space = loaded.space
  ids_U = np.arange(space.num_objects, dtype=np.int32)
  objects_NxKxC, num_objects_N = extract.pair_scenes(space, ids_U)
  mesh = _mesh(len(positions), mesh)
  start = time.perf_counter()
  params_R, _ = engine.place(_take(loaded.params, positions), mesh)
  z_RxNxD, probes = extract.encode_replicas(params_R, loaded.model, space, ids_U, objects_NxKxC,
                                            num_objects_N, batch_size)
  seconds = time.perf_counter() - start
  sets = [extract.embedding_set(loaded.trained(p), "all", ids_U, objects_NxKxC, num_objects_N,
                                z_RxNxD[i], {k: v[i] for k, v in probes.items()})
          for i, p in enumerate(positions)]
  return sets, seconds


def fit_replicas(sets, models, fit_config, learning_rate, fit_seed, mesh=None,
                 chunk_size=parallel.AUTO, memory_bytes=None, on_eval=None,
                 pad_ratio=grid_fits.PAD_RATIO):
  """Fits every model to every embedding set (one bucket's replicas: the same scenes) on the
  set's own coverage split, scored by the set's own probes. Returns (complexity rows, model-major
  then set order; fit infos). pad_ratio: as in `grid_fits.batches_by_count`."""
  data, rows = data_lib.from_set(sets[0])
  own = data_lib.own_targets(np.stack([s.embeddings[rows] for s in sets]), stacked_probes(sets))
  splits = [data_lib.recorded_split(s) for s in sets]
  entries = [grid_fits.GridEntry(model, split[1] / data.num_unique, fit_seed, learning_rate,
                                 split=split, own_index=i)
             for model in models for i, split in enumerate(splits)]
  return grid_fits.fit_grid(entries, data, None, fit_config, mesh, chunk_size, memory_bytes,
                            on_eval, own=own, pad_ratio=pad_ratio)


def replica_row(coordinates, status, evaluation, diverged_step):
  """The replica part of a result row: coordinates, status and its sweep metrics."""
  row = {k: coordinates.get(k) for k in REPLICA_COLUMNS}
  row.update({"status": status, results.DIVERGED_STEP: diverged_step,
              results.STEP: None if evaluation is None else evaluation[results.STEP]})
  for name, metric in SWEEP_METRICS.items():
    row[name] = None if evaluation is None else results.metric_value(evaluation, metric)
  return row


def fit_part(fit, fit_config, learning_rate, fit_seed):
  """The fit part of a result row; metrics of a mask without scenes are None, not 0 or 1."""
  part = {k: fit.get(k) for k in FIT_COLUMNS}
  for mask in data_lib.MASKS:
    if not fit[f"num_{mask}_scenes"]:
      for key in ("r2", "object_acc", "concept_acc", "mse"):
        part[f"final_{mask}_{key}"] = None
      if mask == "test_only":
        part["best_test_r2"] = part["best_test_object_acc"] = None
  part.update(fit_learning_rate=learning_rate, fit_seed=fit_seed, fit_diverged=fit["diverged"],
              steps=fit_config.steps)
  return part


def rank_correlation(x, y, num_bootstrap, level=0.95, seed=0):
  """Spearman's ρ of the finite pairs (x, y) and its percentile bootstrap interval over
  resampled pairs: {"rho", "interval", "num_points"}; ρ None with fewer than 3 pairs or a
  constant side, interval None when fewer than half the resamples give a ρ."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  keep = np.isfinite(x) & np.isfinite(y)
  x, y = x[keep], y[keep]
  out = {"rho": None, "interval": None, "num_points": int(x.size)}
  if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
    return out
  out["rho"] = float(stats.spearmanr(x, y).statistic)
  rng = np.random.default_rng(seed)
  samples = []
  for _ in range(num_bootstrap):
    pick = rng.integers(0, x.size, x.size)
    if np.ptp(x[pick]) > 0 and np.ptp(y[pick]) > 0:
      samples.append(stats.spearmanr(x[pick], y[pick]).statistic)
  if len(samples) >= num_bootstrap / 2:
    tail = 50 * (1 - level)
    out["interval"] = [float(v) for v in np.percentile(samples, [tail, 100 - tail])]
  return out


def centred_ranks(values, groups):
  """Each value's rank among the values of its group (ties averaged), minus the group's mean
  rank: what is left of a ranking once the groups' own levels are taken out. NaN stays NaN."""
  values, groups = np.asarray(values, np.float64), np.asarray(groups)
  out = np.full(values.shape, np.nan)
  for group in np.unique(groups):
    members = np.flatnonzero((groups == group) & np.isfinite(values))
    ranks = stats.rankdata(values[members])
    out[members] = ranks - ranks.mean()
  return out


def correlations(rows, num_bootstrap):
  """Per fitted model name: rank_correlation of ACCURACY_COLUMN against QUALITY_COLUMN over the
  fitted replicas, the same within coverage (ranks centred per object-space size and coverage,
  `centred_ranks`: the association left once size and coverage, which move both, are taken
  out), and of ACCURACY_COLUMN against the train-only R² (a control)."""
  names = list(dict.fromkeys(r["name"] for r in rows if r["status"] == "fitted"))
  out = []
  for name in names:
    fitted = [r for r in rows if r["name"] == name and r["status"] == "fitted"]
    column = lambda key, fitted=fitted: [np.nan if r[key] is None else r[key] for r in fitted]
    coverage = [f"{r.get('space_size')}/{r['coverage']}" for r in fitted]
    out.append({"name": name, "family": fitted[0]["family"],
                "test_only": rank_correlation(column(QUALITY_COLUMN), column(ACCURACY_COLUMN),
                                              num_bootstrap),
                "within_coverage": rank_correlation(
                    centred_ranks(column(QUALITY_COLUMN), coverage),
                    centred_ranks(column(ACCURACY_COLUMN), coverage), num_bootstrap),
                "train_only": rank_correlation(column("final_train_only_r2"),
                                               column(ACCURACY_COLUMN), num_bootstrap)})
  return out


def correlations_markdown(table, step):
  """The correlation table as Markdown."""
  def cell(c):
    if c["rho"] is None:
      return f"– ({c['num_points']} replicas)"
    interval = "" if c["interval"] is None else (
        f" [{c['interval'][0]:.2f}, {c['interval'][1]:.2f}]")
    return f"{c['rho']:.2f}{interval} ({c['num_points']})"
  lines = [f"# Held-out accuracy vs fit quality ({step} step)", "",
           f"Spearman's ρ of the replicas' `{ACCURACY_COLUMN}` against each fit's R², 95% "
           "bootstrap interval over replicas, (replicas); within coverage: the same of ranks "
           "centred per object-space size and coverage.", "",
           "| approximator | test-only R² | test-only R², within coverage | train-only R² |",
           "|---|---|---|---|"]
  for row in table:
    lines.append(f"| {row['name']} | {cell(row['test_only'])} | "
                 f"{cell(row['within_coverage'])} | {cell(row['train_only'])} |")
  return "\n".join(lines) + "\n"


def _fit_bucket(workdir, run_info, bucket, positions, evaluations, step, settings, mesh, on_eval,
                log):
  """Encodes and fits the replicas at `positions` of a bucket. Returns ({replica index:
  (checkpoint, fit rows in model order)}, timing dict, fit infos, embedding sets)."""
  if bucket.spec.space.max_objects != 2:
    raise ValueError(f"bucket {bucket.index}: max_objects={bucket.spec.space.max_objects}; "
                     "the analysis embeds two-object scenes and needs K = 2")
  start = time.perf_counter()
  loaded = extract.load_bucket(workdir, bucket.index, "best" if step == "best" else "latest",
                               run_info)
  _check_steps(loaded, positions, evaluations, step)
  extract.check_pairs(loaded.model, loaded.space)
  load_s = time.perf_counter() - start
  sets, encode_s = encode_bucket(loaded, positions, settings.encode_batch, mesh)
  with errors.config_errors():
    models = families.parse_models(settings.models, loaded.space.values_per_concept, 2,
                                   sets[0].dim, settings.embed_dim)
  start = time.perf_counter()
  fits, infos = fit_replicas(sets, models, settings.fit, settings.learning_rate,
                             settings.fit_seed, mesh, settings.chunks, settings.memory, on_eval,
                             settings.pad_ratio)
  fit_s = time.perf_counter() - start
  fitted = {s.provenance["replica"]: (s.provenance["checkpoint"], []) for s in sets}
  for fit, entry_set in zip(fits, sets * len(models)):   # fits: model-major, then set order
    fitted[entry_set.provenance["replica"]][1].append(
        fit_part(fit, settings.fit, settings.learning_rate, settings.fit_seed))
  timing = {"bucket": bucket.index, "replicas": len(positions),
            "space_size": loaded.space.num_objects, "num_scenes": sets[0].num_scenes,
            "load_s": load_s, "encode_s": encode_s, "fit_s": fit_s,
            "compile_s": sum(i["compile_s"] for i in infos)}
  log(f"bucket {bucket.index}: {len(positions)} replicas, |O| = {loaded.space.num_objects}, "
      f"{sets[0].num_scenes} scenes; load {load_s:.1f} s, encode {encode_s:.1f} s, "
      f"{len(models)} families fitted in {fit_s:.1f} s")
  return fitted, timing, infos, sets


def run(settings, workdir, out, step=results.DEFAULT_STEP, mesh=None, log=print, progress=True):
  """The `bindjax binding` flow on the sweep in `workdir` for a validated BindingConfig
  (`settings_from`); writes the outputs to `out` (made if needed; the caller refuses a non-empty
  one) and returns the summary dict.

  A setting the sweep cannot serve raises errors.ConfigError; bad or unusable sweep data
  ValueError; nothing is written before every bucket has been fitted. mesh: devices of the
  encoding and fits (default: `engine.auto_mesh` per batch).
  """
  names = settings.model_names()
  if step not in results.STEPS:
    raise errors.ConfigError(f"step={step!r}: expected one of {results.STEPS}")
  workdir = files.as_path(workdir)
  run_info = extract.read_buckets(workdir)
  _, replicas, buckets = run_info
  evaluations = replica_evaluations(workdir, step)
  for index, (status, _, _) in evaluations.items():
    if status != "fitted":
      log(f"replica {index}: {status}; not fitted")
  to_fit = [[p for p, r in enumerate(b.replicas) if evaluations[r.index][0] == "fitted"]
            for b in buckets]
  total = sum(map(len, to_fit)) * len(names) * fitting.eval_steps(settings.fit)[-1]
  bars = []   # the bar starts with the first fit step, so a refusal before it prints one line

  def on_eval(units_done, loss_M):
    if not bars:
      bars.append(progress_lib.loss_bar(total, "model-step", progress))
    bars[0][1](units_done, loss_M)

  fitted, timings, infos, saved = {}, [], [], []
  try:
    for bucket, positions in zip(buckets, to_fit):
      if positions:
        parts, timing, bucket_infos, sets = _fit_bucket(
            workdir, run_info, bucket, positions, evaluations, step, settings, mesh, on_eval,
            log)
        fitted.update(parts)
        timings.append(timing)
        infos.extend(bucket_infos)
        saved.extend(sets if settings.save_embeddings else [])
  finally:
    for bar, _ in bars:
      bar.close()
  # A replica that was not fitted still has a row per family, its fit columns empty.
  empty = [dict(dict.fromkeys(("fit_learning_rate", "fit_seed", *FIT_COLUMNS, "fit_diverged")),
                name=name, family=family) for name, family in names]
  rows = []
  for replica in replicas:
    head = replica_row(replica.coordinates(), *evaluations[replica.index])
    checkpoint, parts = fitted.get(replica.index, (None, empty))
    rows.extend(dict(head, checkpoint=checkpoint, **part) for part in parts)
  table = correlations(rows, settings.bootstrap)
  return _write(out, settings, workdir, step, rows, table, timings, infos, saved)


def _write(out, settings, workdir, step, rows, table, timings, infos, saved):
  from bindjax.reporting.plots import binding_fits  # pylint: disable=g-import-not-at-top
  out = files.as_path(out)
  out.mkdir(parents=True, exist_ok=True)
  for es in saved:
    es.save(out / EMBEDDINGS_DIR / f"replica_{es.provenance['replica']:04d}", overwrite=True)
  figures = binding_fits.plot(rows, table, out / FIGURE_STEM, step,
                              ACCURACY_COLUMN, QUALITY_COLUMN)
  counts = {s: len({r[results.REPLICA] for r in rows if r["status"] == s}) for s in STATUSES}
  fit_s = sum(t["fit_s"] for t in timings)
  summary = {
      "workdir": str(workdir), "step": step, "config": to_config(settings).to_dict(),
      "fit_config": dataclasses.asdict(settings.fit), "replicas": counts,
      "timings": timings, "fit_s": fit_s,
      "fit_s_per_replica": fit_s / counts["fitted"] if counts["fitted"] else None,
      "buckets": [{k: v for k, v in i.items() if k != "params"} for i in infos],
      "correlations": table, "figures": figures, "rows": rows}
  files.write_atomic(out / CSV_FILE,
                     complexity_results.rows_to_csv(rows, CSV_COLUMNS))
  files.write_atomic(out / CORRELATIONS_FILE, correlations_markdown(table, step))
  files.write_json(out / RESULTS_FILE, summary, indent=1)
  return summary
