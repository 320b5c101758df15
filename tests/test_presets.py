"""Every preset of experiments/ builds, validates and is what its docstring says it is."""
import dataclasses
import os

import pytest

from bindjax.commands import flags
from bindjax.complexity import analysis
from bindjax.complexity import fitting
from bindjax.complexity import replicas as binding
from bindjax.frozen.geometry import config as geometry
from bindjax.training import grid
from bindjax.training import run_spec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load(name, arg):
  return flags.load_config(os.path.join(REPO, "experiments", f"{name}.py") + f":{arg}")


# Per sweep preset, as its docstring states it: the object-space sizes |O|, coverages and seeds
# per size, training steps, whether both towers have the product read-out, and the weight decays
# per coverage and seed (one, the optimizer's, unless the grid names several).
SWEEPS = {
    "smoke": ((16, 36), 3, 2, 40, False),
    "cpu": ((100,), 5, 4, 10000, True),
    "cpu_144": ((144,), 5, 4, 12000, True),
    "cpu_c3": ((125,), 5, 4, 10000, True),
    "cpu_196": ((196,), 5, 4, 15000, True),
    "cpu_256_c4": ((256,), 5, 4, 15000, True),
    "cpu_256_c2": ((256,), 5, 4, 15000, True),
    "cpu_400": ((400,), 5, 4, 20000, True),
    "cpu_095": ((100,), 1, 4, 10000, True),
    "cpu_144_095": ((144,), 1, 4, 12000, True),
    "cpu_plain_64": ((64,), 4, 2, 8000, False, 3),
    "cpu_plain_36": ((36,), 12, 5, 5000, False),
    "cpu_plain_law": ((25, 64), 5, 4, 10000, False),
    "cpu_product_64": ((64,), 5, 4, 10000, True),
    "cpu_plain_64_wd03": ((64,), 5, 4, 10000, False),
    "cpu_plain_36_wd03": ((36,), 12, 5, 5000, False),
    "cpu_plain_64_wd03_low": ((64,), 1, 4, 10000, False),
    "cpu_plain_49_wd03": ((49,), 6, 4, 10000, False),
    "cpu_plain_64_wd03_60": ((64,), 12, 5, 10000, False),
    "cpu_plain_c3_64_wd03": ((64,), 6, 4, 10000, False),
    "cpu_plain_c3_27_wd03": ((27,), 6, 4, 10000, False),
    "cpu_plain_c4_81_wd03": ((81,), 6, 4, 10000, False),
    "cpu_plain_c4_81_wd03_long": ((81,), 4, 4, 20000, False),
    "cpu_plain_c4_81_wd03_095": ((81,), 1, 4, 10000, False),
    "cpu_product_64_wd03": ((64,), 6, 4, 10000, True),
    "cpu_product_c4_81_wd03": ((81,), 6, 4, 10000, True),
    "cpu_plain_ff1024_64": ((64,), 5, 4, 10000, False),
    "cpu_plain_ff1024_100": ((100,), 5, 4, 15000, False),
    "gpu_plain_400": ((400,), 8, 4, 40000, False),
    "gpu_quick": ((400,), 7, 1, 15000, False),
    "paper": ((400, 2500, 125000), 9, 3, 50000, False),
    "paper_20m": ((400, 2500, 125000), 9, 3, 50000, False),
}


@pytest.mark.parametrize("preset", sorted(SWEEPS))
def test_coverage_sweep_presets_are_the_documented_grids(preset):
  sizes, num_coverages, num_seeds, steps, product_readout, *decays = SWEEPS[preset]
  num_decays = decays[0] if decays else 1
  replicas, buckets = grid.expand_grid(load("coverage_sweep", preset))
  points = {(r.space_size, r.coverage, r.seed, r.weight_decay) for r in replicas}
  assert len(points) == len(replicas) == (
      len(sizes) * num_coverages * num_seeds * num_decays)
  assert [b.spec.space.num_objects for b in buckets] == list(sizes)   # one program per space
  for bucket in buckets:
    assert {r.space_size for r in bucket.replicas} == {bucket.spec.space.num_objects}
    assert bucket.spec.num_steps == steps
    assert (bucket.spec.model.product_readout == "both") == product_readout


