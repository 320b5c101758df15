"""The coordinate solver of the additive and product families (docs/complexity.md, "The
coordinate solver").

At the default width (E = D) with W = I, a family whose read-out is the identity (and, for the
sum families, [I; I]) predicts every embedding coordinate d from its own slot tables alone:

  y_d = c_d + Σ_s a_s[v_s, d] + Σ_g Π_{s ∈ g} b_s[v_s, d]

(g: all slots for product and sum_product, each object's C slots for the per-object families;
a: the sum tables, or the tables of `additive`; b: the product tables). Each coordinate is a
small nonlinear least-squares problem, solved by Levenberg–Marquardt from several starts; the
lowest training cost of each coordinate is kept. Every function here is pure and vmappable
over coordinates, starts and models.
"""
import dataclasses
import functools
import typing

import jax
import jax.numpy as jnp

# Families the solver fits, with (has sum tables a, has product tables b, per-object groups).
LAYOUT = {"additive": (True, False, False), "product": (False, True, False),
          "sum_product": (True, True, False), "per_object_product": (False, True, True),
          "per_object_sum_product": (True, True, True)}
# Eigenvalues of a coordinate's training normal matrix JᵀJ below this share of its largest span
# its null space: float32 rounding puts the exact null (gauge) directions near 1e-8 to 1e-7 of
# the largest, a singular value of J near 1e-4 to 3e-4 of its largest.
NULL_TOLERANCE = 1e-6
# Hard-imputation sweeps of the completion start of a two-concept object form.
IMPUTE_SWEEPS = 30
# A coordinate's predictions are identified when the null space carries at most this share of
# the squared Jacobian of its predictions on every scene.
LEAK_TOLERANCE = 1e-4


class Steps(typing.NamedTuple):
  """A coordinate's Levenberg–Marquardt schedule: `starts` starts take `screen` steps each, then
  the cheapest alone goes on to `iterations` steps in all (screen = iterations: every start runs
  to the end). projection: step the product tables alone, the intercept and sum tables solved
  exactly at every step (`_projected_levenberg_marquardt`)."""
  starts: int
  screen: int
  iterations: int
  projection: bool = False


def supports(model):
  """Whether the solver can fit `model`: an additive or product family at E = D with W = I."""
  return model.family in LAYOUT and model.width == model.out_dim and not model.learned_w


def num_parameters(model):
  """Length of one coordinate's θ: [c, a (S·V), b (S·V)], V the largest value count."""
  return 1 + 2 * model.num_slots * max(model.values_per_concept)


def _init_theta(key, model):
  """c = 0, a = 0 and b ~ N(0, 1) where the family has them (zero otherwise)."""
  _, has_product, _ = LAYOUT[model.family]
  half = model.num_slots * max(model.values_per_concept)
  b = jax.random.normal(key, (half,), jnp.float32) * has_product
  return jnp.concatenate([jnp.zeros(1 + half, jnp.float32), b])


def _rows(theta_P, slots_NxS, model):
  """Predictions [N] and the Jacobian [N, P] of every scene.

  Built slot by slot from one-hot value codes (a scene's row is non-zero at its S values of a
  and of b), not from a scatter: dense rows make JᵀJ one matrix product."""
  has_sum, has_product, per_object = LAYOUT[model.family]
  n, s = slots_NxS.shape
  v_max = max(model.values_per_concept)
  onehot_NxSxV = jax.nn.one_hot(slots_NxS, v_max, dtype=jnp.float32)
  a_SxV, b_SxV = theta_P[1:].reshape(2, s, v_max)
  b_NxS = (onehot_NxSxV * b_SxV).sum(-1)
  groups = model.max_objects if per_object else 1
  b_NxGxP = b_NxS.reshape(n, groups, -1)
  size = b_NxGxP.shape[-1]
  # Derivative of a group's product by each factor: the product of the others.
  others_NxGxP = jnp.where(jnp.eye(size, dtype=bool), 1.0, b_NxGxP[:, :, None, :]).prod(-1)
  pred_N = (theta_P[0] + has_sum * (onehot_NxSxV * a_SxV).sum((-1, -2))
            + has_product * b_NxGxP.prod(-1).sum(-1))
  jac_NxP = jnp.concatenate(
      [jnp.ones((n, 1), jnp.float32), has_sum * onehot_NxSxV.reshape(n, -1),
       has_product * (onehot_NxSxV * others_NxGxP.reshape(n, s, 1)).reshape(n, -1)], -1)
  return pred_N, jac_NxP


