"""Prequential description length of the embeddings given the concepts (docs/complexity.md,
"Description length").

Objects are taken in the order of a seeded permutation (the object split's, so the first k
objects are the training objects of the grid fit with that seed and k training objects). Block
boundaries are object counts k_1 < … < k_B < U. Block 0 holds the scenes whose objects are all
among the first k_1; block j ≥ 1 the scenes whose objects are all among the first k_{j+1} (U for
the last) but not all among the first k_j. Block 0 is coded by a baseline shared by every
family: a per-dimension Gaussian with the mean and variance of all scenes. Block j ≥ 1 is coded
by the family fitted on the scenes of blocks 0..j−1 (the train-only scenes of k_j training
objects): a per-dimension Gaussian around its predictions, mixed half and half with the
baseline per scene. Its variance is the previous block's coder's mean squared residual on the
previous block (scenes that fit had not seen; the baseline's variance for block 1). Every
coordinate is coded to precision eps, so a scene costs −log2(density·eps^D) bits.

Every block fit (and every learning rate and restart of it, of which the one with the lowest
training MSE codes the block) of one family is a model of one `fitting.fit_models` batch.
"""
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from bindjax.complexity import data as data_lib
from bindjax.complexity import fitting
from bindjax.core import objectives
from bindjax.frozen.probes import linear
from bindjax.runtime import parallel

CSV_COLUMNS = ("name", "family", "seed", "num_parameters", "num_scenes", "num_objects",
               "num_blocks", "total_bits", "bits_per_scene", "baseline_bits_per_scene",
               "eps")


@dataclasses.dataclass(frozen=True)
class CodeConfig:
  """Settings of the prequential code (the fits themselves follow a `fit_settings.FitConfig`)."""
  # Object-count boundaries as fractions of the U objects, each giving clamp(int(f·U), 1, U−1)
  # objects as in the object split; fractions that give the same count are one boundary.
  block_fractions: tuple = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
  # Initialisations per block and learning rate; the lowest training MSE codes the block.
  restarts: int = 4
  # eps = precision × the root mean square over dimensions of the embeddings' standard deviation.
  precision: float = 1e-3

  def __post_init__(self):
    object.__setattr__(self, "block_fractions", tuple(float(f) for f in self.block_fractions))

  def validate(self):
    """Returns self; ValueError naming the bad field."""
    f = self.block_fractions
    if not f or not all(a < b for a, b in zip((0.0,) + f, f + (1.0,))):
      raise ValueError(f"block_fractions={f}: expected increasing fractions in (0, 1)")
    if int(self.restarts) != self.restarts or self.restarts < 1:
      raise ValueError(f"restarts={self.restarts}: expected an integer ≥ 1")
    if not 0 < self.precision < math.inf:
      raise ValueError(f"precision={self.precision}: expected a positive number")
    return self


def boundary_fractions(num_objects, fractions):
  """The fractions whose object counts clamp(int(f·U), 1, U−1) are distinct (the first of
  each count), in increasing order."""
  by_count = {}
  for f in sorted(fractions):
    by_count.setdefault(linear.split_count(num_objects, f), f)
  return list(by_count.values())


def block_boundaries(num_objects, fractions):
  """Object counts that end the blocks: the distinct counts of the fractions, then U."""
  return [linear.split_count(num_objects, f)
          for f in boundary_fractions(num_objects, fractions)] + [num_objects]


def scene_blocks(object_ids_NxK, permutation_U, boundaries):
  """[N] block of every scene: the first j with all its objects among the first boundaries[j]
  objects of the permutation (host numpy)."""
  rank_U = np.empty(len(permutation_U), np.int64)
  rank_U[np.asarray(permutation_U)] = np.arange(len(permutation_U))
  last_rank_N = rank_U[np.asarray(object_ids_NxK)].max(-1)
  return np.searchsorted(np.asarray(boundaries), last_rank_N, side="right")


def gaussian_bits(residual_NxD, variance_D):
  """[N] −log2 of the density of each row under independent N(0, variance_d) coordinates."""
  per_coordinate = jnp.log(2 * jnp.pi * variance_D) + residual_NxD ** 2 / variance_D
  return 0.5 * per_coordinate.sum(-1) / jnp.log(2.0)


