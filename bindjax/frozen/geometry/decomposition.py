"""Additive decomposition of 2-object scene embeddings and the subtraction suite.

Semantics: docs/geometry.md#additive-fits and docs/geometry.md#subtraction-suite.

On the centred 2-object embeddings y (mean of the 2-object scenes removed):
- object model  ŷ = E_slot0[o1] + E_slot1[o2];
- concept model ŷ = Σ_slot Σ_c T_{slot,c}[v_{slot,c}];
both fitted with AdamW (lr 1e-2, 10,000 steps, batches of 2048 rows drawn with replacement from a
99% training split) and scored by R² = 1 − SSE/SST pooled over dimensions; the exact least-squares
solution on the same split is reported beside each fit. Closed-form object estimates (obj-avg,
pos-avg, single-object) give reconstructions ŷ = u[o1] + u[o2] scored the same way (single-object
estimates are centred by the mean single-object embedding). The base probes score every
reconstruction, and each reconstruction retrieves its own scene (cosine top-1 among the real
centred 2-object embeddings).

Subtraction suite: linear probes (docs/probes.md) fitted on the base embeddings y, on
y − concept reconstruction, on
y − object reconstruction, and on two controls that subtract the same models evaluated at
permuted ids (a random derangement of object ids, resp. of each concept's values), so the
subtracted vectors have the right magnitude but the wrong content. All five probe runs are fitted
in one batch. By default the reconstructions subtracted are the least-squares solutions: the
AdamW fit at a constant lr 1e-2 ends jittering around the optimum, and that per-id error is itself
additive, so 10,000-step probes read the concepts back from "y − fit" (clevr_text: concept
accuracy 0.79 after subtracting the fit). `subtract="fit"` subtracts the fitted tables instead.
"""
import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bindjax.base import files
from bindjax.frozen.geometry import common
from bindjax.frozen.probes import linear

RESULTS_FILE = "decomposition.json"
SUBTRACT = ("least_squares", "fit")
SUITE = ("base", "minus_concepts", "minus_objects", "minus_concepts_permuted",
         "minus_objects_permuted")


@dataclasses.dataclass(frozen=True)
class AdditiveFitConfig:
  """Additive-model fit (hashable: a jit static argument). Weight decay: torch AdamW's default."""
  steps: int = 10_000
  learning_rate: float = 1e-2
  weight_decay: float = 0.01
  batch_size: int = 2048
  train_fraction: float = 0.99
  seed: int = 0

  def validate(self):
    if self.steps < 1 or self.batch_size < 1:
      raise ValueError(f"AdditiveFitConfig steps={self.steps}, batch_size={self.batch_size}: "
                       "expected ≥ 1")
    if not 0 < self.train_fraction < 1:
      raise ValueError(f"AdditiveFitConfig.train_fraction={self.train_fraction}: expected in "
                       "(0, 1)")
    if not self.learning_rate > 0:
      raise ValueError(f"AdditiveFitConfig.learning_rate={self.learning_rate}: expected > 0")
    return self


@dataclasses.dataclass(frozen=True)
class DecompositionConfig:
  """Settings of a decomposition run: the additive fits, the suite's probes, the banks."""
  fit: AdditiveFitConfig = AdditiveFitConfig()
  probe: linear.ProbeConfig = linear.ProbeConfig()
  banks: tuple = ()                 # (): every bank the set supports
  control_seed: int = 0             # permutation of the controls
  tie_tolerance: float = common.TIE_TOLERANCE
  # Reconstruction subtracted in the suite: the exact least-squares solution of each additive
  # model (default; the optimum the fit approaches) or the AdamW-fitted tables as they end.
  subtract: str = "least_squares"
  obj_avg_counting: str = common.OBJ_AVG_COUNTING

  def __post_init__(self):
    object.__setattr__(self, "banks", common.bank_names(self.banks, "banks"))

  def validate(self):
    if self.subtract not in SUBTRACT:
      raise ValueError(f"subtract={self.subtract!r}: expected one of {SUBTRACT}")
    if self.obj_avg_counting not in common.OBJ_AVG_COUNTINGS:
      raise ValueError(f"obj_avg_counting={self.obj_avg_counting!r}: expected one of "
                       f"{common.OBJ_AVG_COUNTINGS}")
    self.fit.validate()
    self.probe.validate()
    return self


