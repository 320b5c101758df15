r"""Presets of the binding-function complexity grid (docs/complexity.md): approximators × train
fractions × seeds, fitted to one embedding set.

  bindjax complexity --config=experiments/complexity.py:smoke --workdir=/tmp/complexity
  bindjax complexity --config=experiments/complexity.py:paper \
      --config.embeddings=path/to/embedding_set --workdir=runs/complexity_clevr

Presets (the ARG after the colon), each on tests/data/clevr_text unless --config.embeddings says
otherwise:
  smoke   3 train fractions × 3 small models, 200 steps, cheap compiles: checks the machinery.
  cpu     the paper grid at 1,000 steps.
  paper   the default settings (bindjax.complexity.analysis.default_config()): f = 0.1..0.9 ×
          {MLP 1024, product, sum+product}, lr 1e-2, the default fit of docs/complexity.md,
          "Fitting"; one seed.
Options appended to a preset: `,trees` also fits the random-forest approximator on the same
splits; `,original` fits as the original code does (fit_settings.ORIGINAL: one unregularised
start on raw targets, a constant learning rate and its evaluation cadence).

Every field is described in docs/complexity.md and `bindjax complexity --help`. What these fits
showed: docs/findings/complexity_stability.md (the default fit against the original's) and
docs/findings/description_length.md (the description length of clevr_text).
"""
import os

from bindjax.complexity import analysis
from bindjax.complexity import fit_settings

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = ("smoke", "cpu", "paper")
OPTIONS = ("trees", "original")


def get_config(arg="smoke"):
  """Config of preset `arg` (smoke | cpu | paper, optionally `,trees` and `,original`)."""
  preset, *options = arg.split(",")
  if preset not in PRESETS or not set(options) <= set(OPTIONS):
    raise ValueError(f"experiments/complexity.py: unknown preset {arg!r}; expected "
                     "smoke|cpu|paper[,trees][,original]")
  c = analysis.default_config()
  c.embeddings = os.path.join(_REPO, "tests", "data", "clevr_text")
  if preset == "smoke":
    c.models = "mlp:64,product,sum_product"
    c.fast_compile = True
    c.train_fractions = (0.3, 0.5, 0.7)
    c.steps = 200
    c.eval_every = 50
    c.probe_steps = 500
    c.tree_estimators = 20
  elif preset == "cpu":
    c.steps = 1000
  c.trees = "trees" in options
  if "original" in options:
    c.update(fit_settings.ORIGINAL)
    c.schedule = "constant"       # the original builds a cosine schedule but never steps it
    c.eval_cadence = "original"
  return c
