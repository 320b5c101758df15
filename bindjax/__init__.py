"""bindjax: how embedding models bind concepts, in JAX/Flax.

One package per layer, lowest first; each imports only from the ones above it here:

  base/       Basics every layer uses: files and JSON, errors, config values, progress.
  core/       The task and the model: concept world, scenes, towers, objectives.
  runtime/    Running on devices: mesh and sharding, the vmapped replica engine, XLA.
  workdir/    A sweep's workdir: lock, checks, result rows and schema, writer, checkpoints.
  training/   Training sweeps: grid, bucket packing, bucket programs, step, sweep loop.
  reporting/  Reading finished sweeps: statistics, markdown tables, plots.
  frozen/     Frozen embedding sets: storage, extraction, original-code files, probes, geometry.
  complexity/ How complex a set's binding is: approximator families and their fits.
  commands/   The `bindjax` command line (main.py) and one module per subcommand.
"""

__version__ = "0.1.0"