# Presets run beside another so that one setting tells them apart: the preset each pairs with and
# the settings (flattened config keys) each may change.
PAIRED = {
    "cpu_095": ("cpu", {"grid.coverages"}),
    "cpu_144_095": ("cpu_144", {"grid.coverages"}),
    "cpu_256_c2": ("cpu_256_c4", {"grid.spaces"}),
    "cpu_400": ("cpu_256_c2", {"grid.spaces", "num_steps"}),
    "cpu_product_64": ("cpu_plain_law", {"model.product_readout", "grid.spaces"}),
    "cpu_plain_64_wd03": ("cpu_plain_law", {"optimizer.weight_decay", "grid.spaces"}),
    "cpu_plain_36_wd03": ("cpu_plain_36", {"optimizer.weight_decay"}),
    "cpu_plain_64_wd03_low": ("cpu_plain_64_wd03", {"grid.coverages"}),
    "cpu_plain_49_wd03": ("cpu_plain_64_wd03", {"grid.spaces", "grid.coverages"}),
    "cpu_plain_64_wd03_60": ("cpu_plain_64_wd03", {"grid.coverages", "grid.seeds"}),
    "cpu_plain_c3_64_wd03": ("cpu_plain_64_wd03", {"grid.spaces", "grid.coverages"}),
    "cpu_plain_c3_27_wd03": ("cpu_plain_c3_64_wd03", {"grid.spaces"}),
    "cpu_plain_c4_81_wd03": ("cpu_plain_c3_64_wd03", {"grid.spaces", "grid.coverages"}),
    "cpu_plain_c4_81_wd03_long": ("cpu_plain_c4_81_wd03", {"grid.coverages", "num_steps"}),
    "cpu_plain_c4_81_wd03_095": ("cpu_plain_c4_81_wd03", {"grid.coverages"}),
    "cpu_product_64_wd03": ("cpu_plain_64_wd03", {"model.product_readout", "grid.coverages"}),
    "cpu_product_c4_81_wd03": ("cpu_plain_c4_81_wd03", {"model.product_readout"}),
    "cpu_plain_ff1024_64": ("cpu_plain_law", {"model.d_ff", "grid.spaces"}),
    "cpu_plain_ff1024_100": ("cpu_plain_ff1024_64", {"grid.spaces", "num_steps"}),
}


def _flat(config, prefix=""):
  out = {}
  for key, value in config.items():
    if hasattr(value, "items"):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


@pytest.mark.parametrize("preset", sorted(PAIRED))
def test_paired_presets_differ_from_their_partner_in_one_setting(preset):
  partner, settings = PAIRED[preset]
  base, paired = (_flat(load("coverage_sweep", arg)) for arg in (partner, preset))
  differ = {key for key in base.keys() | paired.keys() if base.get(key) != paired.get(key)}
  assert differ == settings


# Per training preset: |O|, steps, layers and width of the towers.
RUNS = {"smoke": (16, 60, 1, 32), "tiny": (16, 300, 1, 32), "cpu": (16, 2000, 2, 64),
        "paper": (400, 50000, 6, 256)}


@pytest.mark.parametrize("preset", sorted(RUNS))
def test_train_presets_are_the_documented_runs(preset):
  spec = run_spec.RunSpec.from_config(load("train", preset))
  assert (spec.space.num_objects, spec.num_steps, spec.model.num_layers,
          spec.model.d_model) == RUNS[preset]


@pytest.mark.parametrize("name,arg", [("coverage_sweep", "laptop"), ("train", "laptop"),
                                      ("complexity", "laptop"), ("complexity", "paper,fast"),
                                      ("geometry", "laptop"), ("binding", "laptop")])
def test_unknown_preset_is_refused_by_name(name, arg, capsys):
  with pytest.raises(SystemExit):
    load(name, arg)
  assert f"{arg!r}" in capsys.readouterr().err


# (typed settings of a config, ConfigDict spelling of typed settings, the defaults).
SPELLINGS = {"complexity": (analysis.settings_from, analysis.to_config,
                            analysis.ComplexityConfig()),
             "binding": (binding.settings_from, binding.to_config, binding.BindingConfig()),
             "geometry": (geometry.settings_from, geometry.to_config, geometry.GeometryConfig())}
