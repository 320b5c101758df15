"""Throughput of the vmapped sweep vs the same runs one after another.

  .venv/bin/python experiments/benchmarks/sweep_throughput.py            # CPU: 16 replicas
  .venv/bin/python experiments/benchmarks/sweep_throughput.py --processes=2   # pinned processes
  .venv/bin/python experiments/benchmarks/sweep_throughput.py --mode=device --model=paper \
      --replicas=1,8,64 --peak_tflops=989        # accelerator: replica-steps/s and MFU

compare: R replicas of a small config trained by ONE compiled bucket program
(bindjax.training.sweep), one step per dispatch (steps_per_dispatch.py measures the sweep loop's
several), over one CPU device per core as `bindjax sweep` sets up (config.sweep.cpu_devices), in one
process and (--processes=P) in P local processes pinned to their cores as launch/local.py starts
them, vs R single-replica runs one after another with the same code (a 1-replica bucket, compiled
once) on one device, both single-threaded per device and (in a worker subprocess) with JAX's default
CPU set-up. Each of --repeats rounds times them all back to back, so the drift of a shared machine
hits a round's numbers alike; a round's speedup is its sweep rate over its faster sequential
rate. Train steps only (compile excluded, reported apart). Medians over rounds, with the spread.
Beside replica-steps/s: the model FLOP/s they are (bindjax.training.train.train_step_flops per
replica-step) and their share of the machine's float32 matmul rate measured in the same run, as the
sweep's devices reach it (a 2048³ matmul on every device at once, before and after the rounds, the
faster taken).

device: for each R, replica-steps/s and model FLOP utilisation (FLOPs of the matmuls from
bindjax.core.models.tower_flops, x3 for forward + backward) against --peak_tflops.

Writes a Markdown table and JSON to experiments/benchmarks/results/.
"""
import argparse
import functools
import json
import os
import platform
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from bindjax.base import files
from bindjax.commands import flags
from bindjax.runtime import engine, multihost, parallel, xla_options
from bindjax.training import bucket_programs, grid, train
import repeats  # experiments/benchmarks/repeats.py, beside this script

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESETS = os.path.join(REPO, "experiments", "coverage_sweep.py")

RESULTS = os.path.join(REPO, "experiments", "benchmarks", "results")
# The cpu preset's towers (product read-out on), the same plain, and plain at d_ff 1,024
# (gpu_plain_400's towers) and 2,048.
CPU_MODELS = {"cpu": {}, "cpu_plain": {"product_readout": "none"},
              "cpu_plain_ff1024": {"product_readout": "none", "d_ff": 1024},
              "cpu_plain_ff2048": {"product_readout": "none", "d_ff": 2048}}


