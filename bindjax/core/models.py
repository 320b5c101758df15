"""Scene and query towers and the dual encoder (docs/models.md, docs/objectives.md#similarity),
in Flax linen. The settings are `model_config.ModelConfig`; the blocks are `layers`'.

Two tower variants share one module:
  "pre_ln" (default): token embedding + fixed sinusoidal positions, pre-norm blocks with padding
      keys masked, exact GELU, feed-forward width `d_ff`, no final norm, EOS read-out, linear
      projection with bias. Xavier-uniform on every matrix; zero attention biases; the other
      biases use PyTorch's nn.Linear default U(±1/sqrt(fan_in)), as in the original code.
  "clip": learned positions, causal mask (padding keys masked too, which cannot change the EOS
      row), QuickGELU, 4·d_model MLP, final LayerNorm, bias-free projection, CLIP's init; read
      out at EOS (the original read position #PAD − 1 here, a quirk bindjax does not copy).

Parameters per tower: {"embed": {"embedding"}, ["pos_embedding"], blocks, ["final_norm"],
"proj"}, each block {"attn_norm", "attn": {"qkv", "out"}, "mlp_norm", "mlp": {"fc1", "fc2"}}.
The blocks are "blocks" (the first num_layers - 1, one scanned layer: every leaf stacked on a
leading layer axis; absent with one layer) and "last_block", so compiling costs about the same
at any depth. `ModelConfig.scan_layers=False` builds the per-layer layout "block_0" …
"block_{N-1}" instead, which checkpoints and the PyTorch import use; `stack_blocks` and
`unstack_blocks` convert. The fused q/k/v projection is one kernel [d, 3d] (columns q | k | v,
heads contiguous inside each), i.e. the transpose of PyTorch's `in_proj_weight`.

Speed: the last block only needs the EOS row, so it computes keys/values for every position but
queries, attention output and MLP for that row alone (same numbers, ~12% fewer FLOPs at L=9).
"""
from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bindjax.core import layers
from bindjax.core import model_config

NORM_EPS = 1e-6  # ẑ = z / (NORM_EPS + ‖z‖)
SCANNED_BLOCKS, LAST_BLOCK = "blocks", "last_block"  # a tower's blocks when scanned


# ---------------------------------------------------------------------------------------------
# Tower inputs


def sinusoidal_positions(length, d_model) -> np.ndarray:
  """pe[p, 2i] = sin(p·10000^(-2i/d)), pe[p, 2i+1] = cos(p·10000^(-2i/d)); float32 [L, d]."""
  position_Lx1 = np.arange(length, dtype=np.float64)[:, None]
  inv_freq_H = np.power(10000.0, -np.arange(0, d_model, 2, dtype=np.float64) / d_model)
  pe_LxD = np.zeros((length, d_model), np.float64)
  pe_LxD[:, 0::2] = np.sin(position_Lx1 * inv_freq_H)
  pe_LxD[:, 1::2] = np.cos(position_Lx1 * inv_freq_H)
  return pe_LxD.astype(np.float32)


def eos_positions(tokens_BxL, pad_token):
  """Index of the last non-PAD token of each row (0 for an all-PAD row)."""
  positions_L = jnp.arange(tokens_BxL.shape[-1], dtype=jnp.int32)
  return jnp.max(jnp.where(tokens_BxL != pad_token, positions_L, 0), axis=-1)


