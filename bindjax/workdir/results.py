"""What a training workdir's rows and config mean: the rows of results.jsonl, which evaluation
counts, the summary, and the config a workdir ran as. Where they live is
`bindjax.workdir.layout`'s.

A row holds the replica's COORDINATES (`grid.Replica.coordinates`), STEP, KIND ("train" at
logged steps, "eval" at evaluation steps, "diverged" once when the replica's loss or parameters
became non-finite, with DIVERGED_STEP), the training metrics TRAIN_METRICS of that step and, at
evaluation steps, every metric of `train.eval_step`. Non-finite values are written as null.
This module is the one definition of those names: the coordinate fields below, and evaluation
metric names made by `metric`, `object_accuracy`, `concept_accuracy` and `binding`.

results.jsonl is a view: each bucket's checkpoints hold the bucket's rows up to their step
(`pack_rows`), so a resumed sweep rebuilds every row its checkpoints cover.
"""
import collections
import csv
import hashlib
import io
import json
import math

from bindjax.base import files

# A replica's coordinates (replicas.json, and the head of each of its rows), in row order.
REPLICA = "replica"
BUCKET = "bucket"
NUM_CONCEPTS = "C"
NUM_VALUES = "V"           # an int, or a list of per-concept sizes
MAX_OBJECTS = "K"
SPACE_SIZE = "space_size"
COVERAGE = "coverage"
SEED = "seed"
LEARNING_RATE = "learning_rate"
WEIGHT_DECAY = "weight_decay"
MODEL = "model"
NUM_TRAIN_OBJECTS = "num_train_objects"
COORDINATES = (REPLICA, BUCKET, NUM_CONCEPTS, NUM_VALUES, MAX_OBJECTS, SPACE_SIZE, COVERAGE,
               SEED, LEARNING_RATE, WEIGHT_DECAY, MODEL, NUM_TRAIN_OBJECTS)
# A row's other fields besides its metrics; DIVERGED and DIVERGED_STEP are in its "diverged" row,
# and `select_evaluations` sets DIVERGED on the row it picks.
KIND = "kind"
STEP = "step"
DIVERGED = "diverged"
DIVERGED_STEP = "diverged_step"
KINDS = ("train", "eval", "diverged")

# The two evaluations of `train.eval_step`: scenes of held-out objects, and of training objects.
HELDOUT = "heldout"
TRAIN = "train"
# The binding figure's name within a split (docs/objectives.md#binding).
BINDING = "binding"
# k of a metric name that stands for each row's own K (filled in by `metric_value`).
ROW_K = "{K}"
# k of the columns that hold each replica's metric on K-object scenes (summary.csv, binding rows).
MAX_K = "max"


def metric(split, name):
  """The row name of evaluation metric `name` of split HELDOUT or TRAIN: "heldout/binding"."""
  return f"{split}/{name}"


def accuracy_name(target, k=None):
  """The name of "object" or "concept" accuracy over all scenes (k None) or k-object scenes
  (k: a count, ROW_K or MAX_K): "object_accuracy", "object_accuracy_2obj"."""
  return f"{target}_accuracy" if k is None else f"{target}_accuracy_{k}obj"


def object_accuracy(split, k=None):
  """Object accuracy of `split` (over k-object scenes; `accuracy_name`)."""
  return metric(split, accuracy_name("object", k))


def concept_accuracy(split, k=None):
  """Concept accuracy of `split` (over k-object scenes; `accuracy_name`)."""
  return metric(split, accuracy_name("concept", k))


def binding(split):
  """The binding figure of `split`: "heldout/binding"."""
  return metric(split, BINDING)


def metric_value(row, name):
  """A row's value of metric `name` (None when absent); ROW_K in the name becomes the row's K."""
  return row.get(name.replace(ROW_K, str(row.get(MAX_OBJECTS))))


# The training loss; also, within a split, the evaluation loss ("heldout/loss").
LOSS = "loss"
# Training metrics copied into every row (besides the evaluation metrics at eval steps).
TRAIN_METRICS = (LOSS, "concept_loss", "object_loss", "batch_concept_accuracy",
                 "batch_object_accuracy", "learning_rate", "grad_norm", "tau")
# Row names of training metrics whose own name is a grid coordinate.
RENAMED = {"learning_rate": "scheduled_learning_rate"}
# The evaluation that "best" means, for rows and for the best-parameters checkpoint.
SELECTION_METRIC = object_accuracy(HELDOUT)
STEPS = ("best", "final")
# The step a reader takes unless told: the last evaluation, chosen without looking at held-out
# objects.
DEFAULT_STEP = "final"
SUMMARY_METRICS = (SELECTION_METRIC, object_accuracy(HELDOUT, 1), concept_accuracy(HELDOUT),
                   object_accuracy(TRAIN), concept_accuracy(TRAIN), LOSS, "tau")