def predict(theta_P, slots_NxS, model):
  """One coordinate's predictions [N] for scenes given as slot values [N, S]."""
  return _rows(theta_P, slots_NxS, model)[0]


def _ridge(weight_T, model, ridge):
  """The penalty on ‖θ‖² of `ridge` times a coordinate's mean curvature per value (Σ w / V)."""
  return ridge * weight_T.sum() / max(model.values_per_concept)


def _levenberg_marquardt(theta_P, slots_TxS, y_T, weight_T, model, iterations, ridge):
  """`iterations` damped Gauss–Newton steps on Σ_t w_t (pred_t − y_t)² + `_ridge`·‖θ‖²;
  (θ, final cost)."""
  num_params = theta_P.shape[0]
  ridge = _ridge(weight_T, model, ridge)
  cost = lambda t: (weight_T * (predict(t, slots_TxS, model) - y_T) ** 2).sum() + ridge * (
      t ** 2).sum()
  eye = jnp.eye(num_params, dtype=jnp.float32)

  def step(_, carry):
    theta, current, damping = carry
    pred_T, jac_TxP = _rows(theta, slots_TxS, model)
    jac_TxP = jac_TxP * jnp.sqrt(weight_T)[:, None]
    r_T = (pred_T - y_T) * jnp.sqrt(weight_T)
    h_PxP = jac_TxP.T @ jac_TxP + ridge * eye
    g_P = jac_TxP.T @ r_T + ridge * theta
    scale = jnp.trace(h_PxP) / num_params + 1e-12
    trial = theta + jnp.linalg.solve(h_PxP + damping * scale * eye, -g_P)
    trial_cost = cost(trial)
    better = jnp.isfinite(trial_cost) & (trial_cost < current)
    return (jnp.where(better, trial, theta), jnp.where(better, trial_cost, current),
            jnp.where(better, damping * 0.3, damping * 4.0))

  theta, final, _ = jax.lax.fori_loop(0, iterations, step, (theta_P, cost(theta_P), 1e-2))
  return theta, final


def _projection(slots_TxS, weight_T, model, ridge):
  """(A, M) of variable projection: A [T, L] the columns of θ's linear part l = [c, a] (the
  one-hot value codes), M = (AᵀWA + ridge·I)⁻¹AᵀW [L, T], so that l(b) = M (y − m(b))."""
  theta_P = jnp.zeros(num_parameters(model), jnp.float32)
  size_l = 1 + (theta_P.shape[0] - 1) // 2
  a_TxL = _rows(theta_P, slots_TxS, model)[1][:, :size_l]
  ridge = _ridge(weight_T, model, ridge)
  m_LxT = _positive_definite_solve(
      a_TxL.T @ (weight_T[:, None] * a_TxL) + ridge * jnp.eye(size_l), a_TxL.T * weight_T)
  return a_TxL, m_LxT


def _positive_definite_solve(h_NxN, rhs_NxK):
  """h⁻¹ rhs for a symmetric positive definite h: Cholesky factor and two substitutions as
  loops of plain ops. Not LAPACK: jaxlib 0.10's CPU LAPACK kernels block a thread of XLA's pool
  while their batch runs on the same pool, and XLA:CPU runs ops that do not wait on each other
  at once, so two LAPACK calls together deadlock a 2-thread pool. The projection's solve waits
  on nothing but the training scenes, so it would run beside the starts' SVDs."""
  n = h_NxN.shape[0]
  index = jnp.arange(n)

  def factor(j, low_NxN):
    column = h_NxN[:, j] - low_NxN @ low_NxN[j]
    return low_NxN.at[:, j].set(jnp.where(index >= j, column / jnp.sqrt(column[j]), 0.0))

  low_NxN = jax.lax.fori_loop(0, n, factor, jnp.zeros_like(h_NxN))
  forward = lambda i, y: y.at[i].set((rhs_NxK[i] - low_NxN[i] @ y) / low_NxN[i, i])
  y_NxK = jax.lax.fori_loop(0, n, forward, jnp.zeros_like(rhs_NxK))
  backward = lambda k, x: x.at[n - 1 - k].set(
      (y_NxK[n - 1 - k] - low_NxN[:, n - 1 - k] @ x) / low_NxN[n - 1 - k, n - 1 - k])
  return jax.lax.fori_loop(0, n, backward, jnp.zeros_like(rhs_NxK))


