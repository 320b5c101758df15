"""Compile time against depth: of one training step (scanned vs per-layer tower blocks), and of
a whole `bindjax sweep` (--path=sweep), cold and warm, beside a baseline revision.

  python experiments/benchmarks/compile_time.py                    # 2, 6, 12 layers, both layouts
  python experiments/benchmarks/compile_time.py --layers=2,12 --layouts=scanned
  python experiments/benchmarks/compile_time.py --path=sweep --baseline=main --tag=sweep

--path=sweep: `bindjax sweep` in a subprocess on one replica of the smoke grid at the published
width (d_model 256, 4 heads, d_ff 1024, fast_compile False, 2 steps), its compile read from the
sweep's own "compiled in N s" lines (everything before the first training step), for each
--layers in a fresh cache folder, then the deepest again in a fresh workdir with the same cache
(a warm start). The code under test is this checkout's and --baseline's (a git revision,
extracted with `git archive` into a temporary folder), run alternately at each stage.

For each layout (`ModelConfig.scan_layers`) and depth: the seconds to trace and lower
bindjax.training.train.train_step (jit of the step as `train_step.py` builds it, lowered on abstract
arguments, so nothing runs) and to compile it with bindjax's compiler options. The towers are
d_model 256, 4 heads, d_ff 1024, in the published run's space and batch (C = 2, V = 20, K = 2,
512 scenes). Configs run interleaved (the layouts alternate at each depth), after one warm-up
compile of a one-layer model, so one-off start-up costs fall on neither layout. No persistent
compilation cache is in use (the benchmark never turns bindjax's on).

Writes experiments/benchmarks/results/compile_time[_TAG].{json,md}. Shared machines are noisy:
the JSON records the load average at the start and end of the run.
"""
import argparse
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import jax

from bindjax.base import files
from bindjax.core import models
from bindjax.runtime import xla_options
from bindjax.training import run_spec
from bindjax.training import train

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRESETS = os.path.join(REPO, "experiments", "coverage_sweep.py")
COMPILED_S = re.compile(r"compiled in ([0-9.]+) s")


def get_config(arg):
  """The --path=sweep runs' config (this file is their --config): one replica of the smoke grid
  at the published width with `arg` layers, 2 steps."""
  from bindjax.commands import flags  # pylint: disable=g-import-not-at-top
  c = flags.load_config(f"{PRESETS}:smoke")
  c.grid.spaces = ((2, 4),)
  c.grid.coverages = (0.6,)
  c.grid.seeds = (0,)
  c.sweep.fast_compile = False
  c.model.update(d_model=256, num_heads=4, num_layers=int(arg), d_ff=1024)
  c.num_steps = 2
  return c
LAYOUTS = {"per_layer": False, "scanned": True}


def _spec(num_layers, scan_layers):
  c = run_spec.default_config()   # the published run's space, batch and optimizer
  c.model.update(d_model=256, num_heads=4, num_layers=num_layers, d_ff=1024)
  spec = run_spec.RunSpec.from_config(c)
  model = dataclasses.replace(spec.model, scan_layers=scan_layers)
  return c, dataclasses.replace(spec, model=model)


def measure(num_layers, layout):
  """Seconds to lower and to compile one train step of a `num_layers` tower in `layout`."""
  config, spec = _spec(num_layers, LAYOUTS[layout])
  inputs, _ = run_spec.inputs_from_config(config, spec)
  state = jax.eval_shape(lambda h: train.init(h.key, spec, h), inputs)
  step_fn = jax.jit(lambda s, h: train.train_step(s, h, spec), donate_argnums=0)
  t0 = time.perf_counter()
  lowered = step_fn.lower(state, inputs)
  t1 = time.perf_counter()
  lowered.compile(xla_options.compiler_options(jax.devices()[0].platform))
  t2 = time.perf_counter()
  return {"layout": layout, "num_layers": num_layers, "d_model": spec.model.d_model,
          "d_ff": spec.model.d_ff, "batch_size": spec.sampler.batch_size,
          "parameters": models.count_parameters(state.params),
          "lower_s": t1 - t0, "compile_s": t2 - t1, "total_s": t2 - t0}


