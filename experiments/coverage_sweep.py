"""Presets of `bindjax sweep`: held-out object recognition vs coverage × object-space size × seed.

  bindjax sweep --config=experiments/coverage_sweep.py:smoke --workdir=/tmp/bindjax_sweep_smoke
  bindjax report --workdir=/tmp/bindjax_sweep_smoke --overwrite   # redraw the sweep's report
  bindjax sweep --config=experiments/coverage_sweep.py:cpu --workdir=runs/cpu
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_144 --workdir=runs/cpu_144
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_c3 --workdir=runs/cpu_c3
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_196 --workdir=runs/cpu_196
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_256_c4 --workdir=runs/cpu_256_c4
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_256_c2 --workdir=runs/cpu_256_c2
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_400 --workdir=runs/cpu_400
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_095 --workdir=runs/cpu_095
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_144_095 --workdir=runs/cpu_144_095
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_64 --workdir=runs/cpu_plain_64
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_36 --workdir=runs/cpu_plain_36
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_law --workdir=runs/cpu_plain_law
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_product_64 --workdir=runs/cpu_product_64
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_64_wd03 --workdir=runs/cpu_plain_64_wd03
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_36_wd03 --workdir=runs/cpu_plain_36_wd03
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_49_wd03 --workdir=runs/cpu_plain_49_wd03
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_64_wd03_low --workdir=runs/cpu_plain_64_wd03_low
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_64_wd03_60 --workdir=runs/cpu_plain_64_wd03_60
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_product_64_wd03 --workdir=runs/cpu_product_64_wd03
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_ff1024_64 --workdir=runs/cpu_plain_ff1024_64
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_ff1024_100 --workdir=runs/cpu_plain_ff1024_100
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_c3_64_wd03 --workdir=runs/cpu_plain_c3_64_wd03
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_c3_27_wd03 --workdir=runs/cpu_plain_c3_27_wd03
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_c4_81_wd03 --workdir=runs/cpu_plain_c4_81_wd03
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_product_c4_81_wd03 --workdir=runs/cpu_product_c4_81_wd03
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_c4_81_wd03_long --workdir=runs/cpu_plain_c4_81_wd03_long
  bindjax sweep --config=experiments/coverage_sweep.py:cpu_plain_c4_81_wd03_095 --workdir=runs/cpu_plain_c4_81_wd03_095

Presets (the ARG after the colon):
  smoke      2 tiny spaces (|O| = 16, 36) × 3 coverages × 2 seeds, a 1-layer d_model-32 model,
             40 steps, cheap compiles: checks the machinery.
  cpu        |O| = 100 (C = 2, V = 10), coverage 0.3–0.9 (5 points), 4 seeds, a 2-layer
             d_model-64 model with the product read-out in both towers, training queries
             restricted to training objects, batch 128, 10,000 steps at lr 1e-3.
  cpu_144    the same model and grid at |O| = 144 (C = 2, V = 12), 12,000 steps.
  cpu_c3     the same model and grid in a three-concept space, |O| = 125 (C = 3, V = 5), 10,000
             steps: |O| between the two C = 2 sizes, to tell a dependence of critical coverage
             on |O| from one on the number of concepts.
  cpu_196    the same model at |O| = 196 (C = 2, V = 14), 15,000 steps, coverage 0.2, 0.3, 0.5,
             0.7, 0.9: a size outside the range the three sizes above were fitted on, its grid
             centred where their law puts ρ* (about 0.5) before it was run.
  cpu_256_c4 the same model and cpu_196's grid and steps at |O| = 256 with four concepts (C = 4,
             V = 4), where the size laws and the law with a term in C predict apart
             (docs/findings/scaling_law.md, "Predictions for |O| = 256").
  cpu_256_c2 cpu_256_c4 with two concepts (C = 2, V = 16): the same |O|, model, grid, seeds and
             steps, so that the pair measures the effect of C at fixed |O|.
  cpu_400    the same model and grid at the study's |O| = 400 (C = 2, V = 20), 20,000 steps
             (3.2 times the read-out's learning-time law there, 193·|O|^0.58): the read-out's
             law at the study's first size (docs/findings/scaling_law.md, "Predictions for
             |O| = 400").
  cpu_095, cpu_144_095
             cpu and cpu_144 at coverage 0.95 alone (4 replicas each): the point above their
             grids that the transition test's upper half asks for, where a seed of each stays
             below 0.8 at coverage 0.9 with ρ* unchanged over the last quarter of the run.
  cpu_plain_64
             plain towers (the cpu towers without the product read-out) at |O| = 64 (C = 2,
             V = 8), coverage 0.3–0.9 (4 points) × 2 seeds × weight decay 0, 0.01 and 0.03, lr
             3e-3, 8,000 steps: does weight decay turn the plain towers' memorisation of their
             training objects into generalisation (docs/findings/scaling_law.md)?
  cpu_plain_36
             60 replicas of plain towers at |O| = 36 (C = 2, V = 6): 12 coverages 0.25–0.9 × 5
             seeds, lr 3e-3 without weight decay, 5,000 steps: the sweep whose every replica
             `bindjax binding` fits (the study's third claim on plain towers that bind).
  cpu_plain_law
             the cpu_plain_36 towers and optimiser (lr 3e-3, no weight decay) at |O| = 25 (C = 2,
             V = 5) and 64 (C = 2, V = 8), coverage 0.3–0.9 (5 points) × 4 seeds, 10,000 steps:
             with cpu_plain_36, the plain towers' critical coverage at three sizes.
  cpu_product_64
             cpu_plain_law's |O| = 64 half (grid, seeds, optimiser, 10,000 steps) with the
             product read-out in both towers: beside it, the read-out is the only difference.
  cpu_plain_64_wd03
             cpu_plain_law's |O| = 64 half with weight decay 0.03, the one lever that steepened
             the plain curve at 64 over 2 seeds (cpu_plain_64): does it give a transition at
             4 seeds?
  cpu_plain_64_wd03_low
             cpu_plain_64_wd03 at coverage 0.2 alone (4 replicas): the point below its grid that
             the transition test's lower half asks for, its seeds 0.18-0.25 at coverage 0.3.
  cpu_plain_64_wd03_60
             60 replicas of cpu_plain_64_wd03's towers, optimiser and 10,000 steps: 12 coverages
             0.2-0.9 (denser around its rho* of 0.65) × seeds 0-4, at the first plain size
             whose 4-seed grid passed the transition test (here one seed of five misses it at
             0.9): the replicas `bindjax binding` fits for the third claim.
  cpu_product_64_wd03
             cpu_product_64 with weight decay 0.03 and coverage 0.2 added (0.2-0.9 × 4 seeds):
             beside cpu_plain_64_wd03 and its 0.2 point, the read-out is the only difference.
  cpu_plain_49_wd03
             cpu_plain_64_wd03's towers, optimiser and steps at |O| = 49 (C = 2, V = 7), coverage
             0.2, 0.3, 0.5, 0.7, 0.8, 0.9 × 4 seeds: with |O| = 36 and 64, weight decay 0.03 at
             three sizes.
  cpu_plain_c3_64_wd03
             cpu_plain_64_wd03's towers, optimiser and steps at |O| = 64 with C = 3 (V = 4),
             coverage 0.2, 0.3, 0.5, 0.7, 0.8, 0.9 × 4 seeds: the same |O| as cpu_plain_64_wd03
             with fewer values per concept (these towers bind its training scenes as fast as
             at C = 2, docs/findings/learning_time.md): is rho* set by |O| or by V?
  cpu_plain_c3_27_wd03
             cpu_plain_c3_64_wd03 at |O| = 27 (C = 3, V = 3), same grid, seeds and steps: a
             second C = 3 size, where the plain law with a term in C and the laws in |O| alone
             predict apart (docs/findings/scaling_law.md).
  cpu_plain_c4_81_wd03
             cpu_plain_c3_64_wd03 at |O| = 81 (C = 4, V = 3), coverage 0.1, 0.2, 0.3, 0.5, 0.7,
             0.9 × 4 seeds: the first plain size past 64 these towers bind (learning_time.md),
             where the plain law with a term in C (about 0.41) and the laws in |O| alone (about
             0.63) predict apart; the grid reaches down to the lower prediction's range.
  cpu_product_c4_81_wd03
             cpu_plain_c4_81_wd03 with the product read-out in both towers: beside it, the
             read-out is the only difference (as cpu_product_64_wd03 beside cpu_plain_64_wd03).
  cpu_plain_c4_81_wd03_long
             cpu_plain_c4_81_wd03 at coverage 0.3, 0.5, 0.7, 0.9 × its 4 seeds with twice the
             steps (20,000): two seeds end below 0.8 at coverage 0.9 after 10,000 steps; does a
             longer schedule lift the top of the curve, and does rho* move with it?
  cpu_plain_c4_81_wd03_095
             cpu_plain_c4_81_wd03 at coverage 0.95 (seeds 0-3): the point above its grid that
             the transition test's upper half asks for, as cpu_095 for cpu (twice the steps did
             not lift coverage 0.9).
  cpu_plain_36_wd03
             cpu_plain_36 (its 60 replicas, grid, seeds and 5,000 steps) with weight decay
             0.03: does the lever that lifted every seed at |O| = 64's top coverage give a
             whole transition at 36, and how do the binding fits rank its replicas?
  cpu_plain_ff1024_64
             cpu_plain_law's |O| = 64 half (coverage 0.3–0.9 × 4 seeds, lr 3e-3 without weight
             decay, 10,000 steps) with d_ff 1,024: the cheapest plain configuration that binds
             |O| = 64 and 100 (docs/findings/learning_time.md), so that beside cpu_plain_law only
             the width differs; the first size of a plain law under one configuration.
  cpu_plain_ff1024_100
             cpu_plain_ff1024_64 at |O| = 100 (C = 2, V = 10), 15,000 steps (the schedule under
             which this configuration bound 100 at coverage 1).
  gpu_plain_400
             plain towers (no product read-out; the cpu towers with d_ff 1,024) at the study's
             |O| = 400 (C = 2, V = 20), coverage 0.2–0.9 (8 points), 4 seeds, lr 3e-3 without
             weight decay (the cheapest plain configuration that binds |O| = 64 and 100,
             docs/findings/learning_time.md), evaluated 20 times: for one GPU;
             `device_sweep.sh plain400` re-sizes its steps from the measured rate.
  gpu_quick  the published towers (d_model 256, 6 layers, bfloat16 matmuls) for one GPU:
             |O| = 400, coverage 0.2–0.8, 1 seed, training queries restricted to training
             objects, lr 1e-4. experiments/benchmarks/device_sweep.sh re-sizes its steps from the
             measured rate.
  paper      the study's grid: |O| ∈ {400 (C=2, V=20), 2500 (C=2, V=50), 125000 (C=3, V=50)},
             coverage 0.1–0.9, 3 seeds, the published model (d_model 256, 6 layers, d_out 64,
             batch 512, 50k steps, lr 3e-5). For accelerators / TPU pods (launch/).
  paper_20m  as paper with the ~20M-parameter towers of the paper's sweeps (d_model 512, d_out 512).

What the cpu presets showed: docs/findings/scaling_law.md; the levers behind them and the
gpu_quick run: docs/findings/phase_transition.md.

Any field can be overridden; grid lists take comma lists or single values, e.g.
--config.grid.seeds=0,1,2 --config.grid.coverages=0.5 --config.grid.spaces='(2,20),(3,10)'
--config.sweep.chunk_size=8 --config.num_steps=2000. Sweep settings: sweep.chunk_size ("auto"
from device memory and, on CPU, each core's share of the last-level cache; "none" all replicas
at once; n replicas at a time), sweep.num_data
(devices per replica group, which split its scenes; the rest of the devices form the "replica"
mesh axis), sweep.memory_fraction, sweep.fast_compile (cheaper
XLA compiles of slower code: for tiny models), sweep.cpu_devices (CPU hosts: -1 one device per
core, each single-threaded, so replicas run side by side; 0 JAX's default single CPU device;
ignored when XLA_FLAGS sets the host device count), sweep.packing ("auto": buckets packed onto
lanes of the devices when that keeps more of them busy; "none": buckets one after another over
every device; docs/training.md, "Lanes").
"""
import ml_collections