# 1 when the held-out metrics of an evaluation came from training objects (coverage 1).
USES_TRAINING_OBJECTS = metric(HELDOUT, "uses_training_objects")


def sweep_order(rows):
  """`rows` in the order results.jsonl holds them: by bucket, step and replica, whichever
  parts of a bucket they were trained in (a bucket's rows come per step, in replica order)."""
  return sorted(rows, key=lambda r: (r[BUCKET], r[STEP], r[REPLICA]))


def _finite_or_none(value):
  value = float(value)
  return value if math.isfinite(value) else None


def make_row(coordinates, step, train_metrics, eval_metrics=None, diverged_step=-1):
  """One result row from a replica's coordinates and its scalar metrics at `step`."""
  row = {KIND: "eval" if eval_metrics is not None else "train", **coordinates, STEP: int(step)}
  for name in TRAIN_METRICS:
    row[RENAMED.get(name, name)] = _finite_or_none(train_metrics[name])
  for name in sorted(eval_metrics or {}):
    row[name] = _finite_or_none(eval_metrics[name])
  if diverged_step >= 0:
    row.update({KIND: "diverged", DIVERGED: True, DIVERGED_STEP: int(diverged_step)})
  return row


def is_row(row):
  """Whether `row` (a dict read from results.jsonl) is a result row: a kind in KINDS, an
  integer replica and step."""
  return (row.get(KIND) in KINDS and isinstance(row.get(REPLICA), int)
          and isinstance(row.get(STEP), int))


def rows_text(rows):
  """The text of results.jsonl holding `rows`."""
  return "".join(files.dumps(row) + "\n" for row in rows)


def rows_digest(rows):
  """SHA-256 of `rows_text(rows)` (recorded in sweep_done.json)."""
  return hashlib.sha256(rows_text(rows).encode()).hexdigest()


def pack_rows(rows, coordinates):
  """Rows without the coordinates they share with their replica, as key lists and values.

  coordinates: {replica index: its coordinate dict}. `unpack_rows` rebuilds the rows exactly
  (same keys in the same order, same values).
  """
  schemas, rows_out = [], []
  index = {}
  for row in rows:
    shared = coordinates[row[REPLICA]]
    keys = tuple(k for k in row if k not in shared or k == REPLICA)
    if keys not in index:
      index[keys] = len(schemas)
      schemas.append(list(keys))
    rows_out.append([index[keys]] + [row[k] for k in keys])
  return {"schemas": schemas, "rows": rows_out}


def unpack_rows(packed, coordinates):
  """The rows `pack_rows` packed (kind first, then the replica's coordinates, then the rest)."""
  out = []
  for values in packed["rows"]:
    keys = packed["schemas"][values[0]]
    stored = dict(zip(keys, values[1:]))
    row = {KIND: stored[KIND], **coordinates[stored[REPLICA]]}
    row.update((k, v) for k, v in stored.items() if k != KIND)
    out.append(row)
  return out


def _nan_low(x):
  return -math.inf if x is None or (isinstance(x, float) and math.isnan(x)) else x


def parse_step(text):
  """A step choice from its text: "best", "final", or an integer N >= 0 (each replica's last
  evaluation at or before step N, to read a sweep as it stood earlier); ValueError otherwise."""
  if text in STEPS:
    return text
  if (isinstance(text, int) and text >= 0) or (isinstance(text, str) and text.strip().isdigit()):
    return int(text)
  raise ValueError(f"step={text!r}: expected one of {STEPS} or a step number (an integer >= 0)")


def step_name(step):
  """"final step", "best step", or "step ≤ 11,250" for a step number (`parse_step`)."""
  return f"step ≤ {step:,}" if isinstance(step, int) else f"{step} step"