def _projected_levenberg_marquardt(theta_P, slots_TxS, y_T, weight_T, model, iterations,
                                   ridge, projection):
  """`_levenberg_marquardt` by variable projection: θ = [l, b] with l = [c, a] entering the
  predictions linearly, so for any product tables b the best l is one least-squares solve
  l(b) = M (y − m(b)) (`projection` = (A, M) of `_projection`, which every start and
  coordinate shares). The damped Gauss–Newton steps run on b alone, on the cost with l(b) put
  in (Golub and Pereyra's reduced problem); (θ = [l(b), b], final cost)."""
  ridge = _ridge(weight_T, model, ridge)
  a_TxL, m_LxT = projection
  size_l = a_TxL.shape[1]

  def parts(b_B):
    """(l, residuals, ∂m/∂b, cost) at product tables b."""
    m_T, jac_TxP = _rows(jnp.concatenate([jnp.zeros(size_l), b_B]), slots_TxS, model)
    l_L = m_LxT @ (y_T - m_T)
    r_T = y_T - m_T - a_TxL @ l_L
    cost = (weight_T * r_T ** 2).sum() + ridge * (l_L @ l_L + b_B @ b_B)
    return l_L, r_T, jac_TxP[:, size_l:], cost

  eye = jnp.eye(theta_P.shape[0] - size_l, dtype=jnp.float32)

  def step(_, carry):
    b_B, current, damping = carry
    _, r_T, jm_TxB, _ = parts(b_B)
    dl_LxB = m_LxT @ jm_TxB          # −∂l/∂b
    jr_TxB = jm_TxB - a_TxL @ dl_LxB  # −∂r/∂b
    h_BxB = jr_TxB.T @ (weight_T[:, None] * jr_TxB) + ridge * (dl_LxB.T @ dl_LxB + eye)
    # The reduced cost's gradient is the full one's in b at l = l(b) (l is optimal there).
    g_B = -jm_TxB.T @ (weight_T * r_T) + ridge * b_B
    scale = jnp.trace(h_BxB) / eye.shape[0] + 1e-12
    trial = b_B + jnp.linalg.solve(h_BxB + damping * scale * eye, -g_B)
    trial_cost = parts(trial)[3]
    better = jnp.isfinite(trial_cost) & (trial_cost < current)
    return (jnp.where(better, trial, b_B), jnp.where(better, trial_cost, current),
            jnp.where(better, damping * 0.3, damping * 4.0))

  b_B = theta_P[size_l:]
  b_B, final, _ = jax.lax.fori_loop(0, iterations, step, (b_B, parts(b_B)[3], 1e-2))
  return jnp.concatenate([parts(b_B)[0], b_B]), final


def _completion_start(values_UxC, y_U, weight_U, model, sweeps=IMPUTE_SWEEPS):
  """θ of one object's two-concept form c + a₀[v₀] + a₁[v₁] + b₀[v₀]·b₁[v₁] from its V × V table
  of object values, observed where weight_U > 0, by hard imputation: fill the unobserved cells
  with the current fit, refit the whole table exactly (double centring gives c and a, the
  leading singular pair of the rest gives b), repeat."""
  v = max(model.values_per_concept)
  seen_VxV = jnp.zeros((v, v), bool).at[values_UxC[:, 0], values_UxC[:, 1]].max(weight_U > 0)
  table_VxV = jnp.zeros((v, v), jnp.float32).at[values_UxC[:, 0], values_UxC[:, 1]].set(
      jnp.where(weight_U > 0, y_U, 0.0))

  def fit(fill_VxV):
    x_VxV = jnp.where(seen_VxV, table_VxV, fill_VxV)
    c = x_VxV.mean()
    row_V, col_V = x_VxV.mean(1) - c, x_VxV.mean(0) - c
    u_VxV, s_V, vt_VxV = jnp.linalg.svd(x_VxV - c - row_V[:, None] - col_V[None, :])
    b0_V, b1_V = u_VxV[:, 0] * jnp.sqrt(s_V[0]), vt_VxV[0] * jnp.sqrt(s_V[0])
    return c, row_V, col_V, b0_V, b1_V

  def sweep(_, fill_VxV):
    c, row_V, col_V, b0_V, b1_V = fit(fill_VxV)
    return c + row_V[:, None] + col_V[None, :] + b0_V[:, None] * b1_V[None, :]

  c, row_V, col_V, b0_V, b1_V = fit(jax.lax.fori_loop(0, sweeps, sweep, jnp.zeros((v, v))))
  has_sum = LAYOUT[model.family][0]
  return jnp.concatenate([c[None], row_V * has_sum, col_V * has_sum, b0_V, b1_V])


