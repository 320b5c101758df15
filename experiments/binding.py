r"""Every replica's binding function (docs/binding.md): approximator families fitted to each
replica of a sweep on its own coverage split, beside its held-out accuracy.

  bindjax binding --workdir=runs/smoke --config=experiments/binding.py:smoke
  bindjax binding --workdir=runs/cpu --config=experiments/binding.py:cpu --out=runs/cpu_binding

Presets: `smoke` (seconds on the smoke sweep: 100 steps), `cpu` (the cpu sweep's 20 replicas on
2 CPU cores), `paper` (the FitConfig defaults and the paper's MLP width, for accelerators).
`fit` holds every FitConfig field, with its defaults (docs/complexity.md, "Fitting" and
"Restarts"); `models` is a comma list as in experiments/complexity.py; `learning_rate` and
`fit_seed` (the initialisation key) are the same for every replica. `encode_batch`: scenes per
replica per forward pass; `chunk_size` (auto | none | n fits at once) and `memory_bytes` as in
the complexity grid; `cpu_devices` as config.sweep.cpu_devices of a sweep (CPU hosts: -1 one
single-threaded device per core); `bootstrap`: resamples of the replicas for the interval of
Spearman's ρ; `save_embeddings`: also write every fitted replica's embedding set.
"""
import dataclasses

import ml_collections

from bindjax.complexity import fitting

PRESETS = ("smoke", "cpu", "paper")


def get_config(arg="smoke"):
  """Config for preset `arg` (smoke | cpu | paper)."""
  if arg not in PRESETS:
    raise ValueError(f"binding config arg={arg!r}: expected one of {'|'.join(PRESETS)}")
  c = ml_collections.ConfigDict()
  c.models = "additive,sum_product,per_object_sum_product,mlp:1024"
  c.embed_dim = 0            # slot embedding width; 0 = embedding width D
  c.learning_rate = 1e-2     # the complexity grid's learning rate
  c.fit_seed = 0
  c.fit = ml_collections.ConfigDict(dataclasses.asdict(fitting.FitConfig()))
  c.chunk_size = "auto"
  # Fits of one family whose training counts are within this factor run as one compiled batch
  # (inf: one batch per family and bucket, every replica padded to the largest count).
  c.pad_ratio = fitting.PAD_RATIO
  c.memory_bytes = 0
  c.encode_batch = 1024
  c.cpu_devices = -1
  c.bootstrap = 1000
  c.save_embeddings = False
  if arg == "smoke":
    c.models = "additive,sum_product,per_object_sum_product,mlp:32"
    c.fit.steps = 100
    c.fit.eval_every = 50
    c.bootstrap = 200
  elif arg == "cpu":
    c.models = "additive,sum_product,per_object_sum_product,mlp:128"
    c.fit.steps = 2000
  return c
