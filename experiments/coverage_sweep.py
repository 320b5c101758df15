"""Coverage sweep: held-out object recognition vs coverage × object-space size × seed (issue 6).

  bindjax sweep --config=experiments/coverage_sweep.py:smoke --workdir=/tmp/bindjax_sweep_smoke
  bindjax report --workdir=/tmp/bindjax_sweep_smoke

Presets (the ARG after the colon):
  smoke      CI: 2 tiny spaces × 3 coverages × 2 seeds, 40 steps (well under 2 min on 2 cores).
  cpu        2 idle CPU cores, under an hour (≈120k replica-steps; training alone ran at 70–80
             replica-steps/s, experiments/benchmarks/results/sweep_throughput_cpu.md): |O| ∈ {100,
             400, 1000}, coverage 0.1–0.9 (5 points), 2 seeds, a 2-layer d_model-64 model, batch
             128, 4000 steps at lr 1e-3. It does NOT show the transition, and no CPU-sized setting
             tried did (issue 6 item a; experiments/results/cpu_phase_transition.md). Held-out
             two-object accuracy is ≈0 at low coverage, where the model memorises training
             objects, and sits at 0.3–0.45 at high coverage, the level of a model that does not
             bind (training two-object accuracy stays ≈0.45 too). It never clearly crosses 0.5:
             the one 0.502 was plateau noise. These settings at |O| = 400, seed 0, 3000 steps,
             load ≈5, final (best) step: coverage 0.3 / 0.6 / 0.9 → 0.003 (0.35) / 0.28 (0.43) /
             0.37 (0.43). 9 probes (lr 1e-3–3e-3, wd 0.1–3, |O| 400–2500, 4 layers or d_model 128,
             batch up to 512, up to 5000 steps): none crossed 0.5 with binding. The likely cause
             is that the query tower's object codes stay additive (tests/test_train.py: the
             docstring of test_tiny_model_learns_and_coverage_one_reports_training_objects).
  paper      the study's grid: |O| ∈ {400 (C=2, V=20), 2500 (C=2, V=50), 125000 (C=3, V=50)},
             coverage 0.1–0.9, 3 seeds, the published model (d_model 256, 6 layers, d_out 64,
             batch 512, 50k steps, lr 3e-5). For accelerators / TPU pods (launch/).
  paper_20m  as paper with the ~20M-parameter towers of the paper's sweeps (d_model 512, d_out 512).

Any field can be overridden; grid lists take comma lists or single values, e.g.
--config.grid.seeds=0,1,2 --config.grid.coverages=0.5 --config.grid.spaces='(2,20),(3,10)'
--config.sweep.chunk_size=8 --config.num_steps=2000. Sweep settings: sweep.chunk_size (-1
automatic from device memory and, on CPU, each core's share of the last-level cache; 0 all
replicas at once; n replicas at a time), sweep.num_data
(devices per replica group, which split its scenes; the rest of the devices form the "replica"
mesh axis), sweep.memory_fraction, sweep.fast_compile (cheaper
XLA compiles of slower code: for tiny models), sweep.cpu_devices (CPU hosts: -1 one device per
core, each single-threaded, so replicas run side by side; 0 JAX's default single CPU device;
ignored when XLA_FLAGS sets the host device count).
"""
import ml_collections

from bindjax import train

COVERAGES_0_1_TO_0_9 = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# gpu_quick's step count: about 5 minutes of training for its 7 replicas on one H200.
GPU_QUICK_STEPS = 6000


def get_config(arg="smoke"):
  """Sweep config for preset `arg` (smoke | cpu | gpu_quick | paper | paper_20m)."""
  c = train.default_config()
  c.sweep = ml_collections.ConfigDict(dict(chunk_size=-1, num_data=1, memory_fraction=0.7,
                                           fast_compile=False, cpu_devices=-1))
  c.grid = ml_collections.ConfigDict(dict(
      spaces=((2, 20),), coverages=COVERAGES_0_1_TO_0_9, seeds=(0, 1, 2),
      learning_rates=(), weight_decays=(), models=()))
  if arg == "smoke":
    c.grid.spaces = ((2, 4), (2, 6))
    c.grid.coverages = (0.3, 0.6, 0.9)
    c.grid.seeds = (0, 1)
    c.sweep.fast_compile = True
    c.model.update(d_model=32, num_heads=2, num_layers=1, d_ff=64, d_out=16)
    c.sampler.update(batch_size=32, max_concept_queries=16, max_positive_queries=16)
    c.optimizer.learning_rate = 1e-3
    c.num_steps = 40
    c.eval.update(every=20, batches=2, batch_size=32)
    c.log_every = 10
    c.checkpoint.update(every=20, keep=2)
  elif arg == "cpu":
    c.grid.spaces = ((2, 10), (2, 20), (3, 10))
    c.grid.coverages = (0.1, 0.3, 0.5, 0.7, 0.9)
    c.grid.seeds = (0, 1)
    c.model.update(d_model=64, num_heads=4, num_layers=2, d_ff=256, d_out=32)
    c.sampler.update(batch_size=128)
    c.optimizer.learning_rate = 1e-3
    c.num_steps = 4000
    c.eval.update(every=500, batches=4, batch_size=256)
    c.log_every = 100
    c.checkpoint.update(every=500, keep=2)
  elif arg == "gpu_quick":
    # The published towers on one GPU in about 5 minutes; steps from the measured step rate.
    c.grid.spaces = ((2, 20),)
    c.grid.coverages = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    c.grid.seeds = (0,)
    c.model.compute_dtype = "bfloat16"
    c.optimizer.learning_rate = 1e-4
    c.num_steps = GPU_QUICK_STEPS
    c.eval.update(every=GPU_QUICK_STEPS // 10, batches=4)
    c.log_every = 100
    c.checkpoint.update(every=GPU_QUICK_STEPS // 2, keep=1)
  elif arg in ("paper", "paper_20m"):
    c.grid.spaces = ((2, 20), (2, 50), (3, 50))
    if arg == "paper_20m":
      c.model.update(d_model=512, num_heads=8, d_out=512)
    c.log_every = 100
    c.checkpoint.update(every=2000, keep=2)
  else:
    raise ValueError(f"experiments/coverage_sweep.py: preset {arg!r}; expected smoke, cpu, "
                     "gpu_quick, paper or paper_20m")
  return c