def select_evaluations(rows, step="best"):
  """One evaluation row per replica, in replica order: its last, its best by SELECTION_METRIC,
  or (step an integer N) its last at or before step N.

  A replica flagged as diverged keeps its rows up to divergence; the chosen row's "diverged" says
  whether it diverged (by step N, for an integer). One that diverged before its first evaluation
  is represented by its "diverged" row (no evaluation metrics), so it is counted, not dropped.
  Ties in "best" go to the earlier step. A replica with no evaluation at or before step N is a
  ValueError naming it and its first evaluated step, so that no replica is silently left out.
  """
  step = parse_step(step)
  by_replica = collections.defaultdict(list)
  diverged = {}
  for row in rows:
    if row.get(DIVERGED):
      diverged[row[REPLICA]] = row
    if row.get(KIND) == "eval":
      by_replica[row[REPLICA]].append(row)
  if isinstance(step, int):
    _check_evaluated_by(step, by_replica, diverged)
    diverged = {i: r for i, r in diverged.items() if r[DIVERGED_STEP] <= step}
    by_replica = {i: kept for i, evals in by_replica.items()
                  if (kept := [r for r in evals if r[STEP] <= step])}
  for replica, row in diverged.items():
    by_replica.setdefault(replica, [row])
  chosen = []
  for replica, evals in sorted(by_replica.items()):
    evals = sorted(evals, key=lambda r: r[STEP])
    if step == "best":
      row = max(evals, key=lambda r: (_nan_low(r.get(SELECTION_METRIC)), -r[STEP]))
    else:
      row = evals[-1]
    chosen.append({**row, DIVERGED: replica in diverged})
  return chosen


def _check_evaluated_by(step, evals_by_replica, diverged):
  """ValueError naming the first replica with neither an evaluation nor a divergence at or
  before `step`, and where its first one is."""
  for replica in sorted(set(evals_by_replica) | set(diverged)):
    firsts = [r[STEP] for r in evals_by_replica.get(replica, ())]
    firsts += [diverged[replica][DIVERGED_STEP]] if replica in diverged else []
    if min(firsts) > step:
      raise ValueError(f"step={step}: replica {replica} has no evaluation at or before it "
                       f"(its first is at step {min(firsts)})")


def diverged_steps(rows):
  """{replica index: the step whose update was non-finite} of the replicas that diverged."""
  return {r[REPLICA]: r[DIVERGED_STEP] for r in rows if r.get(KIND) == "diverged"}


def summary_rows(rows, replicas):
  """One dict per replica with rows: its coordinates, final and best evaluation, divergence.

  A replica that diverged before its first evaluation has its divergence step and empty
  metrics. replicas: coordinate dicts (replicas.json).
  """
  final = {r[REPLICA]: r for r in select_evaluations(rows, "final")}
  best = {r[REPLICA]: r for r in select_evaluations(rows, "best")}
  diverged_at = diverged_steps(rows)
  out = []
  for coordinates in replicas:
    index = coordinates[REPLICA]
    if index not in final:
      continue
    max_k = object_accuracy(HELDOUT, coordinates[MAX_OBJECTS])
    summary = dict(coordinates)
    if isinstance(summary[NUM_VALUES], list):
      summary[NUM_VALUES] = json.dumps(summary[NUM_VALUES])
    summary["final_step"] = final[index][STEP]
    for name in SUMMARY_METRICS + (max_k,):
      summary[f"final {name}"] = final[index].get(name)
    summary["best_step"] = best[index][STEP]
    summary[f"best {SELECTION_METRIC}"] = best[index].get(SELECTION_METRIC)
    summary[f"best {object_accuracy(HELDOUT, MAX_K)}"] = best[index].get(max_k)
    summary[DIVERGED_STEP] = diverged_at.get(index, "")
    out.append(summary)
  return out


def summary_csv(rows, replicas):
  """The text of summary.csv: one line per replica with rows (`summary_rows`); None when no
  replica has rows."""
  table = summary_rows(rows, replicas)
  if not table:
    return None
  fields = []
  for row in table:
    fields.extend(k for k in row if k not in fields)
  buffer = io.StringIO()
  writer = csv.DictWriter(buffer, fieldnames=fields)
  writer.writeheader()
  for row in table:
    writer.writerow({k: "" if v is None else v for k, v in row.items()})
  return buffer.getvalue()


# Settings added to the config after workdirs were written, with the value that a config saved
# without one ran as: such a workdir resumes under that value. (A workdir written before packing
# existed checkpointed its buckets whole, and the sweep resumes it laid out that way.)
ADDED_SETTINGS = {"sweep.packing": "auto"}


def with_added_settings(saved):
  """`saved` (a config.json dict) with each ADDED_SETTINGS value it lacks: what it ran as."""
  saved = json.loads(json.dumps(saved))
  for key, value in ADDED_SETTINGS.items():
    *parents, name = key.split(".")
    node = saved
    for parent in parents:
      node = node.setdefault(parent, {})
    node.setdefault(name, value)
  return saved


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


def config_difference(saved, config):
  """(field, saved value, given value) of each dotted field where the config a workdir saved
  (with the settings added since, `with_added_settings`) differs from `config`, sorted; both
  are `config_json` dicts."""
  if saved == config:
    return []
  a, b = _flat(with_added_settings(saved)), _flat(config)
  return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
