"""Towers and dual encoder (docs/models.md): shapes, init, masks, read-out, similarities, errors."""
import dataclasses
import functools
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bindjax.core import layers
from bindjax.core import model_config
from bindjax.core import models
from bindjax.core import world
from bindjax.runtime import xla_options

# Tiny programs whose compile is most of their cost: XLA's cheaper CPU compile options.
jit = functools.partial(
    jax.jit, compiler_options=xla_options.compiler_options("cpu", fast_compile=True))

# Tiny world: C=2, V=4 -> concept tokens 0..7, SOO 8, EOO 9, EOS 10, PAD 11; K=2.
SOO, EOO, EOS, PAD = 8, 9, 10, 11
TINY = model_config.ModelConfig(vocab_size=12, pad_token=PAD, scene_length=9, query_length=5,
                                d_model=64, num_heads=4, num_layers=2, d_ff=128, d_out=8)
D = TINY.d_model
SCENES = np.array([[SOO, 0, 4, EOO, EOS, PAD, PAD, PAD, PAD],
                   [SOO, 1, 5, EOO, SOO, 2, 7, EOO, EOS],
                   [SOO, 3, 6, EOO, SOO, 3, 6, EOO, EOS]], np.int32)
QUERIES = np.array([[0, EOS, PAD, PAD, PAD], [5, EOS, PAD, PAD, PAD],
                    [SOO, 1, 5, EOO, EOS], [SOO, 3, 4, EOO, EOS]], np.int32)


CLIP = dataclasses.replace(TINY, variant="clip", scene_length=12)
DOT = dataclasses.replace(TINY, similarity="dot")


@functools.cache
def _params(config):
  return models.init_params(jax.random.key(0), config)


@functools.partial(jit, static_argnums=(0, 3))
def _encode(config, params, tokens, method="encode_scenes"):
  model = models.DualEncoder(config)
  return model.apply({"params": params}, tokens, method=getattr(models.DualEncoder, method))


def _logits(config, params, z, q, cap):
  model = models.DualEncoder(config)
  return model.apply({"params": params}, z, q, cap, method=models.DualEncoder.logits)


def test_parameter_count_published_config():
  config = model_config.ModelConfig(vocab_size=44, pad_token=43, scene_length=9, query_length=5)
  shapes = jax.eval_shape(lambda k: models.init_params(k, config), jax.random.key(0))
  assert models.count_parameters(shapes["scene_tower"]) == 7_918_144
  assert models.count_parameters(shapes["query_tower"]) == 7_918_144
  assert shapes["tau"].shape == ()
  dot = dataclasses.replace(config, similarity="dot")
  shapes = jax.eval_shape(lambda k: models.init_params(k, dot), jax.random.key(0))
  assert models.count_parameters(shapes["query_tower"]) == 7_918_144 + 256 + 1


def test_for_space_reads_the_space():
  space = types.SimpleNamespace(vocab_size=44, pad_token=43, scene_length=9, query_length=5)
  config = model_config.ModelConfig.for_space(space, d_model=32, similarity="dot")
  assert (config.vocab_size, config.pad_token, config.scene_length, config.query_length) == (
      44, 43, 9, 5)
  assert config.d_model == 32 and config.similarity == "dot"
  assert hash(config) == hash(model_config.ModelConfig.for_space(space, d_model=32,
                                                                 similarity="dot"))