PRESETS = [("complexity", p) for p in ("smoke", "cpu", "paper", "paper,trees",
                                       "paper,original", "smoke,trees,original")] + [
    (name, p) for name in ("binding", "geometry") for p in ("smoke", "cpu", "paper")]


@pytest.mark.parametrize("name,arg", PRESETS)
def test_every_preset_setting_survives_its_spelling(name, arg):
  settings_from, to_config, _ = SPELLINGS[name]
  settings = settings_from(load(name, arg))
  assert settings_from(to_config(settings)) == settings


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_the_paper_presets_are_the_library_defaults(name):
  settings_from, _, defaults = SPELLINGS[name]
  settings = settings_from(load(name, "paper"))
  if name == "complexity":   # the presets point at the repository's own embedding set
    assert settings.embeddings.endswith(os.path.join("tests", "data", "clevr_text"))
    settings = dataclasses.replace(settings, embeddings=defaults.embeddings)
  assert settings == defaults


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_a_field_no_setting_takes_is_refused(name):
  settings_from, to_config, defaults = SPELLINGS[name]
  config = to_config(defaults)
  config.stpes = 10
  with pytest.raises(ValueError, match="config.stpes: not a setting"):
    settings_from(config)


@pytest.mark.parametrize("arg,steps,fractions,models", [
    ("smoke", 200, 3, "mlp:64,product,sum_product"),
    ("cpu", 1000, 9, "mlp:1024,product,sum_product"),
    ("paper", 4000, 9, "mlp:1024,product,sum_product")])
def test_complexity_presets_are_the_documented_grids(arg, steps, fractions, models):
  for options in ("", ",trees", ",original"):
    settings = analysis.settings_from(load("complexity", arg + options))
    assert (settings.fit.steps, len(settings.train_fractions), settings.models) == (
        steps, fractions, models)
    assert settings.trees == (options == ",trees")
    original = options == ",original"
    # The original's fit: one unregularised start on raw targets, a constant learning rate.
    assert (settings.fit.restarts == 1) == original
    assert (settings.fit.decay_for("product") == 0) == original
    assert settings.fit.standardize != original
    assert (settings.fit.schedule == "constant") == original
    assert fitting.eval_steps(settings.fit)[0] == (1 if original else settings.fit.eval_every)


@pytest.mark.parametrize("arg,steps", [("smoke", 200), ("cpu", 3000), ("paper", 10_000)])
def test_geometry_presets_set_the_fit_and_probe_steps(arg, steps):
  settings = geometry.settings_from(load("geometry", arg))
  d, i = settings.decomposition, settings.interventions
  assert d.fit.steps == d.probe.steps == i.probe.steps == steps


@pytest.mark.parametrize("arg,mlp,steps", [("smoke", "mlp:32", 100), ("cpu", "mlp:128", 2000),
                                           ("paper", "mlp:1024", 4000)])
def test_binding_presets_fit_the_documented_families(arg, mlp, steps):
  settings = binding.settings_from(load("binding", arg))
  assert [name for name, _ in settings.model_names()] == [
      "additive", "sum_product", "per_object_sum_product", mlp.replace(":", "[") + "]"]
  assert settings.fit.steps == steps


def _documented_presets():
  """{"train.py:cpu": its command, ...} of docs/presets.md's table."""
  rows = {}
  with open(os.path.join(REPO, "docs", "presets.md")) as f:
    for line in f:
      cells = [c.strip() for c in line.split(" | ")]
      if line.startswith("| `") and len(cells) == 4:
        rows[cells[0].strip("|` ")] = cells[2]
  return rows


@pytest.mark.parametrize("name,arg", [("coverage_sweep", "laptop"), ("train", "laptop")])
def test_the_presets_page_has_one_row_per_preset_with_its_command(name, arg, capsys):
  """Every preset the config file accepts (its refusal lists them) has a row, whose command
  runs that preset."""
  with pytest.raises(SystemExit):
    load(name, arg)
  listed = capsys.readouterr().err.split("expected ")[-1].replace(" or ", ", ").strip()
  presets = {p.strip() for p in listed.split(",")}
  assert presets == set(SWEEPS if name == "coverage_sweep" else RUNS), presets
  rows = _documented_presets()
  for preset in presets:
    command = rows[f"{name}.py:{preset}"]
    assert f"--config=experiments/{name}.py:{preset} " in command, (preset, command)