def _row(rows, layout, num_layers):
  return next((r for r in rows if r["layout"] == layout and r["num_layers"] == num_layers), None)


def checks(rows):
  """The targets: scanned depth-independent (12 layers within 1.2x of 2) and scanned 6 layers
  at least 2x faster to compile than per-layer 6 layers (total seconds); those measured."""
  out = []
  s2, s12 = _row(rows, "scanned", 2), _row(rows, "scanned", 12)
  if s2 and s12:
    ratio = s12["total_s"] / s2["total_s"]
    out.append({"check": "scanned 12 layers / scanned 2 layers <= 1.2", "value": ratio,
                "passed": ratio <= 1.2})
  s6, p6 = _row(rows, "scanned", 6), _row(rows, "per_layer", 6)
  if s6 and p6:
    ratio = p6["total_s"] / s6["total_s"]
    out.append({"check": "per-layer 6 layers / scanned 6 layers >= 2", "value": ratio,
                "passed": ratio >= 2})
  return out


def _load_line(result):
  return (f"Load average start/end: {result['load_average_start'][0]:.1f} / "
          f"{result['load_average_end'][0]:.1f} (shared machine: numbers are noisy).")


def _with_checks(lines, checks):
  """The Markdown of table `lines` followed by the table of `checks`."""
  lines = lines + ["", "| target | measured | met |", "|---|---|---|"]
  for c in checks:
    lines.append(f"| {c['check']} | {c['value']:.2f} | {'yes' if c['passed'] else 'no'} |")
  return "\n".join(lines) + "\n"


def _write(result, text, tag):
  suffix = f"_{tag}" if tag else ""
  os.makedirs(RESULTS, exist_ok=True)
  files.write_json(os.path.join(RESULTS, f"compile_time{suffix}.json"), result)
  files.write_atomic(os.path.join(RESULTS, f"compile_time{suffix}.md"), text)
  print(text)


def markdown(result):
  lines = [f"# Train-step compile time against depth ({result['device']}, "
           f"{result['num_cpus']} CPUs, jax {result['jax']})", "",
           _load_line(result) + " d_model 256, d_ff 1024, batch 512; lower = trace and lower, "
           "compile = XLA.", "",
           "| layers | layout | params | lower s | compile s | total s |",
           "|---|---|---|---|---|---|"]
  for r in result["results"]:
    lines.append(f"| {r['num_layers']} | {r['layout']} | {r['parameters']:,} | "
                 f"{r['lower_s']:.1f} | {r['compile_s']:.1f} | {r['total_s']:.1f} |")
  return _with_checks(lines, result["checks"])


def sweep_compile(source, num_layers, cache, workdir):
  """(compile seconds, process seconds) of one `bindjax sweep` of `get_config(num_layers)` run
  with the bindjax of `source`."""
  env = dict(os.environ, XDG_CACHE_HOME=cache, BINDJAX_COMPILATION_CACHE="1")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  t0 = time.perf_counter()
  run = subprocess.run([sys.executable, "-m", "bindjax.commands.main", "sweep",
                        f"--config={os.path.abspath(__file__)}:{num_layers}",
                        f"--workdir={workdir}", "--noprogress", "--noreport"],
                       cwd=source, env=env, check=True, capture_output=True, text=True)
  seconds = time.perf_counter() - t0
  return sum(float(x) for x in COMPILED_S.findall(run.stdout + run.stderr)), seconds


def measure_sweep(layers, baseline):
  """Rows of --path=sweep: each depth cold, then the deepest warm, baseline and this checkout
  alternating at each stage."""
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    sources = {"this checkout": REPO, f"baseline {baseline}": os.path.join(tmp, "baseline")}
    os.makedirs(sources[f"baseline {baseline}"])
    archive = subprocess.run(["git", "-C", REPO, "archive", baseline], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", sources[f"baseline {baseline}"]], input=archive,
                   check=True)
    stages = [(n, "cold") for n in layers] + [(layers[-1], "warm")]
    for i, (num_layers, start) in enumerate(stages):
      names = list(sources) if i % 2 == 0 else list(sources)[::-1]
      for code in names:
        cache = os.path.join(tmp, "cache", code, str(num_layers))
        workdir = os.path.join(tmp, "work", code, f"{num_layers}_{start}")
        compile_s, process_s = sweep_compile(sources[code], num_layers, cache, workdir)
        rows.append({"code": code, "num_layers": num_layers, "start": start,
                     "compile_s": compile_s, "process_s": process_s})
        print(json.dumps(rows[-1]), flush=True)
  return rows