@pytest.mark.parametrize("overrides, message", [
    (dict(num_heads=3), "num_heads=3: expected a divisor of d_model=64"),
    (dict(d_out=0), "d_out=0"),
    (dict(variant="post_ln"), "variant='post_ln'"),
    (dict(similarity="l2"), "similarity='l2'"),
    (dict(compute_dtype="float16"), "compute_dtype='float16'"),
    (dict(pad_token=12), "pad_token=12"),
    (dict(num_layers=0), "num_layers=0"),
    (dict(d_model=2.5), "d_model=2.5"),
    (dict(num_heads=True), "num_heads=True"),
    (dict(d_model=15, num_heads=1), "d_model=15: the sinusoidal positions"),
    (dict(train_logit_cap=0.0), "train_logit_cap=0.0"),
    (dict(tau_init=float("nan")), "tau_init=nan"),
])
def test_invalid_configs_raise_before_compiling(overrides, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    dataclasses.replace(TINY, **overrides)


def test_odd_width_is_fine_for_clip():
  model_config.ModelConfig(**{**dataclasses.asdict(TINY), "d_model": 15, "num_heads": 3,
                              "variant": "clip"})


def _check_uniform(x, limit):
  x = np.asarray(x)
  assert np.abs(x).max() <= limit
  np.testing.assert_allclose(x.std(), limit / math.sqrt(3), rtol=0.05)
  assert abs(x.mean()) < 0.05 * limit


def test_pre_ln_init_statistics():
  tower = _params(TINY)["scene_tower"]
  d, f = D, TINY.d_ff
  xavier = lambda fan_in, fan_out: math.sqrt(6 / (fan_in + fan_out))
  _check_uniform(tower["embed"]["embedding"], xavier(TINY.vocab_size, d))
  block = models.unstack_blocks(tower)["block_0"]
  assert block["attn"]["qkv"]["kernel"].shape == (d, 3 * d)
  # One Xavier matrix over [3d, d], not three [d, d] ones.
  _check_uniform(block["attn"]["qkv"]["kernel"], xavier(d, 3 * d))
  _check_uniform(block["attn"]["out"]["kernel"], xavier(d, d))
  _check_uniform(block["mlp"]["fc1"]["kernel"], xavier(d, f))
  _check_uniform(block["mlp"]["fc2"]["kernel"], xavier(f, d))
  _check_uniform(tower["proj"]["kernel"], xavier(d, TINY.d_out))
  np.testing.assert_array_equal(block["attn"]["qkv"]["bias"], 0.0)
  np.testing.assert_array_equal(block["attn"]["out"]["bias"], 0.0)
  np.testing.assert_array_equal(block["attn_norm"]["scale"], 1.0)
  np.testing.assert_array_equal(block["mlp_norm"]["bias"], 0.0)
  # Other biases: PyTorch's Linear default U(±1/sqrt(fan_in)).
  assert np.abs(block["mlp"]["fc1"]["bias"]).max() <= 1 / math.sqrt(d)
  assert np.abs(block["mlp"]["fc2"]["bias"]).max() <= 1 / math.sqrt(f)
  assert np.abs(block["mlp"]["fc2"]["bias"]).max() > 0.5 / math.sqrt(f)
  assert "pos_embedding" not in tower and "final_norm" not in tower


def test_clip_init_statistics():
  tower = _params(CLIP)["scene_tower"]
  d, n = D, CLIP.num_layers
  std = lambda x: float(np.asarray(x).std())
  assert std(tower["embed"]["embedding"]) == pytest.approx(0.02, rel=0.1)
  assert tower["pos_embedding"].shape == (12, d)
  assert std(tower["pos_embedding"]) == pytest.approx(0.01, rel=0.2)
  block = tower["last_block"]
  assert std(block["attn"]["qkv"]["kernel"]) == pytest.approx(d ** -0.5, rel=0.05)
  assert std(block["attn"]["out"]["kernel"]) == pytest.approx(d ** -0.5 * (2 * n) ** -0.5,
                                                              rel=0.05)
  assert block["mlp"]["fc1"]["kernel"].shape == (d, 4 * d)
  assert std(block["mlp"]["fc1"]["kernel"]) == pytest.approx((2 * d) ** -0.5, rel=0.05)
  assert std(block["mlp"]["fc2"]["kernel"]) == pytest.approx(d ** -0.5 * (2 * n) ** -0.5,
                                                             rel=0.05)
  assert std(tower["proj"]["kernel"]) == pytest.approx(d ** -0.5, rel=0.1)
  assert "bias" not in tower["proj"]
  np.testing.assert_array_equal(tower["final_norm"]["scale"], 1.0)


def test_sinusoidal_positions():
  pe = models.sinusoidal_positions(7, 6)
  p, i = 5, 2
  assert pe[p, 2 * i] == pytest.approx(math.sin(p * 10000 ** (-2 * i / 6)))
  assert pe[p, 2 * i + 1] == pytest.approx(math.cos(p * 10000 ** (-2 * i / 6)))
  np.testing.assert_array_equal(pe[0, 1::2], 1.0)


def test_eos_positions():
  np.testing.assert_array_equal(models.eos_positions(jnp.asarray(SCENES), PAD), [4, 8, 8])


@pytest.mark.parametrize("config", [TINY, CLIP], ids=["pre_ln", "clip"])
def test_output_ignores_padding(config):
  params = _params(config)
  z = _encode(config, params, SCENES)
  # Longer padding: same read-out.
  longer = np.concatenate([SCENES, np.full((3, 3), PAD, np.int32)], axis=1)
  np.testing.assert_allclose(_encode(config, params, longer), z, atol=1e-5)
  # The PAD embedding never reaches the output (padding keys are masked) ...
  # (a random shift: a constant one would vanish in the LayerNorms)
  shift = jax.random.normal(jax.random.key(30), (D,))
  embedding = params["scene_tower"]["embed"]["embedding"]
  moved = jax.tree.map(lambda x: x, params)
  moved["scene_tower"]["embed"]["embedding"] = embedding.at[PAD].add(shift)
  np.testing.assert_allclose(_encode(config, moved, SCENES), z, atol=1e-5)
  # ... while a real token's embedding does.
  moved["scene_tower"]["embed"]["embedding"] = embedding.at[EOS].add(shift)
  assert not np.allclose(_encode(config, moved, SCENES), z, atol=1e-3)


@pytest.mark.parametrize("variant, causal", [("clip", True), ("pre_ln", False)])
def test_causal_mask_only_in_clip_and_readout_row(variant, causal):
  config = dataclasses.replace(TINY, variant=variant)
  block = layers.Block(config)
  x = jax.random.normal(jax.random.key(5), (3, 9, D))
  valid = jnp.ones((3, 9), bool)
  params = jit(block.init)(jax.random.key(6), x, valid)
  apply = jit(block.apply)
  y = apply(params, x, valid)
  shift = jax.random.normal(jax.random.key(31), (D,))  # not constant: LayerNorm removes that
  y_changed = apply(params, x.at[:, 4:].add(shift), valid)
  assert np.allclose(y[:, :4], y_changed[:, :4], atol=1e-6) == causal
  assert not np.allclose(y[:, 4:], y_changed[:, 4:], atol=1e-3)
  # The read-out block (queries and MLP for one row only, key and value projections folded
  # into that row) equals that row of the full block, with padding keys masked and non-zero
  # q/k/v biases (the key bias drops out of the read-out's softmax).
  qkv = params["params"]["attn"]["qkv"]
  qkv["bias"] = jax.random.normal(jax.random.key(7), qkv["bias"].shape)
  valid = jnp.asarray(SCENES != PAD)
  eos = models.eos_positions(jnp.asarray(SCENES), PAD)
  full = apply(params, x, valid)
  np.testing.assert_allclose(apply(params, x, valid, eos), full[jnp.arange(3), eos],
                             atol=1e-5)


def test_dual_encoder_shapes_and_cosine_logits():
  params = _params(TINY)
  assert set(params) == {"scene_tower", "query_tower", "tau"}
  assert float(params["tau"]) == pytest.approx(1.15)
  z = _encode(TINY, params, SCENES)
  q = _encode(TINY, params, QUERIES, "encode_queries")
  assert z.shape == (3, 8) and q.shape == (4, 8) and z.dtype == jnp.float32
  logits = _logits(TINY, params, z, q, 10.0)
  zn = np.asarray(z) / (1e-6 + np.linalg.norm(z, axis=-1, keepdims=True))
  qn = np.asarray(q) / (1e-6 + np.linalg.norm(q, axis=-1, keepdims=True))
  np.testing.assert_allclose(logits, math.exp(1.15) * zn @ qn.T, rtol=1e-5, atol=1e-6)
  # __call__ gives both towers.
  z2, q2 = jit(models.DualEncoder(TINY).apply)({"params": params}, SCENES, QUERIES)
  np.testing.assert_allclose(z2, z, atol=1e-5)
  np.testing.assert_allclose(q2, q, atol=1e-5)


def test_tau_cap():
  params = {**_params(TINY), "tau": jnp.float32(math.log(50.0))}
  z = jnp.array([[1.0, 0, 0, 0, 0, 0, 0, 0]])
  q = jnp.array([[2.0, 0, 0, 0, 0, 0, 0, 0], [0, 3.0, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_allclose(_logits(TINY, params, z, q, TINY.train_logit_cap), [[10.0, 0.0]],
                             rtol=1e-5)
  np.testing.assert_allclose(_logits(TINY, params, z, q, TINY.eval_logit_cap), [[50.0, 0.0]],
                             rtol=1e-5)


def test_dot_similarity_uses_last_query_feature_as_bias():
  params = _params(DOT)
  q = _encode(DOT, params, QUERIES, "encode_queries")
  z = jax.random.normal(jax.random.key(32), (3, 8))
  assert q.shape == (4, 9) and params["scene_tower"]["proj"]["kernel"].shape == (D, 8)
  np.testing.assert_allclose(_logits(DOT, params, z, q, 10.0),
                             np.asarray(z) @ np.asarray(q)[:, :8].T + np.asarray(q)[:, 8],
                             rtol=1e-5, atol=1e-6)


def test_jit_vmap_over_replicas_and_gradients():
  one = _params(TINY)
  other = jax.tree.map(lambda x: x * 0.5, one)
  params_R = jax.tree.map(lambda a, b: jnp.stack([a, b]), other, one)
  model = models.DualEncoder(TINY)

  def loss(params):
    z, q = model.apply({"params": params}, SCENES, QUERIES)
    return model.apply({"params": params}, z, q, 10.0, method=models.DualEncoder.logits).sum()

  grads_R = jit(jax.vmap(jax.grad(loss)))(params_R)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads_R))
  assert float(jnp.abs(grads_R["tau"]).min()) > 0
  kernel_R = grads_R["scene_tower"]["blocks"]["attn"]["qkv"]["kernel"]
  assert kernel_R.shape == (2, TINY.num_layers - 1, D, 3 * D)
  assert not np.allclose(kernel_R[0], kernel_R[1])


PRODUCT = model_config.ModelConfig.for_space(world.ObjectSpace.uniform(2, 4, 2), d_model=16,
                                             num_heads=2, num_layers=3, d_ff=32, d_out=8,
                                             product_readout="both")


@pytest.mark.parametrize("config", [
    dataclasses.replace(TINY, num_layers=3), dataclasses.replace(CLIP, num_layers=3), PRODUCT,
    dataclasses.replace(DOT, num_layers=1)], ids=["pre_ln", "clip", "product", "one_layer"])
def test_scanned_towers_match_per_layer_towers(config):
  """The scanned blocks compute what the per-layer loop does: same outputs and gradients for
  per-layer parameters moved to the scanned layout."""
  per_layer = dataclasses.replace(config, scan_layers=False)
  params = models.init_params(jax.random.key(3), per_layer)
  assert "block_0" in params["scene_tower"] and "blocks" not in params["scene_tower"]
  stacked = models.stack_blocks(params)

  def loss(config, params):
    model = models.DualEncoder(config)
    z, q = model.apply({"params": params}, SCENES, QUERIES)
    logits = model.apply({"params": params}, z, q, 10.0, method=models.DualEncoder.logits)
    return jnp.sum(jnp.sin(logits)), (z, q)

  (value, outputs), grads = jit(jax.value_and_grad(loss, argnums=1, has_aux=True),
                                    static_argnums=0)(per_layer, params)
  (value_s, outputs_s), grads_s = jit(jax.value_and_grad(loss, argnums=1, has_aux=True),
                                          static_argnums=0)(config, stacked)
  np.testing.assert_allclose(value_s, value, rtol=1e-5)
  for a, b in zip(outputs_s, outputs):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # Scanned and looped blocks sum in other orders, so an element that is a near-cancellation
  # of larger terms differs by float32 rounding of those terms: the tolerance scales with each
  # leaf's largest gradient (a wrong layer or weight would be off by that scale itself).
  def close(a, b):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max()))

  jax.tree.map(close, grads_s, models.stack_blocks(grads))


