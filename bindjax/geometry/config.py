"""Settings of the geometry commands (decompose, interventions, mds) as one ConfigDict.

Presets: "paper" (the defaults of docs/geometry.md), "cpu" (same, fewer probe/fit steps),
"smoke" (seconds).
`experiments/geometry.py` exposes them to `--config`; without `--config` the commands use "paper".
"""
import ml_collections

from bindjax import config_values
from bindjax.geometry import decomposition
from bindjax.geometry import interventions
from bindjax.probes import linear

PRESETS = ("smoke", "cpu", "paper")


def get_config(preset="paper"):
  """ConfigDict with sections decomposition, probe, interventions, mds."""
  if preset not in PRESETS:
    raise ValueError(f"geometry config preset {preset!r}: expected one of {PRESETS}")
  fit_steps, probe_steps = {"smoke": (200, 200), "cpu": (3000, 3000),
                            "paper": (10_000, 10_000)}[preset]
  fit, probe = decomposition.AdditiveFitConfig(), linear.ProbeConfig()
  cfg = ml_collections.ConfigDict()
  cfg.preset = preset
  cfg.dataset_name = ""   # labels for interventions tables; default: provenance / folder name
  cfg.model_name = ""
  cfg.obj_avg_counting = "occurrences"  # obj-avg over slot occurrences (original) or "scenes"
  cfg.decomposition = ml_collections.ConfigDict(dict(
      steps=fit_steps, learning_rate=fit.learning_rate, weight_decay=fit.weight_decay,
      batch_size=fit.batch_size, train_fraction=fit.train_fraction, seed=fit.seed,
      banks=(), control_seed=0, tie_tolerance=1e-6, subtract="least_squares"))
  cfg.probe = ml_collections.ConfigDict(dict(
      steps=probe_steps, learning_rate=probe.learning_rate, similarity=probe.similarity,
      train_fraction=probe.train_fraction, seed=probe.seed))
  iv = interventions.InterventionConfig()
  cfg.interventions = ml_collections.ConfigDict(dict(
      banks=(), strengths=iv.strengths, attribute_concept=iv.attribute_concept,
      shape_concept=iv.shape_concept, seed=iv.seed, target_draws=iv.target_draws, pool=iv.pool,
      tie_tolerance=iv.tie_tolerance, probes=iv.probes, probes_file=iv.probes_file))
  cfg.mds = ml_collections.ConfigDict(dict(
      quadruples=(), bank="pos-avg", random_state=0, n_init=4, attribute_concept=0,
      shape_concept=1))
  return cfg


def _banks(value, field):
  """None (every bank the set supports) for an empty tuple or "auto"; else the bank names."""
  banks = config_values.names(value, field)
  return None if banks in ((), ("auto",)) else banks


def probe_config(cfg):
  p = cfg.probe
  return linear.ProbeConfig(steps=int(p.steps), learning_rate=float(p.learning_rate),
                            similarity=str(p.similarity), train_fraction=float(p.train_fraction),
                            seed=int(p.seed)).validate()


def decomposition_config(cfg):
  """DecompositionConfig from the ConfigDict (ValueError for bad fields)."""
  d = cfg.decomposition
  fit = decomposition.AdditiveFitConfig(
      steps=int(d.steps), learning_rate=float(d.learning_rate),
      weight_decay=float(d.weight_decay), batch_size=int(d.batch_size),
      train_fraction=float(d.train_fraction), seed=int(d.seed))
  return decomposition.DecompositionConfig(
      fit=fit.validate(), probe=probe_config(cfg), banks=_banks(d.banks, "decomposition.banks"),
      control_seed=int(d.control_seed), tie_tolerance=float(d.tie_tolerance),
      subtract=str(d.subtract), obj_avg_counting=str(cfg.obj_avg_counting)).validate()


def intervention_config(cfg):
  """InterventionConfig from the ConfigDict (ValueError for bad fields)."""
  i = cfg.interventions
  return interventions.InterventionConfig(
      banks=_banks(i.banks, "interventions.banks"),
      strengths=config_values.numbers(i.strengths, "interventions.strengths"),
      attribute_concept=int(i.attribute_concept), shape_concept=int(i.shape_concept),
      seed=int(i.seed), target_draws=str(i.target_draws), pool=str(i.pool),
      tie_tolerance=float(i.tie_tolerance), probes=str(i.probes), probe=probe_config(cfg),
      probes_file=str(i.probes_file), obj_avg_counting=str(cfg.obj_avg_counting))


def from_flags(flag_values):
  """The --config value of a command, or the "paper" preset when --config was not given."""
  cfg = flag_values["config"].value
  return get_config("paper") if cfg is None else cfg


def run_labels(cfg, embedding_set, embeddings_path):
  """(dataset, model) names for tables: config fields, else provenance, else the folder name."""
  import os  # pylint: disable=g-import-not-at-top
  provenance = embedding_set.provenance or {}
  dataset = cfg.get("dataset_name") or provenance.get("dataset") or os.path.basename(
      os.path.normpath(embeddings_path))
  model = cfg.get("model_name") or provenance.get("model") or "?"
  return str(dataset), str(model)