@functools.partial(jax.jit, static_argnames=("num_rows", "config"))
def fit_additive(indices_NxJ, targets_NxD, train_rows_T, num_rows, config):
  """Fits a table [num_rows, D] so that Σ_j table[indices[n, j]] ≈ targets[n] (MSE).

  Zero-initialised; minibatches of `config.batch_size` rows drawn with replacement from
  train_rows. Returns (table, loss per step).
  """
  table = jnp.zeros((num_rows, targets_NxD.shape[1]), jnp.float32)
  optimizer = optax.adamw(config.learning_rate, b1=0.9, b2=0.999, eps=1e-8,
                          weight_decay=config.weight_decay)

  def loss_fn(t, idx_BxJ, y_BxD):
    return jnp.mean((t[idx_BxJ].sum(1) - y_BxD) ** 2)

  def step(carry, key):
    t, state = carry
    rows_B = jax.random.choice(key, train_rows_T, (config.batch_size,), replace=True)
    loss, grads = jax.value_and_grad(loss_fn)(t, indices_NxJ[rows_B], targets_NxD[rows_B])
    updates, state = optimizer.update(grads, state, t)
    return (optax.apply_updates(t, updates), state), loss

  keys = jax.random.split(jax.random.PRNGKey(config.seed), config.steps)
  (table, _), losses = jax.lax.scan(step, (table, optimizer.init(table)), keys)
  return table, losses


def object_indices(ids_Nx2, num_objects):
  """Object-model rows: slot s, object o -> s·U + o."""
  return np.asarray(ids_Nx2) + np.array([0, num_objects])


def concept_indices(values_Nx2xC, values_per_concept):
  """Concept-model rows: slot s, concept c, value v -> s·ΣV + offset_c + v."""
  offsets_C = np.concatenate([[0], np.cumsum(values_per_concept)[:-1]])
  total = int(np.sum(values_per_concept))
  rows_Nx2xC = np.asarray(values_Nx2xC) + offsets_C + (np.arange(2) * total)[:, None]
  return rows_Nx2xC.reshape(len(rows_Nx2xC), -1)


def derangement(n, rng):
  """A random permutation of range(n) without fixed points (identity when n < 2)."""
  order = rng.permutation(n)
  perm = np.arange(n)
  perm[order] = order[(np.arange(n) + 1) % n]
  return perm


def split_rows(n, fraction, seed):
  """Random train/test rows (numpy RandomState(seed)); train = first clamp(int(f·n), 1, n-1)."""
  perm = np.random.RandomState(seed).permutation(n)
  n_train = linear.split_count(n, fraction)
  return np.sort(perm[:n_train]), np.sort(perm[n_train:])


def least_squares_additive(indices_NxJ, targets_NxD, train_rows_T, num_rows):
  """Minimum-norm least-squares table for Σ_j table[indices[n, j]] ≈ targets[n] on train_rows.

  The optimum the AdamW fit approaches, from the normal equations (memory O(num_rows²)).
  """
  idx_TxJ = np.asarray(indices_NxJ)[train_rows_T]
  y_TxD = np.asarray(targets_NxD, np.float64)[train_rows_T]
  gram_RxR = np.zeros((num_rows, num_rows))
  moments_RxD = np.zeros((num_rows, y_TxD.shape[1]))
  for j in range(idx_TxJ.shape[1]):
    np.add.at(moments_RxD, idx_TxJ[:, j], y_TxD)
    for k in range(idx_TxJ.shape[1]):
      np.add.at(gram_RxR, (idx_TxJ[:, j], idx_TxJ[:, k]), 1.0)
  return np.linalg.pinv(gram_RxR, hermitian=True) @ moments_RxD


def _score_table(name, table_RxD, indices_NxJ, y_NxD, train_rows, test_rows, **extra):
  prediction_NxD = table_RxD[indices_NxJ].sum(1)

  def r2(rows):   # SST around 0: y is centred over all 2-object scenes
    sse = np.sum((y_NxD[rows] - prediction_NxD[rows]) ** 2)
    sst = np.sum(y_NxD[rows] ** 2)
    return float(1 - sse / sst) if sst > 0 else None

  info = {"model": name, "r2_all": r2(slice(None)), "r2_train": r2(train_rows),
          "r2_test": r2(test_rows), "num_parameters": int(table_RxD.size), **extra}
  return prediction_NxD, info


