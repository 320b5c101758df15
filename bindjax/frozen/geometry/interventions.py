"""Object-replacement interventions by vector arithmetic (docs/geometry.md#interventions).

Recolouring object i of a 2-object scene to attribute t: `ẑ = z − k·(u[a_i, s_i] − u[t, s_i])`, u
an object bank (obj-avg, pos-avg with the edited slot's table, or single-object scenes). The edit
succeeds when cosine top-1 retrieval among all real scene embeddings returns the scene's true
counterpart (object i recoloured), and, for the probing check, when every concept probe ranks the
counterpart's values strictly above all others.

Cases: for each 2-object scene in row order whose objects have different shapes, one target
attribute different from both original attributes is drawn with Python `random.Random(seed)`
(`rng.choice` over the allowed attributes in ascending order), and the left object, then the right
one, is recoloured to it. `target_draws="per_object"` draws a fresh target for each edit instead.
Which concept is the "attribute" and which the "shape" is configurable (clevr_text: 0 and 1).
"""
import dataclasses
import json
import os
import random

import numpy as np

from bindjax.base import config_values
from bindjax.base import files
from bindjax.frozen.geometry import common
from bindjax.frozen.probes import linear
from bindjax.frozen.probes import probe_analysis

TARGET_DRAWS = ("per_scene", "per_object")
PROBE_SOURCES = ("auto", "stored", "fit", "none")
POOLS = ("all", "two-object")
SUMMARY_FILE = "interventions_summary.json"
CASES_FILE = "interventions_cases.jsonl"
SKIP_REASONS = ("no_target_attribute", "edited_object_absent", "counterpart_absent",
                "bank_vector_absent")


@dataclasses.dataclass(frozen=True)
class InterventionConfig:
  """Settings of an intervention run."""
  banks: tuple = ()                 # (): every bank the set supports
  strengths: tuple = (1.0,)         # edit strengths k
  attribute_concept: int = common.ATTRIBUTE_CONCEPT
  shape_concept: int = common.SHAPE_CONCEPT
  seed: int = 42
  target_draws: str = "per_scene"
  pool: str = "all"
  tie_tolerance: float = common.TIE_TOLERANCE
  probes: str = "auto"              # stored probe vectors if the set has them, else fitted ones
  probe: linear.ProbeConfig = linear.ProbeConfig()
  probes_file: str = ""             # a probes.npz of `bindjax probe`: used instead of `probes`
  obj_avg_counting: str = common.OBJ_AVG_COUNTING

  def __post_init__(self):
    object.__setattr__(self, "banks", common.bank_names(self.banks, "banks"))
    object.__setattr__(self, "strengths", config_values.numbers(self.strengths, "strengths"))


@dataclasses.dataclass(frozen=True)
class Case:
  """One edit: recolour `slot` of the 2-object scene at set row `scene_row` to `target`."""
  scene_row: int
  slot: int
  ids: tuple              # object indices of the scene (slot order)
  target: int | None      # target attribute value
  edited_id: int | None   # object index of the recoloured object
  counterpart_row: int | None
  shared_attribute: bool
  skipped: str | None


def validate_config(config, embedding_set, index):
  """ValueError for settings the set cannot support; returns the bank names to run."""
  num_concepts = len(embedding_set.values_per_concept)
  for field in ("attribute_concept", "shape_concept"):
    value = getattr(config, field)
    if not 0 <= value < num_concepts:
      raise ValueError(f"{field}={value}: expected a concept index in [0, {num_concepts})")
  if config.attribute_concept == config.shape_concept:
    raise ValueError(f"attribute_concept and shape_concept are both {config.attribute_concept}; "
                     "expected two different concepts")
  if config.target_draws not in TARGET_DRAWS:
    raise ValueError(f"target_draws={config.target_draws!r}: expected one of {TARGET_DRAWS}")
  if config.pool not in POOLS:
    raise ValueError(f"pool={config.pool!r}: expected one of {POOLS}")
  if config.probes not in PROBE_SOURCES:
    raise ValueError(f"probes={config.probes!r}: expected one of {PROBE_SOURCES}")
  if config.probes == "stored":
    missing = [f"concept_{c}" for c in range(num_concepts)
               if f"concept_{c}" not in (embedding_set.probes or {})]
    if missing:
      raise ValueError(f"probes='stored' but the embedding set lacks probe vectors {missing}; "
                       "use probes='fit'")
  if config.obj_avg_counting not in common.OBJ_AVG_COUNTINGS:
    raise ValueError(f"obj_avg_counting={config.obj_avg_counting!r}: expected one of "
                     f"{common.OBJ_AVG_COUNTINGS}")
  if config.probes_file:
    probe_analysis.weights_from_file(config.probes_file, embedding_set.values_per_concept)
  return common.banks_to_run(config.banks, index)


