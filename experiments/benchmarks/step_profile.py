"""Where a sweep's training step spends its time on XLA:CPU: a per-op profile of the compiled step.

  python experiments/benchmarks/step_profile.py                        # cpu preset's plain towers
  python experiments/benchmarks/step_profile.py --models=cpu_plain,cpu_plain_ff2048 --replicas=4
  python experiments/benchmarks/step_profile.py --models=cpu_plain,cpu_plain_ff2048 --baseline=main

For each model (sweep_throughput.py's CPU models: the cpu preset's towers at |O| = 100, with or
without the product read-out, plain at d_ff 1,024 or 2,048): R replicas of one bucket, vmapped and
scanned over --steps train steps in one program on one CPU device whose ops run single-threaded,
as one device of `bindjax sweep` runs them (the executor may still run independent ops side by
side, which the CPU/wall ratio shows). Times --repeats calls, then traces one under
jax.profiler and sums each compiled op's time, classed by what it computes (from the op's HLO
metadata: feed-forward, attention, layer norm, the rest of the towers, the loss, optimiser and
sampler) and by kind (matmul, elementwise fusion, windowed reduction: XLA:CPU's rewrite of long
sums such as bias and layer-norm gradients, classed by the gradient they sum).

--baseline=REV profiles that git revision's bindjax beside this checkout's, each model in
--rounds rounds that alternate which goes first (each run a fresh process), and measures the
machine's float32 matmul rate (2048³, JAX's default CPU set-up, all cores) in the same run.
Writes experiments/benchmarks/results/step_profile[_TAG].{md,json}: replica-steps/s, model
FLOP/s and their share of the matmul rate, the op-time table and the top ops.
"""
import argparse
import collections
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

# As one device of `bindjax sweep` on CPU (bindjax.runtime.parallel.use_cpu_cores_as_devices);
# the trace annotation makes the profiler record every compiled op.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                           " --xla_cpu_enable_xprof_traceme=true").strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 1)

from bindjax.runtime import xla_options  # noqa: E402
from bindjax.training import train  # noqa: E402
import repeats  # noqa: E402  experiments/benchmarks/repeats.py, beside this script
import sweep_throughput  # noqa: E402

RESULTS = sweep_throughput.RESULTS
# (class, pattern on the op's metadata name), first match wins.
COMPONENTS = (("layer norm", r"_norm/"), ("feed-forward", r"/mlp/"), ("attention", r"/attn/"),
              ("towers, other", r"_tower/"),
              ("loss, optimiser, sampler", r"."))


def scanned_steps(spec, steps):
  """jit of `steps` vmapped train steps in one scan (state donated)."""
  def run(state_R, inputs_R):
    def body(state_R, _):
      state_R, metrics = jax.vmap(lambda s, h: train.train_step(s, h, spec))(state_R, inputs_R)
      return state_R, metrics["loss"]
    return jax.lax.scan(body, state_R, None, length=steps)
  return jax.jit(run, donate_argnums=(0,))


def op_metadata(hlo_text):
  """{op name: (metadata op_name or "", HLO kind)} of a compiled module. An op without a name of
  its own takes that of the op it wraps (a fusion around one op), else that of its first
  operand (a gradient's sum takes the gradient's)."""
  ops, roots, calls, operands = {}, {}, {}, {}
  computation = None
  for line in hlo_text.splitlines():
    header = re.match(r"^(?:ENTRY )?%(\S+) ", line)
    if header and line.rstrip().endswith("{"):
      computation = header.group(1)
      continue
    s = line.strip()
    root = s.startswith("ROOT ")
    s = s[5:] if root else s
    m = re.match(r"%(\S+) = \S+ (\S+?)\(", s)
    if not m:
      continue
    meta = re.search(r'op_name="([^"]*)"', s)
    ops[m.group(1)] = (meta.group(1) if meta else "", m.group(2))
    first = re.search(r"\(%([\w.\-]+)", s)
    if first:
      operands[m.group(1)] = first.group(1)
    called = re.search(r"calls=%([\w.\-]+)", s)
    if called:
      calls[m.group(1)] = called.group(1)
    if root and computation:
      roots[computation] = ops[m.group(1)]
  for name, computation in calls.items():
    if not ops[name][0] and computation in roots:
      ops[name] = (roots[computation][0], roots[computation][1])
  for name, (metadata, kind) in ops.items():
    if not metadata and operands.get(name) in ops:
      ops[name] = (ops[operands[name]][0], kind)
  return ops