def _fit_and_score(name, indices_NxJ, y_NxD, num_rows, train_rows, test_rows, config):
  """Both solutions of one additive model: the AdamW fit and the exact least squares."""
  table, losses = fit_additive(jnp.asarray(indices_NxJ, jnp.int32), jnp.asarray(y_NxD, jnp.float32),
                               jnp.asarray(train_rows, jnp.int32), num_rows, config)
  table = np.asarray(table, np.float64)
  fit_pred, info = _score_table(name, table, indices_NxJ, y_NxD, train_rows, test_rows,
                                final_loss=float(np.asarray(losses)[-10:].mean()))
  exact = least_squares_additive(indices_NxJ, y_NxD, train_rows, num_rows)
  exact_pred, exact_info = _score_table(name, exact, indices_NxJ, y_NxD, train_rows, test_rows)
  info["least_squares"] = {k: v for k, v in exact_info.items() if k.startswith("r2")}
  return {"fit": (table, fit_pred), "least_squares": (exact, exact_pred)}, info


@functools.partial(jax.jit, static_argnames=("weights_axis", "similarity"))
def _score_stack(weights, embeddings_MxNxD, labels, row_mask_N, weights_axis, similarity):
  """score_embeddings over a stack of embeddings (weights stacked too when weights_axis=0)."""
  return jax.vmap(
      lambda w, z: linear.score_embeddings(w, z, labels, row_mask_N, similarity),
      in_axes=(weights_axis, 0))(weights, embeddings_MxNxD)


def _retrieval(reconstruction_NxD, y_NxD, ids_Nx2, tie_tolerance):
  key_N, set_key_N = common.scene_keys(ids_Nx2)
  res = common.top1_retrieval(reconstruction_NxD, y_NxD, key_N, key_N, set_key_N, set_key_N,
                              tie_tolerance=tie_tolerance)
  return {"accuracy": float(res["hit"].mean()), "ties": int(res["tie"].sum()),
          "order_insensitive_accuracy": float(res["order_insensitive_hit"].mean())}


def _permuted_controls(obj_table, con_table, index, values_Nx2xC, values_per_concept, seed):
  """The fitted models evaluated at deranged object ids / deranged values of each concept."""
  rng = np.random.RandomState(seed)
  num_u = index.num_objects
  object_perm_U = derangement(num_u, rng)
  obj_pred = obj_table[object_indices(object_perm_U[index.ids_Nx2], num_u)].sum(1)
  permuted_values = values_Nx2xC.copy()
  value_perms = []
  for c, v in enumerate(values_per_concept):
    value_perms.append(derangement(v, rng))
    permuted_values[..., c] = value_perms[-1][values_Nx2xC[..., c]]
  con_pred = con_table[concept_indices(permuted_values, values_per_concept)].sum(1)
  return con_pred, obj_pred, {"object_permutation": object_perm_U,
                              "value_permutations": value_perms}


def _subtraction_suite(stack_MxNxD, y_NxD, labels, config):
  """Probes fitted on every variant in one batch; (per-variant results, weights)."""
  n = len(y_NxD)
  probe_train, _ = linear.scene_split(n, config.probe.seed, config.probe.train_fraction)
  train_mask = linear.rows_to_mask(probe_train, n)
  weights, losses = linear.fit_probes(stack_MxNxD, labels, train_mask, config.probe)
  sim = config.probe.similarity
  scores = {split: _score_stack(weights, stack_MxNxD, labels, mask, 0, sim)
            for split, mask in (("train", train_mask), ("test", ~train_mask))}
  losses = np.asarray(losses)
  suite = {}
  for m, name in enumerate(SUITE):
    suite[name] = {split: linear.to_python(jax.tree_util.tree_map(lambda x, m=m: x[m], s))
                   for split, s in scores.items()}
    suite[name]["final_train_loss"] = float(losses[m, -1])
    suite[name]["removed_norm_fraction"] = float(
        np.linalg.norm(y_NxD - stack_MxNxD[m]) / np.linalg.norm(y_NxD))
  return suite, weights


def _bank_reconstruction(bank_name, index, embeddings_AxD, mean_D, y_NxD, obj_avg_counting):
  """(centred reconstruction u[o1] + u[o2], info); rows lacking an estimate are zero."""
  bank = common.object_bank(bank_name, index, embeddings_AxD, obj_avg_counting)
  centre_D = (embeddings_AxD[index.single_rows_S].mean(0) if bank_name == "single-object"
              else mean_D)
  tables = [bank.slot(s) for s in (0, 1)]
  present_2xN = np.stack([tables[s][1][index.ids_Nx2[:, s]] for s in (0, 1)])
  usable_N = present_2xN.all(0)
  pred_NxD = sum(tables[s][0][index.ids_Nx2[:, s]] - centre_D for s in (0, 1))
  pred_NxD[~usable_N] = 0.0
  return pred_NxD, {"r2": common.r_squared(y_NxD[usable_N], pred_NxD[usable_N]),
                    "scenes_without_estimate": int((~usable_N).sum()),
                    "missing_object_vectors": int((~present_2xN).sum())}


