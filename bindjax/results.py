"""What a training workdir holds: file names, result rows, and which evaluation counts.

`bindjax sweep` and `bindjax train` (a sweep of one replica) write the same layout
(docs/training.md, "Workdir"):

  config.json          the config (a single run's config gains the one-point grid it ran as)
  replicas.json        one dict of grid coordinates per replica
  results.jsonl        one row per replica and logged step
  summary.csv          one line per replica with evaluations: final and best evaluation
  sweep_done.json      written last; a rerun into a finished workdir reports and returns
  checkpoints/bucket_NNN/latest/<step>/   stacked replica states of one bucket
  report/              `bindjax report`'s figure and tables

A row holds the replica's coordinates (`sweep.Replica.coordinates`), "step", "kind" ("train" at
logged steps, "eval" at evaluation steps, "diverged" once when the replica's loss or parameters
became non-finite, with "diverged_step"), the training metrics TRAIN_METRICS of that step and,
at evaluation steps, every metric of `train.eval_step`. Non-finite values are written as null.
"""
import collections
import csv
import io
import json
import math
import os

from bindjax import files

CONFIG_FILE = "config.json"
REPLICAS_FILE = "replicas.json"
RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.csv"
DONE_FILE = "sweep_done.json"
CHECKPOINT_DIR = "checkpoints"
REPORT_DIR = "report"
OUTPUTS = (CONFIG_FILE, REPLICAS_FILE, RESULTS_FILE, SUMMARY_FILE, DONE_FILE, CHECKPOINT_DIR,
           REPORT_DIR)

# Training metrics copied into every row (besides the evaluation metrics at eval steps).
TRAIN_METRICS = ("loss", "concept_loss", "object_loss", "batch_concept_accuracy",
                 "batch_object_accuracy", "learning_rate", "grad_norm", "tau")
# Row names of training metrics whose own name is a grid coordinate.
RENAMED = {"learning_rate": "scheduled_learning_rate"}
# The evaluation that "best" means, for rows and for the best-parameters checkpoint.
SELECTION_METRIC = "heldout/object_accuracy"
STEPS = ("best", "final")
SUMMARY_METRICS = ("heldout/object_accuracy", "heldout/object_accuracy_1obj",
                   "heldout/concept_accuracy", "train/object_accuracy",
                   "train/concept_accuracy", "loss", "tau")


def bucket_checkpoint_dir(workdir, bucket):
  """Checkpoint directory of bucket number `bucket`."""
  return os.path.join(workdir, CHECKPOINT_DIR, f"bucket_{bucket:03d}")


def _finite_or_none(value):
  value = float(value)
  return value if math.isfinite(value) else None


def make_row(coordinates, step, train_metrics, eval_metrics=None, diverged_step=-1):
  """One result row from a replica's coordinates and its scalar metrics at `step`."""
  row = {"kind": "eval" if eval_metrics is not None else "train", **coordinates,
         "step": int(step)}
  for name in TRAIN_METRICS:
    row[RENAMED.get(name, name)] = _finite_or_none(train_metrics[name])
  for name in sorted(eval_metrics or {}):
    row[name] = _finite_or_none(eval_metrics[name])
  if diverged_step >= 0:
    row.update(kind="diverged", diverged=True, diverged_step=int(diverged_step))
  return row


def read_rows(workdir):
  """The rows of workdir/results.jsonl ([] when there is none)."""
  return files.read_jsonl(os.path.join(workdir, RESULTS_FILE))


def read_replicas(workdir):
  """The coordinates of every replica (workdir/replicas.json); ValueError when missing."""
  path = os.path.join(workdir, REPLICAS_FILE)
  if not os.path.exists(path):
    raise ValueError(f"{path} does not exist; expected a `bindjax sweep` or `bindjax train` "
                     "workdir")
  with open(path) as f:
    return json.load(f)


def _nan_low(x):
  return -math.inf if x is None or (isinstance(x, float) and math.isnan(x)) else x


def select_evaluations(rows, step="best"):
  """One evaluation row per replica, in replica order: its last, or its best by SELECTION_METRIC.

  A replica flagged as diverged keeps its rows up to divergence; the chosen row's "diverged" says
  whether it diverged. Ties in "best" go to the earlier step.
  """
  if step not in STEPS:
    raise ValueError(f"step={step!r}: expected one of {STEPS}")
  by_replica = collections.defaultdict(list)
  diverged = set()
  for row in rows:
    if row.get("diverged"):
      diverged.add(row["replica"])
    if row.get("kind") == "eval":
      by_replica[row["replica"]].append(row)
  chosen = []
  for replica, evals in sorted(by_replica.items()):
    evals = sorted(evals, key=lambda r: r["step"])
    if step == "final":
      row = evals[-1]
    else:
      row = max(evals, key=lambda r: (_nan_low(r.get(SELECTION_METRIC)), -r["step"]))
    chosen.append(dict(row, diverged=replica in diverged))
  return chosen


def summary_rows(rows, replicas):
  """One dict per replica with evaluations: its coordinates, final and best evaluation.

  replicas: coordinate dicts (replicas.json).
  """
  final = {r["replica"]: r for r in select_evaluations(rows, "final")}
  best = {r["replica"]: r for r in select_evaluations(rows, "best")}
  diverged_at = {r["replica"]: r["diverged_step"] for r in rows if r.get("kind") == "diverged"}
  out = []
  for coordinates in replicas:
    index = coordinates["replica"]
    if index not in final:
      continue
    k = coordinates["K"]
    summary = dict(coordinates)
    if isinstance(summary["V"], list):
      summary["V"] = json.dumps(summary["V"])
    summary["final_step"] = final[index]["step"]
    for name in SUMMARY_METRICS + (f"heldout/object_accuracy_{k}obj",):
      summary[f"final {name}"] = final[index].get(name)
    summary["best_step"] = best[index]["step"]
    summary["best heldout/object_accuracy"] = best[index].get(SELECTION_METRIC)
    summary["best heldout/object_accuracy_maxobj"] = best[index].get(
        f"heldout/object_accuracy_{k}obj")
    summary["diverged_step"] = diverged_at.get(index, "")
    out.append(summary)
  return out


def write_summary(workdir, rows, replicas):
  """workdir/summary.csv with one line per replica with evaluations (atomic rewrite)."""
  table = summary_rows(rows, replicas)
  if not table:
    return
  fields = []
  for row in table:
    fields.extend(k for k in row if k not in fields)
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=fields)
  writer.writeheader()
  for row in table:
    writer.writerow({k: "" if v is None else v for k, v in row.items()})
  files.write_atomic(os.path.join(workdir, SUMMARY_FILE), buffer.getvalue())


def config_json(config):
  """A ConfigDict as the JSON-compatible dict stored in config.json."""
  return json.loads(config.to_json_best_effort(sort_keys=True))


def _flat(tree, prefix=""):
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def check_saved_config(workdir, config):
  """ValueError when workdir/config.json exists and differs from `config` (a config_json dict).

  The message lists the differing fields (saved -> given), so a resumed run is never silently
  continued with other settings.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return
  with open(path) as f:
    saved = json.load(f)
  if saved == config:
    return
  a, b = _flat(saved), _flat(config)
  diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
  details = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:8])
  more = f" and {len(diff) - 8} more" if len(diff) > 8 else ""
  raise ValueError(f"workdir={workdir!r} holds a run with a different config ({details}{more}); "
                   "use a new --workdir or pass --overwrite")
