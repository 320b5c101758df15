"""Every preset of the experiment configs builds and validates its grid and model, uncompiled."""
import os

import pytest

from bindjax import sweep
from bindjax import train
from bindjax.commands import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("preset", ["smoke", "cpu", "cpu_144", "cpu_c3", "gpu_quick", "paper", "paper_20m"])
def test_coverage_sweep_presets_expand(preset):
  config = flags.load_config(os.path.join(REPO, "experiments", "coverage_sweep.py") + f":{preset}")
  replicas, buckets = sweep.expand_grid(config)
  assert len(replicas) == (len(config.grid.spaces) * len(config.grid.coverages) *
                           len(config.grid.seeds) * max(1, len(config.grid.models)) *
                           max(1, len(config.grid.learning_rates)) *
                           max(1, len(config.grid.weight_decays)))
  assert len(buckets) == len(config.grid.spaces) * max(1, len(config.grid.models))
  for bucket in buckets:
    assert bucket.spec.model.product_readout == config.model.product_readout
    assert bucket.spec.sampler.train_queries == config.sampler.train_queries


@pytest.mark.parametrize("preset", ["smoke", "tiny", "cpu", "paper"])
def test_train_presets_validate(preset):
  config = flags.load_config(os.path.join(REPO, "experiments", "train.py") + f":{preset}")
  spec = train.RunSpec.from_config(config)
  assert spec.num_steps == config.num_steps


def test_unknown_preset_is_refused(capsys):
  with pytest.raises((flags.UsageError, SystemExit)):
    flags.load_config(os.path.join(REPO, "experiments", "coverage_sweep.py") + ":laptop")
  assert "'laptop'; expected smoke, cpu, cpu_144, cpu_c3, gpu_quick" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["smoke", "cpu", "paper", "paper,trees", "paper,original"])
def test_complexity_presets_validate(preset):
  from bindjax.complexity import analysis  # pylint: disable=g-import-not-at-top
  config = flags.load_config(os.path.join(REPO, "experiments", "complexity.py") + f":{preset}")
  fit = analysis.fit_config_from(config)
  assert fit.steps == config.steps and fit.restarts == config.restarts
  original = preset.endswith("original")
  assert (fit.restarts == 1) == original and (fit.decay_for("product") == 0) == original
  assert fit.standardize != original and config.trees == ("trees" in preset)


@pytest.mark.parametrize("preset", ["smoke", "cpu", "paper"])
def test_geometry_presets_validate(preset):
  from bindjax.geometry import config as config_lib  # pylint: disable=g-import-not-at-top
  config = flags.load_config(os.path.join(REPO, "experiments", "geometry.py") + f":{preset}")
  assert config_lib.decomposition_config(config).fit.steps == config.decomposition.steps
  assert config_lib.intervention_config(config).strengths == tuple(config.interventions.strengths)