def enumerate_cases(embedding_set, index, config):
  """All edits in the specified order, with the targets drawn from random.Random(config.seed)."""
  attr, shape = config.attribute_concept, config.shape_concept
  num_attributes = int(embedding_set.values_per_concept[attr])
  unique_UxC = index.unique_UxC
  object_of = {tuple(int(v) for v in values): u for u, values in enumerate(unique_UxC)}
  row_of_scene = {}
  pool_rows = np.arange(len(index.scene_ids_AxK)) if config.pool == "all" else index.rows_N
  for row in pool_rows:
    row_of_scene.setdefault(tuple(int(i) for i in index.scene_ids_AxK[row] if i >= 0), int(row))
  rng = random.Random(config.seed)
  cases = []
  for row, ids in zip(index.rows_N, index.ids_Nx2):
    ids = (int(ids[0]), int(ids[1]))
    values = unique_UxC[list(ids)]
    if values[0, shape] == values[1, shape]:
      continue
    originals = {int(values[0, attr]), int(values[1, attr])}
    allowed = [a for a in range(num_attributes) if a not in originals]
    target = None
    if config.target_draws == "per_scene" and allowed:
      target = rng.choice(allowed)
    for slot in (0, 1):
      if config.target_draws == "per_object" and allowed:
        target = rng.choice(allowed)
      shared = len(originals) == 1
      if target is None:
        cases.append(Case(int(row), slot, ids, None, None, None, shared, "no_target_attribute"))
        continue
      edited = values[slot].copy()
      edited[attr] = target
      edited_id = object_of.get(tuple(int(v) for v in edited))
      if edited_id is None:
        cases.append(Case(int(row), slot, ids, target, None, None, shared, "edited_object_absent"))
        continue
      new_ids = list(ids)
      new_ids[slot] = edited_id
      counterpart = row_of_scene.get(tuple(new_ids))
      cases.append(Case(int(row), slot, ids, target, edited_id, counterpart, shared,
                        None if counterpart is not None else "counterpart_absent"))
  return cases


def concept_probe_weights(embedding_set, config):
  """(concept probe matrices [V_c, D] per concept, source): the set's stored probe vectors
  ("stored") or linear probes fitted on the set ("fitted"); (None, None) for probes="none"."""
  num_concepts = len(embedding_set.values_per_concept)
  if config.probes_file:
    weights = probe_analysis.weights_from_file(config.probes_file, embedding_set.values_per_concept)
    return [np.asarray(weights.concept_CxVxD[c, :v], np.float64)
            for c, v in enumerate(embedding_set.values_per_concept)], config.probes_file
  stored = embedding_set.probes or {}
  if config.probes == "none":
    return None, None
  if config.probes in ("auto", "stored") and all(f"concept_{c}" in stored
                                                 for c in range(num_concepts)):
    return [np.asarray(stored[f"concept_{c}"], np.float64) for c in range(num_concepts)], "stored"
  probes, _ = probe_analysis.run_probes(embedding_set, config.probe)
  return [np.asarray(probes[f"concept_{c}"], np.float64) for c in range(num_concepts)], "fitted"


def _probe_correct(edited_QxD, counterpart_values_Qx2xC, weights):
  correct_Q = np.ones(len(edited_QxD), bool)
  for c, w_VxD in enumerate(weights):
    logits_QxV = edited_QxD @ w_VxD.T
    positive_QxV = np.zeros(logits_QxV.shape, bool)
    for slot in (0, 1):
      positive_QxV[np.arange(len(edited_QxD)), counterpart_values_Qx2xC[:, slot, c]] = True
    min_pos_Q = np.where(positive_QxV, logits_QxV, np.inf).min(1)
    max_neg_Q = np.where(positive_QxV, -np.inf, logits_QxV).max(1)
    correct_Q &= min_pos_Q > max_neg_Q
  return correct_Q


