"""Presets of the geometry commands (decompose, interventions, mds; docs/geometry.md).

  bindjax decompose --embeddings=tests/data/clevr_text --workdir=runs/clevr_text/decompose \
      --config=experiments/geometry.py:cpu
  bindjax interventions --embeddings=tests/data/clevr_text \
      --workdir=runs/clevr_text/interventions --config=experiments/geometry.py:cpu \
      --config.interventions.strengths=1,2
  bindjax mds --embeddings=tests/data/clevr_text --workdir=runs/clevr_text/mds \
      --config=experiments/geometry.py:smoke --quadruple=red,blue,cube,sphere

Presets (the ARG after the colon):
  paper   the settings of docs/geometry.md (bindjax.frozen.geometry.config.default_config(),
          which the commands also use without --config).
  cpu     the same with 3,000 steps for the additive fits and the probes.
  smoke   the same with 200 steps: checks the machinery.

No docs/findings page records a run of these presets yet.
"""
from bindjax.frozen.geometry import config as geometry_config

# Steps of the additive fits and of the probes, per reduced preset.
STEPS = {"cpu": 3000, "smoke": 200}


def get_config(arg="paper"):
  """Geometry config of preset `arg` (smoke | cpu | paper)."""
  c = geometry_config.default_config()
  if arg in STEPS:
    c.decomposition.steps = c.probe.steps = STEPS[arg]
  elif arg != "paper":
    raise ValueError(f"experiments/geometry.py: unknown preset {arg!r}; expected smoke, cpu or "
                     "paper")
  return c