class Tower(nn.Module):
  """tokens_BxL (int) -> z_BxO: the encoder read out at the EOS (last non-PAD) position.

  `max_length` sizes the learned positions of the "clip" variant (inputs may be shorter);
  the sinusoidal positions of "pre_ln" take any length.
  """
  config: model_config.ModelConfig
  out_features: int
  max_length: int
  product_readout: bool = False

  @nn.compact
  def __call__(self, tokens_BxL):
    cfg = self.config
    d = cfg.d_model
    if tokens_BxL.ndim != 2:
      raise ValueError(f"Tower expects tokens [batch, length], got shape {tokens_BxL.shape}")
    length = tokens_BxL.shape[1]
    clip = cfg.variant == "clip"
    if clip and length > self.max_length:
      raise ValueError(f"Tower: token length {length} exceeds max_length={self.max_length} "
                       "(the number of learned positions of the clip variant)")

    embed_init = nn.initializers.normal(0.02) if clip else layers.XAVIER_UNIFORM
    x_BxLxD = nn.Embed(cfg.vocab_size, d, embedding_init=embed_init, name="embed")(tokens_BxL)
    if clip:
      positions_LxD = self.param("pos_embedding", nn.initializers.normal(0.01),
                                 (self.max_length, d))[:length]
    else:
      positions_LxD = jnp.asarray(sinusoidal_positions(length, d))
    x_BxLxD = x_BxLxD + positions_LxD[None]

    key_valid_BxL = tokens_BxL != cfg.pad_token
    eos_B = eos_positions(tokens_BxL, cfg.pad_token)
    x_BxLxD = self._first_blocks(x_BxLxD, key_valid_BxL)
    product_BxD = (ObjectProduct(cfg, name="product")(x_BxLxD, tokens_BxL)
                   if self.product_readout else None)
    last_name = LAST_BLOCK if cfg.scan_layers else f"block_{cfg.num_layers - 1}"
    x_BxD = layers.Block(cfg, name=last_name)(x_BxLxD, key_valid_BxL, eos_B)
    if clip:
      x_BxD = layers.layer_norm("final_norm")(x_BxD)
      proj = layers.Linear(d, self.out_features, nn.initializers.normal(d ** -0.5), None,
                           cfg.dtype, name="proj")
    else:
      proj = layers.Linear(d, self.out_features, layers.XAVIER_UNIFORM,
                           layers.torch_linear_bias_init(d), cfg.dtype, name="proj")
    if product_BxD is not None:
      x_BxD = x_BxD + product_BxD
    return proj(x_BxD).astype(jnp.float32)

  def _first_blocks(self, x_BxLxD, key_valid_BxL):
    """The num_layers - 1 full blocks before the read-out block (one scanned layer or a loop)."""
    cfg = self.config
    num_full = cfg.num_layers - 1
    if not cfg.scan_layers:
      for i in range(num_full):
        x_BxLxD = layers.Block(cfg, name=f"block_{i}")(x_BxLxD, key_valid_BxL)
      return x_BxLxD
    if not num_full:
      return x_BxLxD
    scanned = nn.scan(_scan_step, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=nn.broadcast, length=num_full)
    x_BxLxD, _ = scanned(layers.Block(cfg, name=SCANNED_BLOCKS), x_BxLxD, key_valid_BxL)
    return x_BxLxD


def _scan_step(block, x_BxLxD, key_valid_BxL):
  return block(x_BxLxD, key_valid_BxL), None


class ObjectProduct(nn.Module):
  """Σ over the objects of a sequence of Π over concepts of a per-concept code: [B, d_model].

  The explicit multiplicative interaction of `ModelConfig.product_readout`
  (docs/models.md#product-read-out). Objects sit at fixed positions of bindjax.core.world's layout
  (object k: SOO at k·(C+2), concept c at k·(C+2)+1+c); an object is present when its SOO
  token is. Concept c's code is W_c·LN(h) at its token, h being the hidden states that enter
  the last block (the embeddings when there is one block); the sum of products is added to the
  EOS row before the output projection. Sequences without objects (concept queries) get 0.
  """
  config: model_config.ModelConfig

  @nn.compact
  def __call__(self, h_BxLxD, tokens_BxL):
    cfg = self.config
    c, d = cfg.num_concepts, cfg.d_model
    stride = c + 2
    num_objects = (tokens_BxL.shape[1] - 1) // stride
    starts_K = np.arange(num_objects) * stride
    present_BxK = tokens_BxL[:, starts_K] == cfg.soo_token
    positions_KxC = starts_K[:, None] + 1 + np.arange(c)[None, :]
    h_BxKxCxD = layers.layer_norm("norm")(h_BxLxD[:, positions_KxC.reshape(-1)]).reshape(
        h_BxLxD.shape[0], num_objects, c, d)
    codes_CxDxD = self.param("codes", layers.XAVIER_UNIFORM, (c, d, d))
    codes_BxKxCxD = jnp.einsum("bkcd,cde->bkce", h_BxKxCxD.astype(cfg.dtype),
                               codes_CxDxD.astype(cfg.dtype))
    product_BxKxD = jnp.prod(codes_BxKxCxD.astype(jnp.float32), axis=2)
    return jnp.einsum("bkd,bk->bd", product_BxKxD, present_BxK.astype(jnp.float32))