def test_block_layouts_convert_both_ways():
  config = dataclasses.replace(TINY, num_layers=3)
  params = _params(config)
  tower = params["scene_tower"]
  assert sorted(tower) == ["blocks", "embed", "last_block", "proj"]
  assert tower["blocks"]["attn"]["qkv"]["kernel"].shape == (2, D, 3 * D)
  per_layer = models.unstack_blocks(params)
  assert sorted(per_layer["query_tower"]) == ["block_0", "block_1", "block_2", "embed", "proj"]
  np.testing.assert_array_equal(per_layer["scene_tower"]["block_1"]["mlp"]["fc1"]["kernel"],
                                tower["blocks"]["mlp"]["fc1"]["kernel"][1])
  jax.tree.map(np.testing.assert_array_equal, models.stack_blocks(per_layer), params)
  # Each conversion leaves towers already in its target layout alone (so it can be applied to
  # any tree, an optimizer state included).
  jax.tree.map(np.testing.assert_array_equal, models.stack_blocks(params), params)
  shapes = jax.eval_shape(lambda k: models.init_params(
      k, dataclasses.replace(config, scan_layers=False)), jax.random.key(0))
  assert jax.tree.map(lambda x: x.shape, per_layer) == jax.tree.map(lambda x: x.shape, shapes)
  # A seed draws the same initial weights in either layout.
  jax.tree.map(np.testing.assert_array_equal, models.init_params(jax.random.key(5), config),
               models.stack_blocks(models.init_params(
                   jax.random.key(5), dataclasses.replace(config, scan_layers=False))))
  one = _params(dataclasses.replace(TINY, num_layers=1))["scene_tower"]
  assert "blocks" not in one and "block_0" in models.unstack_blocks(one)
  with pytest.raises(ValueError, match="scan_layers=1"):
    dataclasses.replace(TINY, scan_layers=1)