@functools.partial(jax.jit, static_argnames=("model",))
def _fit_errors(params, permutation_MxU, num_train_M, num_coded_M, data, model):
  """Per fit: its training MSE and [D] mean squared residual on the block it codes (the scenes
  of the first num_coded objects that are not training scenes). One fit at a time (lax.map),
  so memory stays O(N·D)."""

  def one(args):
    p, permutation_U, num_train, num_coded = args
    sq_NxD = (model.apply(p, data.values_NxKxC) - data.targets_NxD) ** 2
    train_N = data_lib.scene_masks(data.object_ids_NxK, permutation_U, num_train)[0]
    coded_N = data_lib.scene_masks(data.object_ids_NxK, permutation_U, num_coded)[0] & ~train_N
    train_mse = objectives.masked_mean(sq_NxD.mean(-1), train_N)
    coded_D = (coded_N[:, None] * sq_NxD).sum(0) / jnp.maximum(coded_N.sum(), 1)
    return train_mse, coded_D

  return jax.lax.map(one, (params, permutation_MxU, num_train_M, num_coded_M))


@functools.partial(jax.jit, static_argnames=("model",))
def _fit_bits(params, variance_MxD, data, model):
  """[M, N] Gaussian bits of every scene around each fit's prediction, variance per fit."""
  return jax.lax.map(lambda a: gaussian_bits(model.apply(a[0], data.values_NxKxC) -
                                             data.targets_NxD, a[1]), (params, variance_MxD))


def baseline(targets_NxD, precision):
  """(eps, [D] variance of all scenes, [N] baseline Gaussian bits of every scene without the
  −D·log2 eps precision term)."""
  targets_NxD = np.asarray(targets_NxD, np.float64)
  variance_D = targets_NxD.var(0)
  eps = precision * math.sqrt(variance_D.mean())
  bits_N = gaussian_bits(targets_NxD - targets_NxD.mean(0), np.maximum(variance_D, eps ** 2))
  return eps, variance_D, np.asarray(bits_N, np.float64)


def mixture_bits(model_bits_N, baseline_bits_N):
  """−log2(½·2^−a + ½·2^−b) per scene: never more than 1 bit above the better of the two."""
  return 1.0 - np.logaddexp2(-np.asarray(model_bits_N, np.float64), -baseline_bits_N)


def candidates(num_objects, seeds, learning_rates, config):
  """Fits of one family: Points of every (seed, block j ≥ 1, learning rate, restart) and those
  coordinates, seed-major. Restart r of seed s initialises from fold_in(PRNGKey(s), r)."""
  fractions = boundary_fractions(num_objects, config.block_fractions)
  coords = [(int(s), j, float(lr), r) for s in seeds for j in range(1, len(fractions) + 1)
            for lr in learning_rates for r in range(config.restarts)]
  points = data_lib.make_points(num_objects, [fractions[c[1] - 1] for c in coords],
                                [c[0] for c in coords], [c[2] for c in coords])
  keys = [jax.random.fold_in(jax.random.PRNGKey(s), r) for s, _, _, r in coords]
  return points.replace(key_Mx2=np.stack([np.asarray(k) for k in keys]).astype(np.uint32)), coords


