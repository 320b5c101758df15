"""Extracting one replica: the whole bucket restored vs its parameters vs its row alone.

  python experiments/benchmarks/extract_one.py                        # small: 8 replicas
  python experiments/benchmarks/extract_one.py --replicas=27 --d_model=512 --num_heads=8 \
      --d_out=512 --num_layers=6 --d_ff=2048                          # the paper_20m towers

Writes a synthetic sweep workdir (config.json, replicas.json and one checkpoint of one bucket
of --replicas replicas of the coverage_sweep preset's model with the sizes given: parameters,
Adam moments and best parameters, as `bindjax sweep` saves them, filled with random values so
that compression does not shrink what is read) and reads replica --replica of it three ways,
each in a fresh process (so each has its own peak RSS), --repeats times:

  whole   the bucket state restored whole (every replica, optimiser state included) onto one
          device and sliced: how `bindjax extract` read a replica before it read one row
  params  `extract.load_bucket`: the parameters and steps of every replica, no optimiser state
          (what `bindjax binding` reads, and extraction's path for checkpoints without row
          checksums)
  row     `extract.load_workdir`: the replica's row of its parameters and steps alone

Each records the seconds of the read (config to parameters on the host, imports excluded), the
bytes tensorstore read from files (the arrays; orbax reads its small JSON files itself) and the
peak RSS it added over the process's peak before the read. The checkpoint was just written, so
reads come from the page cache: the seconds are a lower bound for a cold disk or a bucket store.

Writes experiments/benchmarks/results/extract_one.{json,md} (--out to change the stem).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "experiments", "benchmarks", "results")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repeats  # noqa: E402  pylint: disable=g-import-not-at-top

METHODS = ("whole", "params", "row")

WORKER = r"""
import hashlib, json, resource, sys, time
import jax, numpy as np, tensorstore as ts
from bindjax.frozen import extract
from bindjax.runtime import parallel
from bindjax.training import bucket_programs
from bindjax.workdir import checkpoint, layout
workdir, method, replica = sys.argv[1], sys.argv[2], int(sys.argv[3])
METRIC = "/tensorstore/kvstore/file/bytes_read"

def bytes_read():
  return sum(v["value"] for m in ts.experimental_collect_matching_metrics(METRIC)
             for v in m["values"])

def whole():
  _, _, (bucket,) = extract.read_buckets(workdir)
  with checkpoint.Checkpoints(layout.Workdir(workdir).bucket_dir(0)) as ckpt:
    inputs, _ = parallel.pad_to_multiple(bucket.stacked_inputs(),
                                         ckpt.metadata()["padded_replicas"])
    abstract = jax.eval_shape(
        lambda h: bucket_programs.init_bucket_state(h, bucket.spec, True), inputs)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    _, state, _ = bucket_programs.restore_state(ckpt.restore, abstract, device)
  best = np.asarray(state["best"]["step"])[replica] >= 0
  params = state["best"]["params"] if best else state["train"].params
  return jax.tree.map(lambda x: np.asarray(x)[replica], params)

read = {"whole": whole,
        "params": lambda: extract.load_bucket(workdir, 0, "best").trained(replica).params,
        "row": lambda: extract.load_workdir(workdir, "best", replica=replica).params}[method]
rss, before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, bytes_read()
start = time.perf_counter()
params = jax.block_until_ready(read())
seconds = time.perf_counter() - start
added = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss
digest = hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in jax.tree.leaves(params)))
print(json.dumps({"seconds": seconds, "bytes_read": bytes_read() - before,
                  "peak_rss_added_bytes": added * 1024, "digest": digest.hexdigest()}))
"""

SAVER = r"""
import json, sys
import jax, jax.numpy as jnp
from bindjax.base import files
from bindjax.commands import flags
from bindjax.runtime import parallel
from bindjax.training import bucket_programs, grid
from bindjax.workdir import checkpoint, layout, results
workdir, sizes = sys.argv[1], json.loads(sys.argv[2])
config = flags.load_config("experiments/coverage_sweep.py:smoke")
config.grid.spaces, config.grid.coverages = ((2, 10),), (0.5,)
config.grid.seeds = tuple(range(sizes.pop("replicas")))
config.model.update(**sizes)
replicas, buckets = grid.expand_grid(config)
assert len(buckets) == 1, f"{len(buckets)} buckets"
(bucket,) = buckets
files.write_json(layout.Workdir(workdir).config_file, results.config_json(config),
                 sort_keys=True)
files.write_json(layout.Workdir(workdir).replicas_file,
                 [r.coordinates() for r in replicas])
