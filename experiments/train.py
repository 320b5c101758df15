"""Presets of `bindjax train`: one dual encoder trained from scratch (docs/training.md).

  bindjax train --config=experiments/train.py:smoke --workdir=/tmp/bindjax_train_smoke
  bindjax train --config=experiments/train.py:cpu --workdir=runs/train_cpu
  bindjax train --config=experiments/train.py:paper --workdir=runs/train_paper

Presets (the ARG after the colon):
  smoke   C=2, V=4, K=2, coverage 0.75, a 1-layer d_model-32 model, 60 steps, cheap compiles:
          checks the machinery.
  tiny    the learning check of tests/test_train.py: C=2, V=4, K=2, coverage 1, a 1-layer
          d_model-32 model, 300 steps at lr 1e-2 with warm-up fraction 0.3, cheap compiles.
  cpu     C=2, V=4, K=2, coverage 1, a 2-layer d_model-64 model, batch 64, lr 3e-3, 2,000 steps.
  paper   the published run (bindjax.training.run_spec.default_config(); docs/training.md,
          "Published run").

What the tiny and cpu models learn, and why the tiny one does not bind:
docs/findings/tiny_model_binding.md.

Override any field on the command line, e.g. --config.coverage=0.5 --config.seed=3
--config.num_steps=2000 --config.model.num_layers=2. `bindjax.training.run_spec.default_config()`
lists them.
"""
from bindjax.training import run_spec


def get_config(arg="smoke"):
  """Config of preset `arg` (smoke | tiny | cpu | paper)."""
  c = run_spec.default_config()
  if arg == "smoke":
    c.space.update(num_concepts=2, num_values=4, max_objects=2)
    c.coverage = 0.75
    c.model.update(d_model=32, num_heads=2, num_layers=1, d_ff=64, d_out=16)
    c.sampler.update(batch_size=32)
    c.optimizer.learning_rate = 3e-3
    c.num_steps = 60
    c.eval.update(every=30, batches=2, batch_size=64)
    c.log_every = 10
    c.checkpoint.update(every=30, keep=2)
    c.sweep.fast_compile = True
  elif arg == "tiny":
    c.space.update(num_concepts=2, num_values=4, max_objects=2)
    c.coverage = 1.0
    c.model.update(d_model=32, num_heads=4, num_layers=1, d_ff=128, d_out=16)
    c.sampler.update(batch_size=64)
    c.optimizer.update(learning_rate=1e-2, warmup_fraction=0.3)
    c.num_steps = 300
    c.eval.update(every=300, batches=2, batch_size=256)
    c.log_every = 100
    c.checkpoint.update(every=300, keep=1)
    c.sweep.fast_compile = True
  elif arg == "cpu":
    c.space.update(num_concepts=2, num_values=4, max_objects=2)
    c.coverage = 1.0
    c.model.update(d_model=64, num_heads=4, num_layers=2, d_ff=256, d_out=32)
    c.sampler.update(batch_size=64)
    c.optimizer.learning_rate = 3e-3
    c.num_steps = 2000
    c.eval.update(every=250, batches=4, batch_size=256)
    c.log_every = 50
    c.checkpoint.update(every=250, keep=2)
  elif arg == "paper":
    pass  # default_config() is the published run
  else:
    raise ValueError(f"experiments/train.py: unknown preset {arg!r}; expected smoke, tiny, cpu or "
                     "paper")
  return c