def config_for(model, replicas):
  """A sweep config with exactly `replicas` replicas (coverages × seeds) of one bucket."""
  c = flags.load_config(f"{PRESETS}:{'paper' if model == 'paper' else 'smoke'}")
  c.grid.spaces = ((2, 20),) if model == "paper" else ((2, 10),)
  coverages = (0.2, 0.4, 0.6, 0.8)
  c.grid.coverages = coverages[:min(replicas, 4)]
  c.grid.seeds = tuple(range(max(1, replicas // len(c.grid.coverages))))
  c.sweep.fast_compile = False
  if model == "small":
    c.model.update(d_model=32, num_heads=2, num_layers=1, d_ff=64, d_out=16)
    c.sampler.update(batch_size=32)
  elif model in CPU_MODELS:
    cpu = flags.load_config(f"{PRESETS}:cpu")
    c.model = cpu.model
    c.model.update(CPU_MODELS[model])
    c.sampler = cpu.sampler
  return c


def single_bucket(config):
  """The config's only bucket."""
  _, buckets = grid.expand_grid(config)
  (bucket,) = buckets
  return bucket


def bucket_runner(config, devices=None, chunk=parallel.AUTO):
  """(compile seconds, run(steps) -> seconds, bucket, chunk) for the config's single bucket."""
  bucket = single_bucket(config)
  mesh = parallel.make_mesh(devices=devices)
  inputs, _ = engine.place(bucket.stacked_inputs(), mesh)
  t0 = time.perf_counter()
  init_fn, run_fn, _, chunk = bucket_programs.compile_bucket(
      bucket.spec, mesh, inputs, chunk, log=lambda *_: None,
      fast_compile=bool(config.sweep.fast_compile))
  compile_seconds = time.perf_counter() - t0
  one = bucket_programs.global_scalar(1, mesh)
  state = init_fn(inputs)
  state, metrics = run_fn(state, inputs, one)  # warm-up
  jax.block_until_ready(metrics)

  def run(steps):
    nonlocal state
    t = time.perf_counter()
    for _ in range(steps):
      state, metrics = run_fn(state, inputs, one)
    jax.block_until_ready(metrics)
    return time.perf_counter() - t

  return compile_seconds, run, bucket, chunk


def matmul_rate(size=2048, repeats=5):
  """Float32 FLOP/s of a size³ matmul on every device at once (median over `repeats`), compiled
  with bindjax's compiler options: the machine's matmul rate as the sweep's devices reach it."""
  devices = jax.devices()
  xs = [jax.device_put(jnp.ones((size, size), jnp.float32), d) for d in devices]
  options = xla_options.compiler_options(devices[0].platform)
  programs = [jax.jit(lambda a: a @ a).lower(x).compile(options) for x in xs]  # one per device
  jax.block_until_ready([f(x) for f, x in zip(programs, xs)])
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready([f(x) for f, x in zip(programs, xs)])
    times.append(time.perf_counter() - t)
  return 2 * size ** 3 * len(devices) / float(np.median(times))


def sequential_runners(args, bucket):
  """One 1-replica runner per replica of `bucket`, all on the first device."""
  runners = []
  for replica in bucket.replicas:
    one = config_for(args.model, 1)
    one.grid.coverages = (replica.coverage,)
    one.grid.seeds = (replica.seed,)
    runners.append(bucket_runner(one, devices=jax.devices()[:1]))
  return runners


def sequential_rate(runners, steps):
  """Replica-steps/s of the runs trained one after another."""
  return len(runners) * steps / sum(runner[1](steps) for runner in runners)


def serve(args, runner):
  """Worker loop: prints `runner`'s set-up as JSON, then answers each line `steps` on stdin with
  `runner.measure(steps)` as JSON on stdout, until stdin closes."""
  print(json.dumps(runner.setup), flush=True)
  for line in sys.stdin:
    print(json.dumps(runner.measure(int(line))), flush=True)


class SequentialPart:
  """--part=sequential: the runs one after another in this process's CPU set-up."""

  def __init__(self, args):
    self.singles = sequential_runners(
        args, single_bucket(config_for(args.model, args.replicas[0])))
    self.setup = {"compile_s": self.singles[0][0]}

  def measure(self, steps):
    return {"rate": sequential_rate(self.singles, steps)}


class SweepProcessPart:
  """--part=sweep_process: process `process_id` of a sweep over `processes` local processes
  joined by jax.distributed (pinned to their cores by the parent), each running its share."""

  def __init__(self, args):
    multihost.maybe_initialize_distributed(f"127.0.0.1:{args.port}", args.processes,
                                           args.process_id)
    compile_s, self.run, _, chunk = bucket_runner(config_for(args.model, args.replicas[0]),
                                                  chunk=args.chunk)
    self.setup = {"compile_s": compile_s, "chunk": chunk, "devices": jax.device_count(),
                  "local_devices": jax.local_device_count()}

  def measure(self, steps):
    return {"seconds": self.run(steps)}


class Worker:
  """A subprocess running one --part, measuring when asked, so that its measurements
  interleave with this process's (a CPU set-up is fixed per process)."""

  def __init__(self, args, part, extra=(), env=None, cores=None):
    command = [sys.executable, os.path.abspath(__file__), f"--part={part}",
               f"--model={args.model}", f"--replicas={args.replicas[0]}",
               f"--chunk={args.chunk}", *extra]
    command += ["--xla_defaults"] if args.xla_defaults else []
    self.process = subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        preexec_fn=cores and functools.partial(os.sched_setaffinity, 0, cores))
    self.setup = None

  def ready(self):
    self.setup = self.reply()

  def reply(self):
    line = self.process.stdout.readline()
    if not line:
      raise RuntimeError(f"benchmark worker exited with {self.process.wait()}")
    return json.loads(line)

  def ask(self, steps):
    self.process.stdin.write(f"{steps}\n")
    self.process.stdin.flush()

  def close(self):
    """Closes stdin: the worker then exits (call wait after closing every worker, since the
    processes of one jax.distributed job leave together)."""
    self.process.stdin.close()

  def wait(self):
    return self.process.wait()


def jax_defaults_worker(args):
  """Worker timing the sequential runs with JAX's default CPU set-up."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  worker = Worker(args, "sequential", ["--cpu_devices=0"], env=env)
  worker.ready()
  return worker


def sweep_process_workers(args):
  """args.processes workers, each pinned to its share of the cores, running one sweep."""
  groups = parallel.split_cores(args.processes)
  if groups is None:
    raise SystemExit(f"--processes={args.processes}: more processes than cores")
  port = _free_port()
  workers = [Worker(args, "sweep_process", [f"--processes={args.processes}",
                                            f"--process_id={i}", f"--port={port}"],
                    cores=cores)
             for i, cores in enumerate(groups)]
  for worker in workers:
    worker.ready()
  return workers


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def compare(args):
  """Sweep vs sequential, measured in rounds: each round times the sweep(s) and then every
  sequential set-up back to back, so machine drift hits a round's measurements alike; the
  speedup of a round is its sweep rate over its fastest sequential rate. With --processes=P
  both sweeps run: in this process, and in P pinned processes."""
  replicas = args.replicas[0]
  config = config_for(args.model, replicas)
  workers = []
  try:
    compile_all, run_here, bucket, chunk = bucket_runner(config, chunk=args.chunk)
    sweeps = {f"sweep over {jax.device_count()} CPU devices{_chunk_text(chunk)}": run_here}
    compile_s = {"sweep_bucket": round(compile_all, 2)}
    if args.processes > 1:
      sweepers = sweep_process_workers(args)
      workers += sweepers
      setup = sweepers[0].setup
      compile_s["sweep_bucket_per_process"] = round(setup["compile_s"], 2)

      def run_processes(steps):
        for worker in sweepers:
          worker.ask(steps)
        return max(worker.reply()["seconds"] for worker in sweepers)
      sweeps[f"sweep over {args.processes} pinned processes × {setup['local_devices']} CPU "
             f"device(s){_chunk_text(setup['chunk'])}"] = run_processes
    singles = sequential_runners(args, bucket)
    compile_s["single_replica"] = round(singles[0][0], 2)
    threads = "single-threaded" if args.cores_as_devices else "multi-threaded"
    sequential = {f"one device of {jax.device_count()}, {threads} ops":
                  lambda: sequential_rate(singles, args.steps)}
    if args.cores_as_devices:
      default = jax_defaults_worker(args)
      workers.append(default)

      def default_rate():
        default.ask(args.steps)
        return default.reply()["rate"]
      sequential["JAX default CPU set-up (one device, multi-threaded ops)"] = default_rate
    sweep_rates = {name: [] for name in sweeps}
    rates = {name: [] for name in sequential}
    matmul_flops = matmul_rate()
    for _ in range(args.repeats):
      for name, run in sweeps.items():
        sweep_rates[name].append(replicas * args.steps / run(args.steps))
      for name, rate in sequential.items():
        rates[name].append(rate())
    matmul_flops = max(matmul_flops, matmul_rate())
  finally:
    for worker in workers:
      worker.close()
    for worker in workers:
      worker.wait()
  baselines = {name: np.array(r) for name, r in rates.items()}
  fastest_per_round = np.max(np.stack(list(baselines.values())), axis=0)
  step_flops = train.train_step_flops(bucket.spec)
  sweep_stats = {name: {"replica_steps_per_s": repeats.stats(np.array(r)),
                        "model_flops_per_s": repeats.stats(np.array(r) * step_flops),
                        "share_of_matmul_rate": repeats.stats(
                            np.array(r) * step_flops / matmul_flops),
                        "speedup": repeats.stats(np.array(r) / fastest_per_round)}
                 for name, r in sweep_rates.items()}
  result = {
      "mode": "compare", "model": args.model, "replicas": replicas, "steps": args.steps,
      "repeats": args.repeats, "spec": _describe(bucket.spec), "sweeps": sweep_stats,
      "sequential_replica_steps_per_s": {name: repeats.stats(r) for name, r in baselines.items()},
      "fastest_sequential_per_round": repeats.stats(fastest_per_round),
      "xla_options": "XLA defaults" if args.xla_defaults else "bindjax.runtime.xla_options",
      "sweep_chunk": chunk, "compile_s": compile_s, "flops_per_replica_step": step_flops,
      "matmul_flops_per_s": matmul_flops,
      "note": "train steps only; the sweep runs one bucket over all CPU devices (as `bindjax "
              "sweep` does, in one process, or in pinned processes as launch/local.py "
              "--num_processes starts them); sequential = one 1-replica bucket per run, "
              "compiled once, trained one after another, in both CPU set-ups; each round "
              "measures every set-up back to back, and a round's speedup is against its "
              "fastest sequential set-up",
  }
  table = [f"Machine's float32 matmul rate (2048³ on every device at once): "
           f"{matmul_flops / 1e9:.0f} GFLOP/s; model {step_flops / 1e9:.3f} GFLOP per "
           "replica-step.", "",
           "| R | model | set-up | replica-steps/s | model GFLOP/s | of matmul rate | speedup |",
           "|---:|---|---|---:|---:|---:|---:|"]
  for name, stats in sweep_stats.items():
    table.append(f"| {replicas} | {args.model} | {name} | "
                 f"{repeats.fmt(stats['replica_steps_per_s'])} | "
                 f"{stats['model_flops_per_s']['median'] / 1e9:.1f} | "
                 f"{stats['share_of_matmul_rate']['median']:.0%} | "
                 f"{repeats.fmt(stats['speedup'], 2)} |")
  for name, r in baselines.items():
    table.append(f"| {replicas} | {args.model} | sequential, {name} | "
                 f"{repeats.fmt(repeats.stats(r))} | "
                 f"{float(np.median(r)) * step_flops / 1e9:.1f} | "
                 f"{float(np.median(r)) * step_flops / matmul_flops:.0%} | |")
  return result, table


def _chunk_text(chunk):
  return f", {chunk} replicas at a time" if chunk else ""


def device(args):
  rows, table = [], ["| R | replica-steps/s | step time (s) | TFLOP/s | MFU | chunk "
                     "| compile (s) |", "|---:|---:|---:|---:|---:|---:|---:|"]
  for replicas in args.replicas:
    config = config_for(args.model, replicas)
    config.sweep.fast_compile = args.fast_compile
    if args.dtype:
      config.model.compute_dtype = args.dtype
    compile_seconds, run, bucket, chunk = bucket_runner(config, chunk=args.chunk)
    times = [run(args.steps) / args.steps for _ in range(args.repeats)]
    step_time = float(np.median(times))
    flops = replicas * train.train_step_flops(bucket.spec)
    tflops = flops / step_time / 1e12
    row = {"replicas": replicas, "replica_steps_per_s": replicas / step_time,
           "step_seconds": repeats.stats(np.array(times)), "tflops": tflops,
           "mfu": tflops / args.peak_tflops, "chunk": chunk,
           "compile_s": round(compile_seconds, 2),
           "flops_per_replica_step": train.train_step_flops(bucket.spec)}
    rows.append(row)
    table.append(f"| {replicas} | {row['replica_steps_per_s']:.1f} | {step_time:.4f} | "
                 f"{tflops:.1f} | {row['mfu']:.1%} | {chunk or '-'} | {compile_seconds:.1f} |")
    print(table[-1], flush=True)
  return {"mode": "device", "model": args.model, "peak_tflops": args.peak_tflops,
          "dtype": args.dtype or "float32", "steps": args.steps, "repeats": args.repeats,
          "rows": rows}, table


def _describe(spec):
  return {"space_size": spec.space.num_objects, "d_model": spec.model.d_model,
          "num_layers": spec.model.num_layers, "d_ff": spec.model.d_ff,
          "batch_size": spec.sampler.batch_size}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--mode", choices=["compare", "device"], default="compare")
  parser.add_argument("--model", choices=["small", *CPU_MODELS, "paper"], default="small")
  parser.add_argument("--replicas", default=None, help="comma list (compare uses the first)")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--peak_tflops", type=float, default=989.0,
                      help="device peak for MFU (H200/H100 dense bf16: 989)")
  parser.add_argument("--dtype", default=None, help="model.compute_dtype (e.g. bfloat16)")
  parser.add_argument("--out", default=None, help="output stem (default results/<name>)")
  parser.add_argument("--cpu_devices", type=int, default=-1,
                      help="as config.sweep.cpu_devices: -1 one CPU device per core, 0 JAX's "
                           "default")
  parser.add_argument("--chunk", default=parallel.AUTO,
                      help="as config.sweep.chunk_size: auto, none, or n replicas at a time")
  parser.add_argument("--xla_defaults", action="store_true",
                      help="compile with XLA's own CPU defaults (YNNPACK fusions on) instead of "
                           "bindjax.runtime.xla_options.CPU_OPTIONS, for comparison")
  parser.add_argument("--fast_compile", action="store_true",
                      help="device: compile as config.sweep.fast_compile does (cheaper XLA:CPU "
                           "compiles of slower code), for runs that check the script, not the "
                           "rate")
  parser.add_argument("--processes", type=int, default=1,
                      help="compare: also run the sweep in this many local processes joined "
                           "by jax.distributed, each pinned to its share of the cores")
  parser.add_argument("--part", choices=["all", "sequential", "sweep_process"], default="all",
                      help="internal: a worker that measures on request (lines of steps on "
                           "stdin, JSON on stdout)")
  parser.add_argument("--process_id", type=int, default=0, help="internal (sweep_process)")
  parser.add_argument("--port", type=int, default=0, help="internal (sweep_process)")
  args = parser.parse_args(argv)
  if args.xla_defaults:
    xla_options.CPU_OPTIONS = {}
  args.cores_as_devices = parallel.use_cpu_cores_as_devices(args.cpu_devices) > 0
  default_replicas = "16" if args.mode == "compare" else "1,8,64"
  args.replicas = [int(r) for r in (args.replicas or default_replicas).split(",")]
  if args.part != "all":
    serve(args, (SequentialPart if args.part == "sequential" else SweepProcessPart)(args))
    return 0
  result, table = compare(args) if args.mode == "compare" else device(args)
  result["machine"] = {"devices": [str(d) for d in jax.devices()], "cpus": os.cpu_count(),
                       "load_average": os.getloadavg(), "platform": platform.platform(),
                       "jax": jax.__version__}
  result["command"] = " ".join([os.path.relpath(sys.argv[0], REPO)] + (argv or sys.argv[1:]))
  name = "sweep_throughput" if args.mode == "compare" else f"device_sweep_{args.model}"
  stem = args.out or os.path.join(RESULTS, name)
  os.makedirs(os.path.dirname(stem), exist_ok=True)
  files.write_atomic(stem + ".json", json.dumps(result, indent=2))
  text = "\n".join([f"# {name}", "", f"`{result['command']}`", "", *table, "",
                    f"load average during the run: {result['machine']['load_average']}", ""])
  files.write_atomic(stem + ".md", text)
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