def test_bfloat16_compute_keeps_float32_params_and_outputs():
  config = dataclasses.replace(TINY, compute_dtype="bfloat16")
  params = _params(TINY)
  z = _encode(config, params, SCENES)
  assert z.dtype == jnp.float32
  np.testing.assert_allclose(z, _encode(TINY, params, SCENES), atol=0.1, rtol=0.05)


def test_too_long_input_is_rejected():
  with pytest.raises(ValueError, match="exceeds max_length=5"):
    _encode(CLIP, _params(CLIP), SCENES, "encode_queries")


def test_tower_flops_matches_compiled_cost():
  config = TINY
  params = _params(config)
  tokens = jnp.asarray(np.repeat(SCENES, 20, axis=0))
  compiled = _encode.lower(config, params, tokens, "encode_scenes").compile()
  flops = compiled.cost_analysis()["flops"]
  expected = models.tower_flops(config, 60, 9)
  # XLA also counts elementwise work (norms, GELU, softmax): a few percent on top.
  assert expected <= flops <= 1.25 * expected


def test_tower_flops_counts_the_product_readout():
  """The per-concept code matmuls of the product read-out are counted: the analytic count stays
  within the compiled cost's band for a tower with a wide read-out, and exceeds the plain one."""
  space = world.ObjectSpace.uniform(2, 3, 2)
  base = dict(d_model=64, num_heads=2, num_layers=1, d_ff=64, d_out=8)
  config = model_config.ModelConfig.for_space(space, product_readout="both", **base)
  plain = model_config.ModelConfig.for_space(space, **base)
  params = models.init_params(jax.random.key(0), config)
  tokens = jnp.asarray(np.repeat(SCENES, 20, axis=0))
  flops = _encode.lower(config, params, tokens, "encode_scenes").compile().cost_analysis()["flops"]
  expected = models.tower_flops(config, 60, 9, tower="scene")
  assert expected > models.tower_flops(plain, 60, 9, tower="scene")
  assert expected <= flops <= 1.25 * expected