class DualEncoder(nn.Module):
  """Scene tower, query tower and temperature τ. Params: {"scene_tower", "query_tower", "tau"}.

  τ exists for both similarities (so every parameter tree has the same keys) but only cosine
  uses it. Use `model.apply({"params": params}, tokens, method=DualEncoder.encode_scenes)`.
  """
  config: model_config.ModelConfig

  def setup(self):
    cfg = self.config
    self.scene_tower = Tower(cfg, cfg.d_out, cfg.scene_length,
                             cfg.has_product_readout("scene"))
    self.query_tower = Tower(cfg, cfg.query_out_features, cfg.query_length,
                             cfg.has_product_readout("query"))
    self.tau = self.param("tau", nn.initializers.constant(cfg.tau_init), (), jnp.float32)

  def __call__(self, scene_tokens_BxL, query_tokens_QxL):
    """(z_BxD, q_QxD'): both towers; use for `init`."""
    return self.encode_scenes(scene_tokens_BxL), self.encode_queries(query_tokens_QxL)

  def encode_scenes(self, scene_tokens_BxL):
    return self.scene_tower(scene_tokens_BxL)

  def encode_queries(self, query_tokens_QxL):
    """q_QxD (D = d_out, or d_out + 1 with the per-query bias last for "dot")."""
    return self.query_tower(query_tokens_QxL)

  def logits(self, z_BxD, q_QxD, cap):
    """Scene-by-query logits [B, Q]. `cap` bounds exp(τ) for cosine (ignored for dot)."""
    return similarity_logits(self.config, self.tau, z_BxD, q_QxD, cap)


def similarity_logits(config, tau, z_BxD, q_QxD, cap):
  """Cosine (docs/objectives.md#similarity): min(exp τ, cap)·ẑ·q̂ᵀ, or dot
  z·q[:, :-1]ᵀ + q[:, -1]."""
  z_BxD = z_BxD.astype(jnp.float32)
  q_QxD = q_QxD.astype(jnp.float32)
  if config.similarity == "dot":
    return z_BxD @ q_QxD[:, :-1].T + q_QxD[None, :, -1]
  z_BxD = z_BxD / (NORM_EPS + jnp.linalg.norm(z_BxD, axis=-1, keepdims=True))
  q_QxD = q_QxD / (NORM_EPS + jnp.linalg.norm(q_QxD, axis=-1, keepdims=True))
  scale = jnp.minimum(jnp.exp(tau), cap)
  return scale * (z_BxD @ q_QxD.T)


def paired_logits(config, tau, z_BxD, q_BxNxD, cap):
  """Logits [B, N] of each scene against its own N queries (same similarity as above)."""
  z_BxD = z_BxD.astype(jnp.float32)
  q_BxNxD = q_BxNxD.astype(jnp.float32)
  if config.similarity == "dot":
    return jnp.einsum("bd,bnd->bn", z_BxD, q_BxNxD[..., :-1]) + q_BxNxD[..., -1]
  z_BxD = z_BxD / (NORM_EPS + jnp.linalg.norm(z_BxD, axis=-1, keepdims=True))
  q_BxNxD = q_BxNxD / (NORM_EPS + jnp.linalg.norm(q_BxNxD, axis=-1, keepdims=True))
  return jnp.minimum(jnp.exp(tau), cap) * jnp.einsum("bd,bnd->bn", z_BxD, q_BxNxD)


@functools.partial(jax.jit, static_argnums=1)
def init_params(key, config: model_config.ModelConfig):
  """Fresh DualEncoder parameters {"scene_tower", "query_tower", "tau"} (no "params" wrapper).

  Drawn in the per-layer layout and stacked, so a seed gives the same initial weights in either
  layout (nn.scan would draw each layer from its own split of the key)."""
  scene_1xL = jnp.zeros((1, config.scene_length), jnp.int32)
  query_1xL = jnp.zeros((1, config.query_length), jnp.int32)
  per_layer = dataclasses.replace(config, scan_layers=False)
  params = DualEncoder(per_layer).init(key, scene_1xL, query_1xL)["params"]
  return stack_blocks(params) if config.scan_layers else params