def measure(models, data, seeds, learning_rates, config, fit_config, probes=None, mesh=None,
            chunk_size=parallel.AUTO, memory_bytes=None, on_eval=None):
  """Prequential code length of every (approximator, seed) on `data` (a ComplexityData).

  The fits train fit_config.steps steps with one evaluation at the end (scored by `probes`,
  which the code does not use; placeholder probes when None). Returns one row per (model,
  seed), model-major: totals, bits per scene, num_parameters and the per-block detail.
  """
  config.validate()
  fit_config = dataclasses.replace(fit_config, eval_every=fit_config.steps, eval_cadence="end")
  fit_config.validate()
  if probes is None:
    probes = linear.init_weights(jax.random.PRNGKey(0), data.labels.values_per_concept,
                                 data.num_unique, data.targets_NxD.shape[-1],
                                 linear.ProbeConfig())
  boundaries = block_boundaries(data.num_unique, config.block_fractions)
  eps, baseline_variance_D, baseline_bits_N = baseline(data.targets_NxD, config.precision)
  precision_bits = -data.targets_NxD.shape[-1] * math.log2(eps)
  points, coords = candidates(data.num_unique, seeds, learning_rates, config)
  num_coded_M = np.asarray([boundaries[c[1]] for c in coords], np.int32)
  rows = []
  for model in models:
    _, info = fitting.fit_models(model, data, probes, points, fit_config, mesh, chunk_size,
                                 memory_bytes, on_eval, keep_params=True)
    train_mse_M, coded_MxD = (np.asarray(x, np.float64) for x in _fit_errors(
        info["params"], points.permutation_MxU, points.num_train_M, num_coded_M, data, model))
    for seed in seeds:
      members = [m for m, c in enumerate(coords) if c[0] == seed]
      block_N = scene_blocks(data.object_ids_NxK, points.permutation_MxU[members[0]],
                             boundaries)
      coders = _coders(members, coords, np.bincount(block_N, minlength=len(boundaries)),
                       train_mse_M, coded_MxD, baseline_variance_D, eps)
      params = jax.tree_util.tree_map(lambda x, c=coders: x[[m for m, _ in c]], info["params"])
      bits_JxN = np.asarray(_fit_bits(params, np.stack([v for _, v in coders]), data, model),
                            np.float64)
      rows.append(_code_row(model, seed, data, boundaries, block_N, coords, coders, bits_JxN,
                            train_mse_M, coded_MxD, baseline_bits_N, eps, precision_bits))
  return rows


def _coders(members, coords, block_sizes, train_mse_M, coded_MxD, baseline_variance_D, eps):
  """(fit, [D] variance) coding each block j ≥ 1 of one seed: the fit of lowest training MSE,
  and the mean squared residual of the previous block's coder on that block (held-out
  residuals of scenes already decoded), the baseline's variance before any, floored at eps²."""
  coders, variance_D = [], baseline_variance_D
  for j in range(1, len(block_sizes)):
    fits = [m for m in members if coords[m][1] == j]
    best = fits[int(np.argmin(train_mse_M[fits]))]
    coders.append((best, np.maximum(variance_D, eps ** 2)))
    if block_sizes[j]:
      variance_D = coded_MxD[best]
  return coders


def _code_row(model, seed, data, boundaries, block_N, coords, coders, bits_JxN, train_mse_M,
              coded_MxD, baseline_bits_N, eps, precision_bits):
  """The code of one seed's ordering: block 0 by the baseline, block j ≥ 1 by the half-and-half
  mixture of the baseline and its coder's Gaussian."""
  bits_N = baseline_bits_N + precision_bits
  blocks = [{"objects": [0, boundaries[0]], "coder": "baseline"}]
  for j, (best, variance_D) in enumerate(coders, start=1):
    in_block_N = block_N == j
    model_bits_B, baseline_bits_B = bits_JxN[j - 1, in_block_N], baseline_bits_N[in_block_N]
    bits_N[in_block_N] = mixture_bits(model_bits_B, baseline_bits_B) + precision_bits
    blocks.append({
        "objects": [boundaries[j - 1], boundaries[j]], "coder": "model",
        "learning_rate": coords[best][2], "restart": coords[best][3],
        "train_mse": float(train_mse_M[best]), "coded_mse": float(coded_MxD[best].mean()),
        "coding_variance": float(variance_D.mean()),
        # Scenes the baseline codes better than the fit (the mixture falls back to it).
        "baseline_share": float((baseline_bits_B < model_bits_B).mean()) if len(model_bits_B)
                          else 0.0})
  for j, block in enumerate(blocks):
    block["num_scenes"] = int((block_N == j).sum())
    block["bits"] = float(bits_N[block_N == j].sum())
    block["bits_per_scene"] = block["bits"] / max(block["num_scenes"], 1)
  return {"name": model.name, "family": model.family, "seed": int(seed),
          "num_parameters": model.num_parameters(), "num_scenes": data.num_scenes,
          "num_objects": data.num_unique, "num_blocks": len(blocks),
          "total_bits": float(bits_N.sum()), "bits_per_scene": float(bits_N.mean()),
          "baseline_bits_per_scene": float(baseline_bits_N.mean() + precision_bits),
          "eps": eps, "blocks": blocks}
