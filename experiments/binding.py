r"""Presets of `bindjax binding` (docs/binding.md): approximator families fitted to each replica
of a sweep on its own coverage split, beside its held-out accuracy.

  bindjax binding --workdir=runs/smoke --config=experiments/binding.py:smoke
  bindjax binding --workdir=runs/cpu --config=experiments/binding.py:cpu --out=runs/cpu_binding

Presets (the ARG after the colon):
  smoke   for the smoke sweep: small families (mlp:32), 100 fit steps with cheap compiles, 200
          bootstrap resamples; checks the machinery.
  cpu     for the cpu sweep (experiments/coverage_sweep.py:cpu): mlp:128, 2,000 fit steps.
  paper   the default settings (bindjax.complexity.replicas.default_config()): the FitConfig
          defaults and the paper's MLP width (mlp:1024), for accelerators.

Every field is described in docs/binding.md and `bindjax binding --help`; `fit` holds every
FitConfig field (docs/complexity.md, "Fitting"). What the cpu preset showed on the cpu sweep:
docs/findings/binding_fits.md.
"""
from bindjax.complexity import replicas

# The families of every preset; the MLP width differs.
FAMILIES = "additive,sum_product,per_object_sum_product"


def get_config(arg="smoke"):
  """Config of preset `arg` (smoke | cpu | paper)."""
  c = replicas.default_config()
  if arg == "smoke":
    c.models = f"{FAMILIES},mlp:32"
    c.fit.steps = 100
    c.fit.eval_every = 50
    c.fit.fast_compile = True
    c.bootstrap = 200
  elif arg == "cpu":
    c.models = f"{FAMILIES},mlp:128"
    c.fit.steps = 2000
  elif arg != "paper":
    raise ValueError(f"experiments/binding.py: unknown preset {arg!r}; expected smoke, cpu or "
                     "paper")
  return c