inputs = bucket.stacked_inputs()
device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
state = jax.jit(lambda h: bucket_programs.init_bucket_state(h, bucket.spec, True))(inputs)
# Trained values, not the initial zeros of the moments (which compress to nothing); every
# replica with best parameters, so "best" reads them.
leaves, treedef = jax.tree.flatten(state)
keys = jax.random.split(jax.random.key(0), len(leaves))
state = treedef.unflatten([jax.random.normal(k, x.shape, x.dtype)
                           if jnp.issubdtype(x.dtype, jnp.floating) else x
                           for k, x in zip(keys, leaves)])
state["best"]["step"] = jnp.arange(len(bucket.replicas), dtype=jnp.int32)
state = bucket_programs.checkpoint_state(state, device)
with checkpoint.Checkpoints(layout.Workdir(workdir).bucket_dir(0)) as ckpt:
  ckpt.save(1, state, {"bucket": 0, "padded_replicas": len(bucket.replicas), "step": 1,
                       "complete": False})
leaves = jax.tree.leaves(state)
params = jax.tree.leaves(state["train"].params)
print(json.dumps({"state_bytes": sum(x.nbytes for x in leaves),
                  "params_bytes_per_replica": sum(x.nbytes for x in params) // len(bucket.replicas),
                  "arrays": len(leaves)}))
"""


def _run(code, *args):
  out = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=REPO, check=True,
                       capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=REPO)).stdout
  return json.loads(out.strip().splitlines()[-1])


def _mib(n):
  return f"{n / 2**20:.1f}"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--replicas", type=int, default=8)
  parser.add_argument("--replica", type=int, default=3, help="the replica extracted")
  parser.add_argument("--d_model", type=int, default=64)
  parser.add_argument("--num_heads", type=int, default=4)
  parser.add_argument("--num_layers", type=int, default=2)
  parser.add_argument("--d_ff", type=int, default=256)
  parser.add_argument("--d_out", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--workdir", help="where the synthetic workdir goes (default: a temporary "
                      "folder, removed afterwards)")
  parser.add_argument("--out", default=os.path.join(RESULTS, "extract_one"))
  args = parser.parse_args(argv)
  if not 0 <= args.replica < args.replicas:
    parser.error(f"--replica={args.replica}: expected 0..{args.replicas - 1}")
  sizes = {k: getattr(args, k) for k in ("replicas", "d_model", "num_heads", "num_layers",
                                         "d_ff", "d_out")}
  load = os.getloadavg()
  with tempfile.TemporaryDirectory() as scratch:
    workdir = args.workdir or os.path.join(scratch, "run")
    saved = _run(SAVER, workdir, json.dumps(sizes))
    runs = {m: [_run(WORKER, workdir, m, args.replica) for _ in range(args.repeats)]
            for m in METHODS}
  digests = {r["digest"] for rs in runs.values() for r in rs}
  if len(digests) != 1:
    raise RuntimeError(f"the three reads returned different parameters: {runs}")
  summary = {m: {key: repeats.stats([r[key] for r in rs])
                 for key in ("seconds", "bytes_read", "peak_rss_added_bytes")}
             for m, rs in runs.items()}
  command = " ".join([os.path.relpath(os.path.abspath(sys.argv[0]), REPO)]
                     + (argv if argv is not None else sys.argv[1:]))
  result = {"command": command, "sizes": sizes, "replica": args.replica, "checkpoint": saved,
            "methods": summary, "runs": runs,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "load_before": [round(x, 2) for x in load],
                        "load_after": [round(x, 2) for x in os.getloadavg()]}}
  lines = [f"# Extracting replica {args.replica} of a bucket of {args.replicas}", "",
           f"`{command}`", "",
           f"Checkpoint: {_mib(saved['state_bytes'])} MiB of state in {saved['arrays']} arrays; "
           f"{_mib(saved['params_bytes_per_replica'])} MiB of parameters per replica. "
           f"Medians (min–max) over {args.repeats} fresh processes; load average "
           f"{result['machine']['load_before']} before, {result['machine']['load_after']} after.",
           "", "| read | seconds | MiB read by tensorstore | peak RSS added, MiB |",
           "|---|---:|---:|---:|"]
  for m in METHODS:
    s = summary[m]
    lines.append(f"| {m} | {repeats.fmt(s['seconds'], 2)} | "
                 f"{_mib(s['bytes_read']['median'])} | "
                 f"{_mib(s['peak_rss_added_bytes']['median'])} |")
  repeats.write_table(args.out, result, "\n".join(lines) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