def classify(name, metadata, kind):
  """(component, kind) of one compiled op."""
  op_kind = ("matmul" if kind == "dot" or name.startswith("dot") else
             "windowed reduction" if "reduce-window" in name or kind == "reduce-window" else
             "elementwise and other")
  component = next(c for c, pattern in COMPONENTS if re.search(pattern, metadata or "?"))
  return component, op_kind


def op_times(trace_dir, ops):
  """{op name: summed microseconds} from the profiler's trace of compiled ops."""
  (path,) = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  with gzip.open(path) as f:
    events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  times = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("name") in ops:
      times[e["name"]] += e.get("dur", 0)
  return times


def profile(model, replicas, steps, num_repeats):
  """Rate, FLOP/s and op-time table of `replicas` replicas of `model`."""
  bucket = sweep_throughput.single_bucket(sweep_throughput.config_for(model, replicas))
  spec, inputs = bucket.spec, jax.device_put(bucket.stacked_inputs())
  state = jax.jit(jax.vmap(lambda h: train.init(h.key, spec, h)))(inputs)
  t0 = time.perf_counter()
  compiled = scanned_steps(spec, steps).lower(state, inputs).compile(
      xla_options.compiler_options("cpu"))
  compile_s = time.perf_counter() - t0
  state, loss = compiled(state, inputs)
  loss.block_until_ready()
  wall, cpu = [], []
  for _ in range(num_repeats):
    t, c = time.perf_counter(), time.process_time()
    state, loss = compiled(state, inputs)
    loss.block_until_ready()
    wall.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
      state, loss = compiled(state, inputs)
      loss.block_until_ready()
    ops = op_metadata(compiled.as_text())
    times = op_times(trace_dir, ops)
  total = sum(times.values())
  table = collections.Counter()
  for name, us in times.items():
    table[classify(name, *ops[name])] += us
  flops = train.train_step_flops(spec)
  rates = [replicas * steps / w for w in wall]
  return {
      "model": model, "replicas": len(bucket.replicas), "steps_per_call": steps,
      "compile_s": compile_s, "replica_steps_per_s": repeats.stats(rates),
      "model_gflop_per_s": repeats.stats([r * flops / 1e9 for r in rates]),
      "cpu_per_wall": repeats.stats([c / w for c, w in zip(cpu, wall)]),
      "op_ms_per_replica_step": total / 1e3 / (replicas * steps),
      "share": sorted(([c, k, us / total] for (c, k), us in table.items()),
                      key=lambda row: -row[2]),
      "top_ops": [[name, *classify(name, *ops[name]), ops[name][0][-90:], us / total]
                  for name, us in times.most_common(15)],
  }


MATMUL = ("import json, jax, jax.numpy as jnp, time; a = jnp.ones((2048, 2048)); "
          "f = jax.jit(lambda a: a @ a); f(a).block_until_ready(); ts = []\n"
          "for _ in range(5):\n  t = time.perf_counter(); f(a).block_until_ready(); "
          "ts.append(time.perf_counter() - t)\nprint(json.dumps(2 * 2048 ** 3 / min(ts)))")


def matmul_rate():
  """The machine's float32 matmul FLOP/s (2048³, JAX's default CPU set-up) in a fresh process."""
  env = dict(os.environ, XLA_FLAGS="")
  out = subprocess.run([sys.executable, "-c", MATMUL], env=env, check=True, capture_output=True,
                       text=True).stdout
  return float(out.strip().splitlines()[-1])


def in_process(source, model, args):
  """profile() of `model` with the bindjax of `source` (a directory), in a fresh process."""
  env = dict(os.environ, PYTHONPATH=source)
  command = [sys.executable, os.path.abspath(__file__), f"--models={model}", "--worker",
             f"--replicas={args.replicas}", f"--steps={args.steps}", f"--repeats={args.repeats}"]
  out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
  return json.loads(out.strip().splitlines()[-1])


