"""Settings of the geometry commands (decompose, interventions, mds): typed, and as a ConfigDict.

The typed settings are the analyses' own dataclasses, which hold every default:
`decomposition.DecompositionConfig`, `interventions.InterventionConfig` and `mds.MdsConfig`,
gathered in `GeometryConfig`. `to_config` spells them as the ConfigDict that `--config.FIELD`
overrides (the decomposition's fit settings sit in its section; `probe` and `obj_avg_counting`
are shared by decomposition and interventions) and `settings_from` reads one back. Presets
(`get_config(arg)`) are in experiments/geometry.py; without `--config` the commands use
`default_config()`, the settings of docs/geometry.md.
"""
import dataclasses
import os

import ml_collections

from bindjax.base import config_values
from bindjax.frozen.geometry import decomposition as decomposition_lib
from bindjax.frozen.geometry import interventions as interventions_lib
from bindjax.frozen.geometry import mds as mds_lib
from bindjax.frozen.probes import linear

# Fields one ConfigDict entry gives to both the decomposition and the interventions.
SHARED = ("probe", "obj_avg_counting")
# The probe fields the config exposes: both analyses fit their probes on every scene they use,
# at the default initial temperature.
PROBE_FIELDS = ("steps", "learning_rate", "similarity", "train_fraction", "seed")


@dataclasses.dataclass(frozen=True)
class GeometryConfig:
  """Typed settings of the geometry commands: one section per analysis, and the table labels."""
  decomposition: decomposition_lib.DecompositionConfig = decomposition_lib.DecompositionConfig()
  interventions: interventions_lib.InterventionConfig = interventions_lib.InterventionConfig()
  mds: mds_lib.MdsConfig = mds_lib.MdsConfig()
  dataset_name: str = ""    # labels of interventions tables; "": provenance, else folder name
  model_name: str = ""


def to_config(settings):
  """The ConfigDict spelling of GeometryConfig `settings`."""
  d, i = settings.decomposition, settings.interventions
  c = ml_collections.ConfigDict()
  c.dataset_name, c.model_name = settings.dataset_name, settings.model_name
  c.obj_avg_counting = d.obj_avg_counting
  c.decomposition = ml_collections.ConfigDict({
      **config_values.fields(d.fit), **config_values.fields(d, exclude=SHARED + ("fit",))})
  c.probe = ml_collections.ConfigDict(config_values.fields(d.probe, only=PROBE_FIELDS))
  c.interventions = ml_collections.ConfigDict(config_values.fields(i, exclude=SHARED))
  c.mds = ml_collections.ConfigDict(config_values.fields(settings.mds))
  return c


def default_config():
  """The ConfigDict of the default settings (those of docs/geometry.md)."""
  return to_config(GeometryConfig())


def settings_from(cfg):
  """GeometryConfig of a geometry ConfigDict; ValueError naming a bad field."""
  values = cfg.to_dict()
  shared = dict(probe=_section(linear.ProbeConfig, values.pop("probe"), "probe").validate(),
                obj_avg_counting=values.pop("obj_avg_counting"))
  d = values.pop("decomposition")
  fit = config_values.pop_settings(decomposition_lib.AdditiveFitConfig, d)
  settings = GeometryConfig(
      decomposition=_section(decomposition_lib.DecompositionConfig, d, "decomposition", fit=fit,
                             **shared).validate(),
      interventions=_section(interventions_lib.InterventionConfig, values.pop("interventions"),
                             "interventions", **shared),
      mds=_section(mds_lib.MdsConfig, values.pop("mds"), "mds"),
      dataset_name=values.pop("dataset_name"), model_name=values.pop("model_name"))
  config_values.check_all_used(values, "config.")
  return settings


def _section(cls, section, name, **given):
  """`cls` from the fields of the config section `name` (each of which it must take) and
  `given`; ValueError naming the section's field otherwise."""
  try:
    settings = config_values.pop_settings(cls, section, **given)
  except ValueError as e:
    raise ValueError(f"{name}.{e}") from None
  config_values.check_all_used(section, f"config.{name}.")
  return settings


def from_flags(flag_values):
  """GeometryConfig of a command's --config, or the defaults when --config was not given;
  ValueError naming a bad field."""
  cfg = flag_values["config"].value
  return settings_from(default_config() if cfg is None else cfg)


def run_labels(settings, embedding_set, embeddings_path):
  """(dataset, model) names for tables: the settings', else provenance, else the folder name."""
  provenance = embedding_set.provenance or {}
  dataset = settings.dataset_name or provenance.get("dataset") or os.path.basename(
      os.path.normpath(embeddings_path))
  model = settings.model_name or provenance.get("model") or "?"
  return str(dataset), str(model)