def _is_per_layer_tower(tree):
  return isinstance(tree, dict) and "block_0" in tree


def _is_scanned_tower(tree):
  return isinstance(tree, dict) and LAST_BLOCK in tree


def _stack_tower(tower):
  num_layers = sum(1 for name in tower if name.startswith("block_"))
  blocks = [tower[f"block_{i}"] for i in range(num_layers)]
  out = {k: v for k, v in tower.items() if not k.startswith("block_")}
  out[LAST_BLOCK] = blocks[-1]
  if num_layers > 1:
    out[SCANNED_BLOCKS] = jax.tree.map(lambda *layers: jnp.stack(layers), *blocks[:-1])
  return out


def _unstack_tower(tower):
  out = {k: v for k, v in tower.items() if k not in (SCANNED_BLOCKS, LAST_BLOCK)}
  stacked = tower.get(SCANNED_BLOCKS, {})
  num_full = jax.tree.leaves(stacked)[0].shape[0] if stacked else 0
  for i in range(num_full):
    out[f"block_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  out[f"block_{num_full}"] = tower[LAST_BLOCK]
  return out


def stack_blocks(tree):
  """`tree` with every tower's parameters in the per-layer layout turned into the scanned one.

  `tree` is anything holding tower parameter dicts: a Tower's or DualEncoder's parameters, an
  optimizer state, a train state (`jax.vmap` it over leading replica axes). Towers already in
  the scanned layout are left as they are.
  """
  return jax.tree.map(lambda t: _stack_tower(t) if _is_per_layer_tower(t) else t, tree,
                      is_leaf=_is_per_layer_tower)


def unstack_blocks(tree):
  """The inverse of `stack_blocks`: every tower of `tree` in the per-layer layout."""
  return jax.tree.map(lambda t: _unstack_tower(t) if _is_scanned_tower(t) else t, tree,
                      is_leaf=_is_scanned_tower)


def count_parameters(params) -> int:
  """Total number of scalars in a parameter tree (arrays or ShapeDtypeStructs)."""
  return int(sum(np.prod(x.shape, dtype=np.int64) for x in jax.tree.leaves(params)))


def tower_activation_floats(config: model_config.ModelConfig, num_sequences, length) -> int:
  """Float32 activations one tower's backward pass keeps for num_sequences sequences of `length`
  (a rough count, for automatic chunking): per block the attention scores, q/k/v, MLP hidden,
  norms and residuals."""
  per_block = length * (12 * config.d_model + 3 * config.mlp_width
                        + 2 * config.num_heads * length)
  return num_sequences * per_block * config.num_layers


def tower_flops(config: model_config.ModelConfig, num_sequences, length, out_features=None,
                tower=None) -> int:
  """Forward FLOPs (2·multiply-adds) of the matmuls one tower executes, attention included.

  Counts what this implementation runs: the last block computes only the EOS row, with the key
  and value projections folded into it (`SelfAttention`), so its attention costs 4·d² for the
  projections plus 2·heads·length·d for scores and mixing. tower ("scene" or "query") adds the
  product read-out's per-concept codes when that tower has one (`ObjectProduct`: a d×d matmul
  per concept token of each object slot). A training step costs about 3x the forward.
  """
  d, w, heads = config.d_model, config.mlp_width, config.num_heads
  out_features = config.d_out if out_features is None else out_features
  full_block = length * (3 * d * d + 2 * length * d + d * d + 2 * d * w)
  last_block = 4 * d * d + 2 * heads * length * d + d * d + 2 * d * w
  per_sequence = (config.num_layers - 1) * full_block + last_block + d * out_features
  if tower is not None and config.has_product_readout(tower):
    num_objects = (length - 1) // (config.num_concepts + 2)
    per_sequence += num_objects * config.num_concepts * d * d
  return int(2 * num_sequences * per_sequence)