def sweep_checks(rows):
  """Per code: deepest / shallowest cold compile (target <= 1.2) and warm / cold at the deepest
  (target <= 0.1)."""
  out = []
  for code in dict.fromkeys(r["code"] for r in rows):
    mine = [r for r in rows if r["code"] == code]
    cold = [r for r in mine if r["start"] == "cold"]
    warm = next(r for r in mine if r["start"] == "warm")
    ratio = cold[-1]["compile_s"] / cold[0]["compile_s"]
    out.append({"check": f"{code}: {cold[-1]['num_layers']} layers / {cold[0]['num_layers']} "
                         "layers <= 1.2", "value": ratio, "passed": ratio <= 1.2})
    ratio = warm["compile_s"] / cold[-1]["compile_s"]
    out.append({"check": f"{code}: warm / cold at {warm['num_layers']} layers <= 0.1",
                "value": ratio, "passed": ratio <= 0.1})
  return out


def sweep_markdown(result):
  lines = [f"# Whole-sweep compile against depth, cold and warm ({result['num_cpus']} CPUs, "
           f"jax {result['jax']})", "",
           _load_line(result) + " `bindjax sweep`, one replica, d_model 256, d_ff 1024, 2 "
           "steps; compile = the sweep's \"compiled in\" seconds; process = the whole command.",
           "", "| code | layers | start | compile s | process s |", "|---|---|---|---:|---:|"]
  for r in result["results"]:
    lines.append(f"| {r['code']} | {r['num_layers']} | {r['start']} | {r['compile_s']:.1f} | "
                 f"{r['process_s']:.1f} |")
  return _with_checks(lines, result["checks"])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--path", default="step", choices=("step", "sweep"))
  parser.add_argument("--baseline", default="main", help="--path=sweep: git revision")
  parser.add_argument("--layers", default=None, help="default 2,6,12 (step), 2,12 (sweep)")
  parser.add_argument("--layouts", default="per_layer,scanned")
  parser.add_argument("--tag", default="")
  args = parser.parse_args(argv)
  if args.path == "sweep":
    return main_sweep(args)
  args.layers = args.layers or "2,6,12"
  layouts = args.layouts.split(",")
  for layout in layouts:
    if layout not in LAYOUTS:
      parser.error(f"--layouts: unknown layout {layout!r}; expected {', '.join(LAYOUTS)}")
  load_start = os.getloadavg()
  measure(1, layouts[0])   # warm-up
  rows = []
  for num_layers in (int(n) for n in args.layers.split(",")):
    for layout in layouts:
      rows.append(measure(num_layers, layout))
      print(json.dumps(rows[-1]), flush=True)
  result = {
      "device": str(jax.devices()[0]), "num_cpus": os.cpu_count(), "jax": jax.__version__,
      "platform": platform.platform(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "compiler_options": xla_options.compiler_options(jax.devices()[0].platform),
      "load_average_start": load_start, "load_average_end": os.getloadavg(),
      "results": rows, "checks": checks(rows),
      "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
  }
  _write(result, markdown(result), args.tag)
  return 0


def main_sweep(args):
  load_start = os.getloadavg()
  rows = measure_sweep([int(n) for n in (args.layers or "2,12").split(",")], args.baseline)
  result = {"num_cpus": os.cpu_count(), "jax": jax.__version__, "platform": platform.platform(),
            "load_average_start": load_start, "load_average_end": os.getloadavg(),
            "results": rows, "checks": sweep_checks(rows),
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv)}
  _write(result, sweep_markdown(result), args.tag)
  return 0


if __name__ == "__main__":
  sys.exit(main())
