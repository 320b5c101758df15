"""The layers of a tower (docs/models.md): a linear map, multi-head self-attention, the MLP and
the pre-norm block they make, with the original code's initialisers.

Each block's parameters are {"attn_norm", "attn": {"qkv", "out"}, "mlp_norm", "mlp": {"fc1",
"fc2"}}; the fused q/k/v projection is one kernel [d, 3d] (columns q | k | v, heads contiguous
inside each), i.e. the transpose of PyTorch's `in_proj_weight`.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bindjax.core import model_config

LAYER_NORM_EPS = 1e-5


def torch_linear_bias_init(fan_in):
  """PyTorch nn.Linear's default bias init, U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / math.sqrt(fan_in)

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)
  return init


_zeros = nn.initializers.zeros
XAVIER_UNIFORM = nn.initializers.xavier_uniform()


class Linear(nn.Module):
  """y = x·W (+ b) with W [in, out]; `start`/`stop` compute only that column slice of y."""
  in_features: int
  features: int
  kernel_init: Callable
  bias_init: Callable | None
  dtype: Any = jnp.float32

  def setup(self):
    self.kernel = self.param("kernel", self.kernel_init, (self.in_features, self.features))
    self.bias = (None if self.bias_init is None else
                 self.param("bias", self.bias_init, (self.features,)))

  def weights(self, start=0, stop=None):
    """(kernel [in, stop - start], bias or None) of the output columns start:stop."""
    if start == 0 and stop is None:
      return self.kernel, self.bias
    return self.kernel[:, start:stop], None if self.bias is None else self.bias[start:stop]

  def __call__(self, x_NxI, start=0, stop=None):
    lead = x_NxI.shape[:-1]
    kernel_IxO, bias_O = self.weights(start, stop)
    # A 2-D matmul: the weight gradient then contracts a plain [N, I] matrix (no activation
    # transposes in the backward pass).
    x_NxI = x_NxI.reshape(-1, x_NxI.shape[-1]).astype(self.dtype)
    kernel_IxO = kernel_IxO.astype(self.dtype)
    if bias_O is None:
      y = jnp.dot(x_NxI, kernel_IxO)
    else:
      y = jax.lax.platform_dependent(x_NxI, kernel_IxO, bias_O.astype(self.dtype),
                                     cpu=_dot_with_bias_row, default=_dot_then_bias)
    return y.reshape(*lead, y.shape[-1])


def _dot_then_bias(x_NxI, kernel_IxO, bias_O):
  return jnp.dot(x_NxI, kernel_IxO) + bias_O


def _dot_with_bias_row(x_NxI, kernel_IxO, bias_O):
  """x·W + b as one matmul, [x, 1]·[W; b]. The bias's gradient then comes out of the weight
  gradient's matmul; as a sum over rows of its own XLA:CPU runs it as a windowed reduction that
  took 5-15 % of a training step (experiments/benchmarks/step_profile.py). CPU only: elsewhere
  the odd contraction width could cost the matmul more than the sum."""
  ones_Nx1 = jnp.ones(x_NxI.shape[:-1] + (1,), x_NxI.dtype)
  return jnp.dot(jnp.concatenate([x_NxI, ones_Nx1], axis=-1),
                 jnp.concatenate([kernel_IxO, bias_O[None]], axis=0))


@jax.custom_vjp
def gelu(x):
  """Exact GELU, x·Φ(x), with a gradient that reuses Φ(x) from the forward pass. Φ comes from
  erf, which XLA:CPU evaluates more cheaply than the erfc of `jax.nn.gelu(x, approximate=False)`
  (equal to it within 1e-6 absolute on [-8, 8]); autodiff of that form evaluates erfc again."""
  return x * _normal_cdf(x)


def _normal_cdf(x):
  return (1 + jax.lax.erf(x * (1 / math.sqrt(2)))) / 2


def _gelu_forward(x):
  cdf = _normal_cdf(x)
  return x * cdf, (x, cdf)


def _gelu_backward(residuals, g):
  x, cdf = residuals
  return (g * (cdf + x * jnp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))),)


gelu.defvjp(_gelu_forward, _gelu_backward)


def layer_norm(name):
  """The towers' LayerNorm (float32, PyTorch's epsilon and two-pass variance)."""
  return nn.LayerNorm(epsilon=LAYER_NORM_EPS, use_fast_variance=False, dtype=jnp.float32,
                      name=name)