def _rates(flags):
  return {name: (float(np.mean(v)) if len(v) else None) for name, v in flags.items()}


def _evaluate_bank(bank, cases, index, embeddings_AxD, keys, pool_rows, weights, config):
  """Scores every usable case with one bank: (result dict, JSONL rows)."""
  scene_key_A, set_key_A = keys
  skipped = {r: sum(c.skipped == r for c in cases) for r in SKIP_REASONS}
  valid, rows = [], []
  for i, case in enumerate(cases):
    if case.skipped:
      continue
    present_U = bank.slot(case.slot)[1]
    if present_U[case.ids[case.slot]] and present_U[case.edited_id]:
      valid.append(i)
    else:
      skipped["bank_vector_absent"] += 1
      rows.append({"case": i, "bank": bank.name, "scene_row": case.scene_row, "slot": case.slot,
                   "skipped": "bank_vector_absent"})
  chosen = [cases[i] for i in valid]
  dim = embeddings_AxD.shape[1]
  z_QxD = embeddings_AxD[[c.scene_row for c in chosen]].reshape(-1, dim)
  delta_QxD = np.array([bank.slot(c.slot)[0][c.ids[c.slot]] - bank.slot(c.slot)[0][c.edited_id]
                        for c in chosen]).reshape(-1, dim)
  target_rows_Q = np.array([c.counterpart_row for c in chosen], np.int64)
  counterpart_values_Qx2xC = index.unique_UxC[index.scene_ids_AxK[target_rows_Q, :2]]
  shared_Q = np.array([c.shared_attribute for c in chosen], bool)
  groups = {"all": np.ones(len(chosen), bool), "shared_attribute": shared_Q,
            "different_attribute": ~shared_Q}
  by_strength = {}
  for k in config.strengths:
    edited_QxD = z_QxD - k * delta_QxD
    retrieval = common.top1_retrieval(
        edited_QxD, embeddings_AxD[pool_rows], scene_key_A[target_rows_Q], scene_key_A[pool_rows],
        set_key_A[target_rows_Q], set_key_A[pool_rows], tie_tolerance=config.tie_tolerance)
    probe_Q = (None if weights is None else
               _probe_correct(edited_QxD, counterpart_values_Qx2xC, weights))
    metrics = {}
    for group, mask in groups.items():
      flags = {"retrieval": retrieval["hit"][mask],
               "retrieval_order_insensitive": retrieval["order_insensitive_hit"][mask]}
      if probe_Q is not None:
        flags["probe"] = probe_Q[mask]
      metrics[group] = {"cases": int(mask.sum()), "ties": int(retrieval["tie"][mask].sum()),
                        **_rates(flags)}
    by_strength[_k_key(k)] = metrics
    for q, case in enumerate(chosen):
      rows.append({
          "case": valid[q], "bank": bank.name, "k": k, "scene_row": case.scene_row,
          "slot": case.slot, "objects": index.unique_UxC[list(case.ids)],
          "target_attribute": case.target, "counterpart_row": case.counterpart_row,
          "shared_attribute": case.shared_attribute, "hit": retrieval["hit"][q],
          "tie": retrieval["tie"][q],
          "order_insensitive_hit": retrieval["order_insensitive_hit"][q],
          "top_row": int(pool_rows[retrieval["top_row"][q]]),
          "probe_correct": None if probe_Q is None else probe_Q[q]})
  return {"skipped": skipped, "by_strength": by_strength}, rows