def _best_of_starts(key, slots_TxS, y_T, weight_T, model, steps, ridge):
  """One coordinate fitted from `steps.starts` starts drawn from `key` (the first, for one
  object of two concepts, `_completion_start`): every start takes `steps.screen` steps, then
  only the cheapest goes on to `steps.iterations` in all; its (θ, cost)."""
  theta_RxP = jax.vmap(lambda k: _init_theta(k, model))(jax.random.split(key, steps.starts))
  if model.num_slots == 2 and LAYOUT[model.family][2]:
    theta_RxP = theta_RxP.at[0].set(_completion_start(slots_TxS, y_T, weight_T, model))
  fit = _levenberg_marquardt
  if steps.projection:
    fit = functools.partial(_projected_levenberg_marquardt,
                            projection=_projection(slots_TxS, weight_T, model, ridge))
  theta_RxP, cost_R = jax.vmap(lambda t: fit(
      t, slots_TxS, y_T, weight_T, model, steps.screen, ridge))(theta_RxP)
  best = jnp.argmin(jnp.where(jnp.isfinite(cost_R), cost_R, jnp.inf))
  return fit(theta_RxP[best], slots_TxS, y_T, weight_T, model, steps.iterations - steps.screen,
             ridge)


def _solve_coordinates(key, slots_TxS, targets_TxD, weight_T, model, steps, ridge):
  """θ [D, P] and cost [D] of every coordinate; each coordinate draws its own starts, since
  shared starts would fail together."""
  keys_Dx2 = jax.random.split(key, targets_TxD.shape[1])
  return jax.vmap(lambda k, y_T: _best_of_starts(k, slots_TxS, y_T, weight_T, model, steps,
                                                 ridge),
                  in_axes=(0, 1))(keys_Dx2, targets_TxD)


def _linear_fit(slots_TxS, targets_TxD, weight_T, model, ridge):
  """θ [D, P] of the additive form, linear in θ: one least-squares solve (ridge as in
  `_levenberg_marquardt`) whose normal matrix all coordinates share."""
  theta_P = _init_theta(jax.random.PRNGKey(0), model)
  j_TxP = _rows(theta_P, slots_TxS, model)[1] * jnp.sqrt(weight_T)[:, None]
  ridge = _ridge(weight_T, model, ridge)
  rhs_PxD = j_TxP.T @ (targets_TxD * jnp.sqrt(weight_T)[:, None])
  return jnp.linalg.solve(j_TxP.T @ j_TxP + ridge * jnp.eye(theta_P.shape[0]), rhs_PxD).T


def _object_tables(values_TxKxC, ids_TxK, targets_TxD, weight_T, num_objects):
  """The least-squares fit of y = g_1[o_1] + … + g_K[o_K] over the training scenes: per
  position k and object u, g [K, U, D] and the scenes holding u at k [K, U].

  An object never seen at k keeps g = 0 and weight 0 (a ridge of 1e-6 of the largest count
  pins it; the positions' shared constant is the minimum-norm one)."""
  k = ids_TxK.shape[1]
  columns_TxK = jnp.arange(k)[None, :] * num_objects + ids_TxK
  w_T = weight_T.astype(jnp.float32)
  size = k * num_objects
  gram = jnp.zeros((size, size), jnp.float32).at[
      columns_TxK[:, :, None], columns_TxK[:, None, :]].add(w_T[:, None, None])
  rhs = jnp.zeros((size, targets_TxD.shape[1]), jnp.float32).at[columns_TxK].add(
      (w_T[:, None] * targets_TxD)[:, None, :])
  count = jnp.diagonal(gram)
  g = jnp.linalg.solve(gram + 1e-6 * count.max() * jnp.eye(size), rhs)
  return g.reshape(k, num_objects, -1), count.reshape(k, num_objects)


