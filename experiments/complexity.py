r"""Binding-function complexity grid (docs/complexity.md): approximators × train fractions × seeds.

  bindjax complexity --config=experiments/complexity.py:smoke --workdir=/tmp/complexity
  bindjax complexity --config=experiments/complexity.py:paper \
      --config.embeddings=path/to/embedding_set --workdir=runs/complexity_clevr

Presets: `smoke` (seconds: 3 fractions × 3 small models, 200 steps, on tests/data/clevr_text),
`cpu` (the paper grid at 1,000 steps), `paper` (f = 0.1..0.9 × {MLP 1024, product,
sum+product}, lr 1e-2, 4,000 steps; one seed, as the original reports one run). Append
`,trees` to also fit the random-forest approximator on the same splits, and `,original` for the
original code's fits (one unregularised start on raw targets, constant learning rate, its
evaluation cadence) where the default fits are the ones of docs/complexity.md, "Fitting"
(standardised targets, weight decay, 3 restarts: 20 of 20 planted fits recover their structure,
about 2.9 times the arithmetic of one original fit).

`embeddings` is a native embedding set or a folder of the original code; the frozen probes are
the set's stored ones, a probes.npz (`probes_file`, as `bindjax probe` writes), or fitted on all
scenes (`probes="fit"`). `models` is a comma list: mlp:W1xW2.., additive, product, product:W
(learned W), sum_product, sum_product:W, per_object_product, per_object_sum_product,
per_object_sum_product:W. `seeds` are restarts (object split and initialisation): summary.csv
reports the median and spread over them. `restarts` tries that many initialisations inside each
fit and keeps the best by training error (docs/complexity.md, "Restarts"; 1 is the original's
single run).
"""
import os

import ml_collections

from bindjax.complexity import description_length
from bindjax.complexity import fitting
from bindjax.probes import linear

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_config(arg="smoke"):
  """Config for preset `arg` (smoke | cpu | paper, optionally `,trees` and `,original`)."""
  parts = [p for p in (arg or "smoke").split(",") if p]
  preset, options = parts[0], set(parts[1:])
  if preset not in ("smoke", "cpu", "paper") or options - {"trees", "original"}:
    raise ValueError(f"complexity config arg={arg!r}: expected smoke|cpu|paper[,trees][,original]")
  fit, probe = fitting.FitConfig(), linear.ProbeConfig()
  code = description_length.CodeConfig()
  c = ml_collections.ConfigDict()
  c.embeddings = os.path.join(_REPO, "tests", "data", "clevr_text")
  c.probes = "auto"             # auto | stored | fit
  c.probes_file = ""            # probes.npz written by `bindjax probe`
  c.probe_steps = probe.steps
  c.probe_similarity = probe.similarity
  # A comma string, not a tuple: ml_collections cannot parse "mlp:64,product" as a tuple
  # override (the colon), and a comma list is what a researcher types.
  c.models = "mlp:1024,product,sum_product"
  c.embed_dim = 0               # slot embedding width; 0 = embedding width D
  c.train_fractions = tuple(round(0.1 * i, 1) for i in range(1, 10))
  # "random": a random object split per train fraction and seed; "coverage": the set's own
  # coverage split (a set of all objects extracted from a bindjax run; train_fractions unused).
  c.split = "random"
  c.seeds = (0,)
  c.learning_rates = (1e-2,)
  c.steps = fit.steps
  c.eval_every = fit.eval_every
  c.schedule = fit.schedule     # cosine decay to 0; "constant" is the original's
  # "end": evaluations after 100, …, 4000; "original": after steps 1, 101, …, 3901.
  c.eval_cadence = fit.eval_cadence
  # Initialisations per fit (docs/complexity.md, "Restarts"): 1 is the original's single run;
  # R > 1 trains R candidates restart_steps steps (0: half of steps) and keeps the one with the
  # lowest training loss (restart_holdout = 0) or the lowest error on held-out training
  # objects (share h).
  c.restarts = fit.restarts
  c.restart_steps = fit.restart_steps
  c.restart_holdout = fit.restart_holdout
  c.standardize = fit.standardize     # fit in units of the training targets
  c.weight_decay = fit.weight_decay   # "auto": per family (fitting.WEIGHT_DECAY), or a number
  c.chunk_size = "auto"         # auto | none | an integer number of models per chunk
  c.memory_bytes = 0            # 0: the device's memory
  c.trees = "trees" in options  # also fit tree approximators (bindjax.complexity.trees)
  c.tree_models = "random_forest"   # comma string, like models
  c.tree_estimators = 100
  # Prequential description length of every model (docs/complexity.md, "Description length"):
  # blocks end at these fractions of the objects; each block's fits use steps, schedule and
  # every learning rate, with dl_restarts initialisations; coordinates coded to precision
  # dl_precision × the embeddings' RMS standard deviation.
  c.description_length = False
  c.dl_block_fractions = code.block_fractions
  c.dl_restarts = code.restarts
  c.dl_precision = code.precision
  if preset == "smoke":
    c.models = "mlp:64,product,sum_product"
    c.train_fractions = (0.3, 0.5, 0.7)
    c.steps = 200
    c.eval_every = 50
    c.probe_steps = 500
    c.tree_estimators = 20
  elif preset == "cpu":
    c.steps = 1000
  if "original" in options:
    c.update(fitting.ORIGINAL)
    c.schedule = "constant"       # the original builds a cosine schedule but never steps it
    c.eval_cadence = "original"
  return c