def run_interventions(embedding_set, config=InterventionConfig()):
  """Runs every case for every bank and strength; returns (summary dict, per-case JSONL rows).

  Summary: per bank, the skipped cases by reason and, per strength k, for all cases and split by
  shared / different attribute: cases, ties (counted as misses), retrieval,
  retrieval_order_insensitive and (with probes) probe accuracy.
  """
  index = common.scene_index(embedding_set)
  banks = validate_config(config, embedding_set, index)
  cases = enumerate_cases(embedding_set, index, config)
  embeddings_AxD = np.asarray(embedding_set.embeddings, np.float64)
  keys = common.scene_keys(index.scene_ids_AxK)
  pool_rows = (np.arange(len(embeddings_AxD)) if config.pool == "all" else index.rows_N)
  weights, probe_source = concept_probe_weights(embedding_set, config)
  results, rows = {}, []
  for bank_name in banks:
    bank = common.object_bank(bank_name, index, embeddings_AxD, config.obj_avg_counting)
    results[bank_name], bank_rows = _evaluate_bank(bank, cases, index, embeddings_AxD, keys,
                                                   pool_rows, weights, config)
    rows += bank_rows
  rows += [{"case": i, "scene_row": c.scene_row, "slot": c.slot,
            "objects": index.unique_UxC[list(c.ids)], "target_attribute": c.target,
            "skipped": c.skipped} for i, c in enumerate(cases) if c.skipped]
  summary = {
      "num_scenes": int(len(embeddings_AxD)),
      "num_two_object_scenes": int(len(index.rows_N)),
      "num_scenes_with_different_shapes": sum(1 for c in cases if c.slot == 0),
      "num_cases": len(cases),
      "num_skipped_before_banks": sum(1 for c in cases if c.skipped),
      "banks": list(banks),
      "strengths": list(config.strengths),
      "probes": probe_source,
      "config": dataclasses.asdict(config),
      "results": results,
  }
  return summary, rows


def _k_key(k):
  return f"{k:g}"


def write_interventions(workdir, summary, rows, overwrite=False):
  """Writes summary.json and cases.jsonl under workdir (atomically)."""
  paths = [os.path.join(workdir, SUMMARY_FILE), os.path.join(workdir, CASES_FILE)]
  common.refuse_existing(paths, overwrite)
  files.write_jsonl(paths[1], files.to_jsonable(rows))
  files.write_json(paths[0], files.to_jsonable(summary), indent=1)
  return paths


# ------------------------------------------------------------------------------------------- tables

def load_summary(path):
  """An interventions summary JSON (or a run directory holding one)."""
  if os.path.isdir(path):
    path = os.path.join(path, SUMMARY_FILE)
  if not os.path.exists(path):
    raise ValueError(f"no interventions summary at {path}")
  with open(path) as f:
    summary = json.load(f)
  if "results" not in summary:
    raise ValueError(f"{path}: not an interventions summary (no 'results' field)")
  return summary


def summary_table(summaries, strength, metric, group, digits=2):
  """(markdown, latex) tables: one row per (dataset, model), one column per bank, each cell the
  `metric` of the cases in `group` (the choices and defaults of `bindjax interventions-table`).

  `strength` selects k (None: the first strength of each run); a bank a run lacks shows "–".
  """
  columns = [b for b in common.BANKS if any(b in s["results"] for s in summaries)]
  body = []
  for s in summaries:
    cells = []
    for bank in columns:
      res = s["results"].get(bank)
      k = _k_key(float(strength)) if strength is not None else _k_key(s["strengths"][0])
      value = None
      if res is not None:
        if k not in res["by_strength"]:
          raise ValueError(f"run {s.get('dataset')}/{s.get('model')}: no results for k={k} "
                           f"(has {sorted(res['by_strength'])})")
        value = res["by_strength"][k][group].get(metric)
      cells.append("–" if value is None else f"{value:.{digits}f}")
    body.append((str(s.get("dataset", "?")), str(s.get("model", "?")), cells))
  header = ["dataset", "model"] + columns
  md = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
  md += ["| " + " | ".join([d, m] + c) + " |" for d, m, c in body]
  esc = lambda t: t.replace("_", r"\_").replace("&", r"\&").replace("%", r"\%")
  tex = [r"\begin{tabular}{ll" + "c" * len(columns) + "}", r"\toprule",
         " & ".join(esc(h) for h in header) + r" \\", r"\midrule"]
  tex += [" & ".join([esc(d), esc(m)] + [c.replace("–", "--") for c in cells]) + r" \\"
          for d, m, cells in body]
  tex += [r"\bottomrule", r"\end{tabular}"]
  return "\n".join(md) + "\n", "\n".join(tex) + "\n"