class SelfAttention(nn.Module):
  """Multi-head self-attention with one fused [d, 3d] q/k/v projection.

  `query_positions_BxQ` selects which rows produce outputs (all rows, or just the EOS row);
  keys/values always cover every position. Masks: padding keys, plus causal for "clip".
  With few output rows (the readout block), the key and value projections are folded into
  those rows instead of applied at every position: q·(W_k h + b_k) = (W_kᵀq)·h + q·b_k, where
  softmax ignores q·b_k (the same for every key), and Σ p (W_v h + b_v) = W_v (Σ p h) + b_v.
  Equal up to rounding; it removes the block's largest matmul, [B·L, d] × [d, 2d].
  """
  config: model_config.ModelConfig
  qkv_init: Callable
  out_init: Callable

  @nn.compact
  def __call__(self, h_BxLxD, key_valid_BxL, query_positions_BxQ=None):
    cfg = self.config
    d, num_heads, head_dim = cfg.d_model, cfg.num_heads, cfg.head_dim
    batch, length = h_BxLxD.shape[:2]
    qkv = Linear(d, 3 * d, self.qkv_init, _zeros, cfg.dtype, name="qkv")
    scale = head_dim ** -0.5
    if query_positions_BxQ is None:
      qkv_BxLx3D = qkv(h_BxLxD)
      q_BxQxD = qkv_BxLx3D[..., :d]
      kv_BxLx2xHxK = qkv_BxLx3D[..., d:].reshape(batch, length, 2, num_heads, head_dim)
      k_BxLxHxK, v_BxLxHxK = kv_BxLx2xHxK[:, :, 0], kv_BxLx2xHxK[:, :, 1]
      query_positions_BxQ = jnp.broadcast_to(jnp.arange(length), (batch, length))

      def scores(q_BxQxHxK):
        return jnp.einsum("bqhk,blhk->bhql", q_BxQxHxK, k_BxLxHxK,
                          preferred_element_type=jnp.float32) * scale

      def mix(probs_BxHxQxL):
        return jnp.einsum("bhql,blhk->bqhk", probs_BxHxQxL, v_BxLxHxK)
    else:
      h_BxQxD = jnp.take_along_axis(h_BxLxD, query_positions_BxQ[..., None], axis=1)
      q_BxQxD = qkv(h_BxQxD, 0, d)
      h_BxLxD = h_BxLxD.astype(cfg.dtype)
      wk_DxD, _ = qkv.weights(d, 2 * d)
      wv_DxD, bv_D = qkv.weights(2 * d, None)
      wk_DxHxK = wk_DxD.reshape(d, num_heads, head_dim).astype(cfg.dtype)
      wv_DxHxK = wv_DxD.reshape(d, num_heads, head_dim).astype(cfg.dtype)

      def scores(q_BxQxHxK):
        qk_BxQxHxD = jnp.einsum("bqhk,dhk->bqhd", q_BxQxHxK, wk_DxHxK)
        return jnp.einsum("bqhd,bld->bhql", qk_BxQxHxD, h_BxLxD,
                          preferred_element_type=jnp.float32) * scale

      def mix(probs_BxHxQxL):
        mixed_BxQxHxD = jnp.einsum("bhql,bld->bqhd", probs_BxHxQxL, h_BxLxD)
        return (jnp.einsum("bqhd,dhk->bqhk", mixed_BxQxHxD, wv_DxHxK) +
                bv_D.reshape(num_heads, head_dim).astype(cfg.dtype))
    num_queries = q_BxQxD.shape[1]
    scores_BxHxQxL = scores(q_BxQxD.reshape(batch, num_queries, num_heads, head_dim))
    allowed_BxQxL = jnp.broadcast_to(key_valid_BxL[:, None, :], (batch, num_queries, length))
    if cfg.variant == "clip":
      allowed_BxQxL = allowed_BxQxL & (jnp.arange(length)[None, None, :]
                                       <= query_positions_BxQ[:, :, None])
    # A finite minimum keeps a row with no allowed key finite (uniform) instead of NaN.
    scores_BxHxQxL = jnp.where(allowed_BxQxL[:, None], scores_BxHxQxL,
                               jnp.finfo(jnp.float32).min)
    probs_BxHxQxL = jax.nn.softmax(scores_BxHxQxL, axis=-1).astype(cfg.dtype)
    out_BxQxHxK = mix(probs_BxHxQxL)
    out_BxQxD = out_BxQxHxK.reshape(batch, num_queries, d)
    return Linear(d, d, self.out_init, _zeros, cfg.dtype, name="out")(out_BxQxD)


class Block(nn.Module):
  """Pre-norm block: x += MHA(LN(x)); x += MLP(LN(x)). With `readout_B`, returns only that row."""
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, x_BxLxD, key_valid_BxL, readout_B=None):
    cfg = self.config
    d = cfg.d_model
    if cfg.variant == "clip":
      attn_std = d ** -0.5
      proj_std = d ** -0.5 * (2 * cfg.num_layers) ** -0.5
      qkv_init = nn.initializers.normal(attn_std)
      out_init = nn.initializers.normal(proj_std)
      fc1_init = nn.initializers.normal((2 * d) ** -0.5)
      fc2_init = nn.initializers.normal(proj_std)
    else:
      qkv_init = out_init = fc1_init = fc2_init = XAVIER_UNIFORM

    query_positions_BxQ = None if readout_B is None else readout_B[:, None]
    h_BxLxD = layer_norm("attn_norm")(x_BxLxD)
    attn_BxQxD = SelfAttention(cfg, qkv_init, out_init, name="attn")(
        h_BxLxD, key_valid_BxL, query_positions_BxQ)
    if readout_B is not None:
      x_BxLxD = jnp.take_along_axis(x_BxLxD, query_positions_BxQ[..., None], axis=1)
    x_BxQxD = x_BxLxD + attn_BxQxD

    h_BxQxD = layer_norm("mlp_norm")(x_BxQxD)
    h_BxQxF = MLP(cfg, fc1_init, fc2_init, name="mlp")(h_BxQxD)
    x_BxQxD = x_BxQxD + h_BxQxF
    return x_BxQxD if readout_B is None else x_BxQxD[:, 0]


class MLP(nn.Module):
  config: model_config.ModelConfig
  fc1_init: Callable
  fc2_init: Callable

  @nn.compact
  def __call__(self, h_NxD):
    cfg = self.config
    d, width = cfg.d_model, cfg.mlp_width
    h_NxF = Linear(d, width, self.fc1_init, torch_linear_bias_init(d), cfg.dtype, name="fc1")(h_NxD)
    if cfg.variant == "clip":
      h_NxF = h_NxF * jax.nn.sigmoid(1.702 * h_NxF)  # QuickGELU
    else:
      h_NxF = gelu(h_NxF)
    return Linear(width, d, self.fc2_init, torch_linear_bias_init(width), cfg.dtype,
                  name="fc2")(h_NxF)