from bindjax.training import run_spec

COVERAGES_0_1_TO_0_9 = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# gpu_quick's step count, from the measured step rate on one GPU
# (docs/findings/phase_transition.md).
GPU_QUICK_STEPS = 15000
# The CPU scaling-law presets: one object space each, the same model and seeds.
CPU_SPACES = {"cpu": (2, 10), "cpu_144": (2, 12), "cpu_c3": (3, 5), "cpu_196": (2, 14),
              "cpu_256_c4": (4, 4), "cpu_256_c2": (2, 16), "cpu_400": (2, 20)}
# Training steps grow with the number of training objects (about as n^1.3 to fit them); at
# |O| = 196, 3.5 times the product read-out's learning-time law (193·|O|^0.58 steps), the
# multiple |O| = 144 had.
CPU_STEPS = {"cpu": 10000, "cpu_144": 12000, "cpu_c3": 10000, "cpu_196": 15000,
             "cpu_256_c4": 15000, "cpu_256_c2": 15000, "cpu_400": 20000}
CPU_COVERAGES = (0.3, 0.5, 0.7, 0.8, 0.9)
# The law fitted on |O| = 100, 125 and 144 puts ρ*(196) near 0.5, where this grid's 0.8 would
# say little and a point below 0.3 is needed to see the curve start.
CPU_196_COVERAGES = (0.2, 0.3, 0.5, 0.7, 0.9)
# Presets that add coverage 0.95 to a CPU scaling-law preset's grid, run as their own sweep.
TOP_COVERAGE_PRESETS = {"cpu_095": "cpu", "cpu_144_095": "cpu_144",
                        "cpu_plain_c4_81_wd03_095": "cpu_plain_c4_81_wd03"}