def _score_reconstructions(reconstructions, weights, labels, y_NxD, index, config):
  """{name: its R² and info, the base probes' accuracy on it, retrieval of its own scene} of
  every reconstruction ({name: (pred [N, D], info)})."""
  names = list(reconstructions)
  base_weights = jax.tree_util.tree_map(lambda x: x[0], weights)
  frozen = _score_stack(base_weights, np.stack([reconstructions[k][0] for k in names]).astype(
      np.float32), labels, np.ones(len(y_NxD), bool), None, config.probe.similarity)
  scored = {}
  for r, name in enumerate(names):
    pred_NxD, info = reconstructions[name]
    scored[name] = {"probe": {m: float(frozen[m][r]) for m in ("concept_acc", "object_acc")},
                    "retrieval": _retrieval(pred_NxD, y_NxD, index.ids_Nx2, config.tie_tolerance),
                    **info}
  return scored


def run_decomposition(embedding_set, config=DecompositionConfig()):
  """Both additive fits, the object estimates and the subtraction suite; returns a results dict."""
  config.validate()
  index = common.scene_index(embedding_set)
  banks = common.banks_to_run(config.banks, index)
  values_per_concept = tuple(int(v) for v in embedding_set.values_per_concept)
  num_u = index.num_objects
  embeddings_AxD = np.asarray(embedding_set.embeddings, np.float64)
  mean_D = embeddings_AxD[index.rows_N].mean(0)
  y_NxD = embeddings_AxD[index.rows_N] - mean_D
  n = len(y_NxD)
  values_Nx2xC = index.unique_UxC[index.ids_Nx2]

  train_rows, test_rows = split_rows(n, config.fit.train_fraction, config.fit.seed)
  obj_solutions, obj_info = _fit_and_score("object", object_indices(index.ids_Nx2, num_u), y_NxD,
                                           2 * num_u, train_rows, test_rows, config.fit)
  con_solutions, con_info = _fit_and_score(
      "concept", concept_indices(values_Nx2xC, values_per_concept), y_NxD,
      2 * sum(values_per_concept), train_rows, test_rows, config.fit)
  obj_table, obj_pred = obj_solutions[config.subtract]
  con_table, con_pred = con_solutions[config.subtract]
  con_perm_pred, obj_perm_pred, controls = _permuted_controls(
      obj_table, con_table, index, values_Nx2xC, values_per_concept, config.control_seed)

  labels = linear.probe_labels(embedding_set.objects[index.rows_N], np.full(n, 2),
                               values_per_concept, index.ids_Nx2, num_u)
  stack_MxNxD = np.stack([y_NxD, y_NxD - con_pred, y_NxD - obj_pred, y_NxD - con_perm_pred,
                          y_NxD - obj_perm_pred]).astype(np.float32)
  suite, weights = _subtraction_suite(stack_MxNxD, y_NxD, labels, config)

  # Every reconstruction: R², the base probes' accuracy on it, retrieval of its own scene.
  reconstructions = {"object_model": (obj_solutions["fit"][1], {"r2": obj_info["r2_all"]}),
                     "concept_model": (con_solutions["fit"][1], {"r2": con_info["r2_all"]})}
  for bank_name in banks:
    reconstructions[bank_name] = _bank_reconstruction(bank_name, index, embeddings_AxD, mean_D,
                                                      y_NxD, config.obj_avg_counting)
  scored = _score_reconstructions(reconstructions, weights, labels, y_NxD, index, config)
  return {
      "num_two_object_scenes": n,
      "num_single_object_scenes": int(len(index.single_rows_S)),
      "num_objects": num_u,
      "dim": int(y_NxD.shape[1]),
      "values_per_concept": list(values_per_concept),
      "fits": {"object": obj_info, "concept": con_info,
               "num_train_scenes": int(len(train_rows)), "num_test_scenes": int(len(test_rows))},
      "reconstructions": scored,
      "subtraction": suite,
      "subtracted": config.subtract,
      "controls": controls,
      "banks": list(banks),
      "config": dataclasses.asdict(config),
  }


def write_decomposition(workdir, results, overwrite=False):
  """Writes decomposition.json under workdir (atomically); returns its path."""
  path = os.path.join(workdir, RESULTS_FILE)
  common.refuse_existing([path], overwrite)
  files.write_json(path, files.to_jsonable(results), indent=1)
  return path