def test_product_readout_parameters_and_forward_by_hand():
  """Σ_objects Π_concepts W_c·LN(h) added before the projection, with h the embeddings + positions
  (one layer); present objects only; concept queries get nothing."""
  space = world.ObjectSpace.uniform(2, 3, 2)
  base = dict(d_model=4, num_heads=1, num_layers=1, d_ff=8, d_out=3)
  plain = model_config.ModelConfig.for_space(space, **base)
  product = model_config.ModelConfig.for_space(space, product_readout="query", **base)
  both = model_config.ModelConfig.for_space(space, product_readout="both", **base)
  n_plain = models.count_parameters(models.init_params(jax.random.key(0), plain))
  extra = 2 * 4 + 2 * 4 * 4   # LayerNorm scale and bias, one 4x4 code matrix per concept
  assert models.count_parameters(models.init_params(jax.random.key(0), product)) == n_plain + extra
  assert models.count_parameters(models.init_params(jax.random.key(0), both)) == n_plain + 2 * extra

  params = models.init_params(jax.random.key(1), both)
  scene_values = np.array([[[0, 1], [2, 0]], [[1, 2], [0, 0]]], np.int32)
  tokens = jnp.asarray(space.scene_tokens(scene_values, np.array([2, 1])))
  tower = params["scene_tower"]
  with_product = models.Tower(both, both.d_out, both.scene_length, True).apply(
      {"params": tower}, tokens)
  without = models.Tower(plain, plain.d_out, plain.scene_length).apply(
      {"params": {k: v for k, v in tower.items() if k != "product"}}, tokens)
  # By hand.
  h = np.asarray(tower["embed"]["embedding"])[np.asarray(tokens)] + models.sinusoidal_positions(
      tokens.shape[1], 4)[None]
  norm = tower["product"]["norm"]
  codes = np.asarray(tower["product"]["codes"])
  expected = np.zeros((2, 4), np.float32)
  for b, count in enumerate((2, 1)):
    for k in range(count):
      term = np.ones(4, np.float32)
      for c in range(2):
        x = h[b, 4 * k + 1 + c]
        x = (x - x.mean()) / np.sqrt(x.var() + layers.LAYER_NORM_EPS)
        x = x * np.asarray(norm["scale"]) + np.asarray(norm["bias"])
        term = term * (x @ codes[c])
      expected[b] += term
  np.testing.assert_allclose(np.asarray(with_product - without),
                             expected @ np.asarray(tower["proj"]["kernel"]), rtol=1e-4,
                             atol=1e-5)
  # A concept query holds no object: its product term is zero.
  query = jnp.asarray(space.concept_query_tokens()[:2])
  q_tower = models.Tower(both, both.d_out, both.query_length, True).apply(
      {"params": params["query_tower"]}, query)
  q_plain = models.Tower(plain, plain.d_out, plain.query_length).apply(
      {"params": {k: v for k, v in params["query_tower"].items() if k != "product"}}, query)
  np.testing.assert_allclose(np.asarray(q_tower), np.asarray(q_plain), atol=1e-6)
  with pytest.raises(ValueError, match="product_readout"):
    model_config.ModelConfig.for_space(space, product_readout="scene", **base)