# Twelve coverages of |O| = 36 with distinct training-object counts (9 to 32).
PLAIN_36_COVERAGES = (0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9)
# Twelve coverages of |O| = 64 with distinct training-object counts (12 to 57), half of them
# within 0.1 of cpu_plain_64_wd03's rho* (0.65).
PLAIN_64_COVERAGES = (0.2, 0.3, 0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9)
# cpu_plain_law and the presets that change one of its settings, with their object spaces.
PLAIN_LAW_PRESETS = {"cpu_plain_law": ((2, 5), (2, 8)), "cpu_product_64": ((2, 8),),
                     "cpu_plain_64_wd03": ((2, 8),), "cpu_plain_64_wd03_low": ((2, 8),),
                     "cpu_plain_49_wd03": ((2, 7),), "cpu_plain_64_wd03_60": ((2, 8),),
                     "cpu_product_64_wd03": ((2, 8),), "cpu_plain_c3_64_wd03": ((3, 4),),
                     "cpu_plain_c3_27_wd03": ((3, 3),), "cpu_plain_c4_81_wd03": ((4, 3),),
                     "cpu_product_c4_81_wd03": ((4, 3),)}
# |O| = 81 at C = 4: down to 0.1, where the plain law with a term in C put rho* near 0.4.
C4_81_COVERAGES = (0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
# cpu_plain_c4_81_wd03_long: the coverages around its rho* (0.578) and the top, twice the steps.
C4_81_LONG_COVERAGES, C4_81_LONG_STEPS = (0.3, 0.5, 0.7, 0.9), 20000
# Plain towers with d_ff 1,024 (cpu_plain_law's |O| = 64 half, one width changed), per preset
# its object space and steps.
PLAIN_FF1024_PRESETS = {"cpu_plain_ff1024_64": ((2, 8), 10000),
                        "cpu_plain_ff1024_100": ((2, 10), 15000)}
# gpu_plain_400's step count before device_sweep.sh re-sizes it from the measured rate.
GPU_PLAIN_STEPS = 40000


def _use_cpu_towers(c, product_readout, d_ff=256):
  """The CPU presets' towers (2 layers, d_model 64, d_out 32), batch 128 with training queries
  over training objects, 4 evaluation batches of 256 every 500 steps, checkpoints every 1,000."""
  c.model.update(d_model=64, num_heads=4, num_layers=2, d_ff=d_ff, d_out=32,
                 product_readout=product_readout)
  c.sampler.update(batch_size=128, train_queries="train")
  c.eval.update(every=500, batches=4, batch_size=256)
  c.log_every = 100
  c.checkpoint.update(every=1000, keep=2)


def get_config(arg="smoke"):
  """Sweep config for preset `arg`: one of the presets the module docstring lists."""
  c = run_spec.default_config()
  c.sweep.cpu_devices = -1   # replicas side by side, one per core
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
  elif arg in CPU_SPACES:
    c.grid.spaces = (CPU_SPACES[arg],)
    c.grid.coverages = (CPU_COVERAGES if arg in ("cpu", "cpu_144", "cpu_c3")
                        else CPU_196_COVERAGES)
    c.grid.seeds = (0, 1, 2, 3)
    _use_cpu_towers(c, product_readout="both")
    c.optimizer.learning_rate = 1e-3
    c.num_steps = CPU_STEPS[arg]
  elif arg in TOP_COVERAGE_PRESETS:
    c = get_config(TOP_COVERAGE_PRESETS[arg])
    c.grid.coverages = (0.95,)
  elif arg == "cpu_plain_64":
    c.grid.spaces = ((2, 8),)
    c.grid.coverages = (0.3, 0.5, 0.7, 0.9)
    c.grid.seeds = (0, 1)
    c.grid.weight_decays = (0.0, 0.01, 0.03)
    _use_cpu_towers(c, product_readout="none")
    c.optimizer.learning_rate = 3e-3
    c.num_steps = 8000
  elif arg in ("cpu_plain_36", "cpu_plain_36_wd03"):
    c.grid.spaces = ((2, 6),)
    c.grid.coverages = PLAIN_36_COVERAGES
    c.grid.seeds = (0, 1, 2, 3, 4)
    _use_cpu_towers(c, product_readout="none")
    c.optimizer.update(learning_rate=3e-3,
                       weight_decay=0.03 if arg == "cpu_plain_36_wd03" else 0.0)
    c.num_steps = 5000
  elif arg in PLAIN_LAW_PRESETS:
    product = arg.startswith("cpu_product")
    c.grid.spaces = PLAIN_LAW_PRESETS[arg]
    c.grid.coverages = {"cpu_plain_64_wd03_low": (0.2,),
                        "cpu_plain_49_wd03": (0.2,) + CPU_COVERAGES,
                        "cpu_plain_c3_64_wd03": (0.2,) + CPU_COVERAGES,
                        "cpu_plain_c3_27_wd03": (0.2,) + CPU_COVERAGES,
                        "cpu_plain_c4_81_wd03": C4_81_COVERAGES,
                        "cpu_product_c4_81_wd03": C4_81_COVERAGES,
                        "cpu_product_64_wd03": (0.2,) + CPU_COVERAGES,
                        "cpu_plain_64_wd03_60": PLAIN_64_COVERAGES}.get(arg, CPU_COVERAGES)
    c.grid.seeds = (0, 1, 2, 3, 4) if arg == "cpu_plain_64_wd03_60" else (0, 1, 2, 3)
    _use_cpu_towers(c, product_readout="both" if product else "none")
    c.optimizer.update(learning_rate=3e-3, weight_decay=0.03 if "wd03" in arg else 0.0)
    c.num_steps = 10000
  elif arg == "cpu_plain_c4_81_wd03_long":
    c = get_config("cpu_plain_c4_81_wd03")
    c.grid.coverages = C4_81_LONG_COVERAGES
    c.num_steps = C4_81_LONG_STEPS
  elif arg in PLAIN_FF1024_PRESETS:
    c = get_config("cpu_plain_law")
    space, c.num_steps = PLAIN_FF1024_PRESETS[arg]
    c.grid.spaces = (space,)
    c.model.d_ff = 1024
  elif arg == "gpu_plain_400":
    c.grid.spaces = ((2, 20),)
    c.grid.coverages = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    c.grid.seeds = (0, 1, 2, 3)
    _use_cpu_towers(c, product_readout="none", d_ff=1024)
    c.optimizer.update(learning_rate=3e-3, weight_decay=0.0)
    c.num_steps = GPU_PLAIN_STEPS
    c.eval.every = GPU_PLAIN_STEPS // 20
    c.checkpoint.update(every=GPU_PLAIN_STEPS, keep=1)
  elif arg == "gpu_quick":
    # The published towers on one GPU.
    c.grid.spaces = ((2, 20),)
    c.grid.coverages = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    c.grid.seeds = (0,)
    c.model.compute_dtype = "bfloat16"
    c.sampler.train_queries = "train"
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
                     "cpu_144, cpu_c3, cpu_196, cpu_256_c4, cpu_256_c2, cpu_400, cpu_095, cpu_144_095, "
                     "cpu_plain_64, "
                     "cpu_plain_36, cpu_plain_law, cpu_product_64, cpu_plain_64_wd03, "
                     "cpu_plain_64_wd03_low, cpu_plain_49_wd03, cpu_plain_64_wd03_60, "
                     "cpu_product_64_wd03, cpu_plain_36_wd03, cpu_plain_ff1024_64, "
                     "cpu_plain_ff1024_100, cpu_plain_c3_64_wd03, cpu_plain_c3_27_wd03, "
                     "cpu_plain_c4_81_wd03, cpu_plain_c4_81_wd03_long, cpu_plain_c4_81_wd03_095, "
                     "cpu_product_c4_81_wd03, "
                     "gpu_plain_400, gpu_quick, "
                     "paper "
                     "or paper_20m")
  return c