def against_baseline(args):
  """{code: {model: [profile per round]}} for this checkout and --baseline, alternating."""
  repo = sweep_throughput.REPO
  runs = {}
  with tempfile.TemporaryDirectory() as tmp:
    base = os.path.join(tmp, "baseline")
    os.makedirs(base)
    archive = subprocess.run(["git", "-C", repo, "archive", args.baseline], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", base], input=archive, check=True)
    sources = {"this checkout": repo, f"baseline {args.baseline}": base}
    for model in args.models.split(","):
      for i in range(args.rounds):
        for code in (list(sources) if i % 2 == 0 else list(sources)[::-1]):
          runs.setdefault(code, {}).setdefault(model, []).append(
              in_process(sources[code], model, args))
          print(code, model, runs[code][model][-1]["replica_steps_per_s"]["median"], flush=True)
  return runs


def comparison_markdown(runs, matmul_flops):
  lines = [f"Machine's float32 matmul rate (2048³, all cores, best of before and after): "
           f"{matmul_flops / 1e9:.0f} GFLOP/s.", "",
           "| model | code | replica-steps/s (median of rounds, min–max) | model GFLOP/s | "
           "of matmul rate | CPU/wall |", "|---|---|---:|---:|---:|---:|"]
  for code, models in runs.items():
    for model, rounds in models.items():
      rate = repeats.stats([r["replica_steps_per_s"]["median"] for r in rounds])
      gflops = float(np.median([r["model_gflop_per_s"]["median"] for r in rounds]))
      cpu = float(np.median([r["cpu_per_wall"]["median"] for r in rounds]))
      lines.append(f"| {model} | {code} | {repeats.fmt(rate)} | {gflops:.1f} | "
                   f"{gflops * 1e9 / matmul_flops:.0%} | {cpu:.2f} |")
  return "\n".join(lines) + "\n"


def markdown(results, command):
  lines = ["# step_profile", "", f"`{command}`", ""]
  for r in results:
    lines += [f"## {r['model']}: {r['replicas']} replicas × {r['steps_per_call']} steps per call",
              "", f"{repeats.fmt(r['replica_steps_per_s'])} replica-steps/s, "
              f"{repeats.fmt(r['model_gflop_per_s'])} model GFLOP/s, CPU/wall "
              f"{repeats.fmt(r['cpu_per_wall'], 2)}; op time {r['op_ms_per_replica_step']:.2f} ms "
              f"per replica-step; compile {r['compile_s']:.1f} s.", "",
              "| what | kind | share of op time |", "|---|---|---:|"]
    lines += [f"| {c} | {k} | {100 * s:.1f} % |" for c, k, s in r["share"]]
    lines += ["", "| op | what | kind | share |", "|---|---|---|---:|"]
    lines += [f"| {n} | {c} | {k} | {100 * s:.1f} % |" for n, c, k, _, s in r["top_ops"]]
    lines.append("")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="cpu_plain")
  parser.add_argument("--replicas", type=int, default=4)
  parser.add_argument("--steps", type=int, default=10, help="train steps per timed call")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--tag", default="")
  parser.add_argument("--baseline", default=None, help="git revision to profile beside this")
  parser.add_argument("--rounds", type=int, default=3, help="--baseline: rounds per model")
  parser.add_argument("--worker", action="store_true", help="internal: print one profile")
  args = parser.parse_args(argv)
  if args.worker:
    print(json.dumps(profile(args.models, args.replicas, args.steps, args.repeats)))
    return
  load_start = os.getloadavg()
  command = " ".join(["python"] + sys.argv)
  result = {"command": command, "jax": jax.__version__, "load_average_start": load_start}
  if args.baseline:
    matmul_flops = matmul_rate()
    runs = against_baseline(args)
    matmul_flops = max(matmul_flops, matmul_rate())
    result.update(matmul_flops_per_s=matmul_flops, runs=runs)
    results = [rounds[-1] for rounds in runs["this checkout"].values()]
    head = comparison_markdown(runs, matmul_flops) + "\nProfiles of this checkout, last round:\n\n"
  else:
    results = [profile(m, args.replicas, args.steps, args.repeats)
               for m in args.models.split(",")]
    result["results"] = results
    head = ""
  out = os.path.join(RESULTS, "step_profile" + (f"_{args.tag}" if args.tag else ""))
  text = markdown(results, command).replace("\n\n## ", "\n\n" + head + "## ", 1) + (
      f"\nload average: start {load_start}, end {os.getloadavg()}\n")
  result["load_average_end"] = os.getloadavg()
  repeats.write_table(out, result, text)


if __name__ == "__main__":
  main()