def solve(key, rows_T, weight_T, targets_TxD, values_NxKxC, ids_NxK, num_objects, model,
          steps, ridge):
  """Every coordinate of one model fitted by Levenberg–Marquardt on the schedule `steps`
  (`Steps`: starts, the steps all of them take, the cheapest one's steps in all) under a
  penalty of `ridge` times the mean curvature per value on ‖θ‖² (`_ridge`).

  rows_T: the training scenes among the N scenes (values_NxKxC, object ids ids_NxK < num_objects);
  weight_T: 1 on valid rows, 0 on padding; targets_TxD: their targets in the fit's units. The
  per-object families first fit every object at every position its own value
  (`_object_tables`, a linear least-squares problem shared by all coordinates), then each
  position's C-slot form to its objects' values, weighted by their scene counts; the others fit
  the scenes directly; `additive` is one linear least-squares solve.
  Returns θ [D, P] (`num_parameters`) and the share of coordinates whose predictions on all N
  scenes (per-object families: on every object at every position) the training scenes determine
  (`identified`).
  """
  n, k, c = values_NxKxC.shape
  slots_NxS = values_NxKxC.reshape(n, k * c)
  if model.family == "additive":
    theta_DxP = _linear_fit(slots_NxS[rows_T], targets_TxD, weight_T, model, ridge)
    # Linear: the Jacobian, so the answer, is the same for every coordinate.
    return theta_DxP, identified(theta_DxP[:1], slots_NxS[rows_T], weight_T, slots_NxS, model)
  if not LAYOUT[model.family][2]:
    theta_DxP = _solve_coordinates(key, slots_NxS[rows_T], targets_TxD, weight_T, model, steps,
                                   ridge)[0]
    return theta_DxP, identified(theta_DxP, slots_NxS[rows_T], weight_T, slots_NxS, model)
  g_KxUxD, count_KxU = _object_tables(values_NxKxC[rows_T], ids_NxK[rows_T], targets_TxD,
                                      weight_T, num_objects)
  values_UxC = jnp.zeros((num_objects, c), jnp.int32).at[ids_NxK].set(values_NxKxC)
  single = dataclasses.replace(model, max_objects=1)

  def position(key_2, g_UxD, w_U):
    theta_DxQ = _solve_coordinates(key_2, values_UxC, g_UxD, w_U, single, steps, ridge)[0]
    return theta_DxQ, identified(theta_DxQ, values_UxC, w_U, values_UxC, single)

  theta_KxDxQ, share_K = jax.vmap(position)(jax.random.split(key, k), g_KxUxD, count_KxU)
  # Slot k·C + c holds position k's table of concept c; the intercepts add up.
  half = (theta_KxDxQ.shape[-1] - 1) // 2
  a_DxH = jnp.moveaxis(theta_KxDxQ[..., 1:1 + half], 0, 1).reshape(theta_KxDxQ.shape[1], -1)
  b_DxH = jnp.moveaxis(theta_KxDxQ[..., 1 + half:], 0, 1).reshape(theta_KxDxQ.shape[1], -1)
  return (jnp.concatenate([theta_KxDxQ[..., 0].sum(0)[:, None], a_DxH, b_DxH], -1),
          share_K.mean())


def to_params(theta_DxP, model):
  """The family's parameters (`families.Approximator.init`'s tree) holding the coordinates' θ."""
  has_sum, has_product, _ = LAYOUT[model.family]
  d = theta_DxP.shape[0]
  half = (theta_DxP.shape[1] - 1) // 2
  shape = (d, model.num_slots, max(model.values_per_concept))
  a_SxVxD = jnp.moveaxis(theta_DxP[:, 1:1 + half].reshape(shape), 0, -1)
  b_SxVxD = jnp.moveaxis(theta_DxP[:, 1 + half:].reshape(shape), 0, -1)
  params = {"tables": b_SxVxD if has_product else a_SxVxD}
  if has_sum and has_product:
    params["sum_tables"] = a_SxVxD
  eye = jnp.eye(model.out_dim, dtype=jnp.float32)
  kernel = jnp.concatenate([eye, eye]) if model.family == "sum_product" else eye
  params["out"] = {"kernel": kernel, "bias": theta_DxP[:, 0]}
  return params


def identified(theta_DxP, slots_TxS, weight_T, slots_NxS, model):
  """Share of the coordinates whose predictions on all N scenes the training scenes determine.

  A coordinate is identified when no direction in the null space of its training Jacobian (the
  parameter changes that leave every training prediction unchanged, to first order) changes a
  prediction on the N scenes: the fit's predictions are then a point, not a set.
  """
  num_params = theta_DxP.shape[1]

  def one_coordinate(theta_P):
    train_TxP = _rows(theta_P, slots_TxS, model)[1] * jnp.sqrt(weight_T)[:, None]
    # Eigenvectors of JᵀJ, not an SVD of J: XLA:CPU's SVD of a tall J took ten times the solve.
    eigenvalues_P, vectors_PxP = jnp.linalg.eigh(train_TxP.T @ train_TxP)
    seen_PxP = vectors_PxP * (eigenvalues_P > NULL_TOLERANCE * eigenvalues_P[-1])
    projector_PxP = jnp.eye(num_params) - seen_PxP @ seen_PxP.T
    all_NxP = _rows(theta_P, slots_NxS, model)[1]
    leak = ((all_NxP @ projector_PxP) ** 2).sum()
    return leak <= LEAK_TOLERANCE * jnp.maximum((all_NxP ** 2).sum(), 1e-30)

  return jax.lax.map(one_coordinate, theta_DxP, batch_size=16).astype(jnp.float32).mean()
