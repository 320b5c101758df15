"""Original PyTorch dual-encoder checkpoints <-> bindjax params, checked numerically
against an independent numpy forward pass with nn.TransformerEncoderLayer(norm_first=True)
semantics on the torch-layout tensors."""
import collections
import functools
import math

import jax
import numpy as np
import pytest
from scipy import special

from bindjax.core import model_config
from bindjax.core import models
from bindjax.frozen.compat import torch_checkpoint
from bindjax.frozen.compat import torch_format

D, HEADS, LAYERS, FF, OUT, VOCAB, PAD, EOS = 16, 2, 2, 32, 8, 12, 11, 10
SCENES = np.array([[8, 0, 4, 9, EOS, PAD, PAD, PAD, PAD],
                   [8, 1, 5, 9, 8, 2, 7, 9, EOS]], np.int32)
QUERIES = np.array([[0, EOS, PAD, PAD, PAD], [8, 3, 6, 9, EOS]], np.int32)


def _random_state_dict(rng, out_features):
  normal = lambda *shape: rng.normal(0, 0.3, shape).astype(np.float32)
  sd = collections.OrderedDict([("token_embedder.weight", normal(VOCAB, D))])
  for i in range(LAYERS):
    p = f"transformer_encoder.layers.{i}."
    sd[p + "self_attn.in_proj_weight"] = normal(3 * D, D)
    sd[p + "self_attn.in_proj_bias"] = normal(3 * D)
    sd[p + "self_attn.out_proj.weight"] = normal(D, D)
    sd[p + "self_attn.out_proj.bias"] = normal(D)
    sd[p + "linear1.weight"] = normal(FF, D)
    sd[p + "linear1.bias"] = normal(FF)
    sd[p + "linear2.weight"] = normal(D, FF)
    sd[p + "linear2.bias"] = normal(D)
    sd[p + "norm1.weight"] = 1 + normal(D)
    sd[p + "norm1.bias"] = normal(D)
    sd[p + "norm2.weight"] = 1 + normal(D)
    sd[p + "norm2.bias"] = normal(D)
  sd["out_proj.weight"] = normal(out_features, D)
  sd["out_proj.bias"] = normal(out_features)
  return sd


def _checkpoint(similarity="cosine", config=None, seed=0):
  rng = np.random.default_rng(seed)
  extra = 1 if similarity == "dot" else 0
  if config is None:
    config = {"num_heads": HEADS, "pad_token": PAD, "eos_token": EOS, "num_concepts": 2,
              "max_objects": 2}
  return {"scene_encoder": _random_state_dict(rng, OUT),
          "probe_encoder": _random_state_dict(rng, OUT + extra),
          "tau": np.array(0.7, np.float32), "config": config, "global_step": 1234}


def _layer_norm(x, weight, bias):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-5) * weight + bias


def _reference_tower(sd, tokens):
  """numpy float64: embedding + sinusoidal positions, norm_first encoder layers, EOS, out_proj."""
  sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
  batch, length = tokens.shape
  position = np.arange(length)[:, None]
  div = np.exp(np.arange(0, D, 2) * (-math.log(10000.0) / D))
  pe = np.zeros((length, D))
  pe[:, 0::2], pe[:, 1::2] = np.sin(position * div), np.cos(position * div)
  x = sd["token_embedder.weight"][tokens] + pe
  key_padding = tokens == PAD
  head_dim = D // HEADS
  for i in range(LAYERS):
    p = lambda name: sd[f"transformer_encoder.layers.{i}.{name}"]
    h = _layer_norm(x, p("norm1.weight"), p("norm1.bias"))
    w, b = p("self_attn.in_proj_weight"), p("self_attn.in_proj_bias")
    heads = []
    for j in range(HEADS):
      rows = slice(j * head_dim, (j + 1) * head_dim)
      q = h @ w[:D][rows].T + b[:D][rows]
      k = h @ w[D:2 * D][rows].T + b[D:2 * D][rows]
      v = h @ w[2 * D:][rows].T + b[2 * D:][rows]
      scores = q @ k.transpose(0, 2, 1) / math.sqrt(head_dim)
      scores = np.where(key_padding[:, None, :], -np.inf, scores)
      probs = np.exp(scores - scores.max(-1, keepdims=True))
      heads.append((probs / probs.sum(-1, keepdims=True)) @ v)
    attn = (np.concatenate(heads, -1) @ p("self_attn.out_proj.weight").T
            + p("self_attn.out_proj.bias"))
    x = x + attn
    h = _layer_norm(x, p("norm2.weight"), p("norm2.bias"))
    h = h @ p("linear1.weight").T + p("linear1.bias")
    h = 0.5 * h * (1 + special.erf(h / math.sqrt(2)))
    x = x + h @ p("linear2.weight").T + p("linear2.bias")
  eos = np.array([np.nonzero(row != PAD)[0].max() for row in tokens])
  return x[np.arange(batch), eos] @ sd["out_proj.weight"].T + sd["out_proj.bias"]


@functools.partial(jax.jit, static_argnums=0)
def _forward(config, params, scenes, queries):
  model = models.DualEncoder(config)
  z, q = model.apply({"params": params}, scenes, queries)
  return z, q, model.apply({"params": params}, z, q, config.eval_logit_cap,
                           method=models.DualEncoder.logits)


@pytest.mark.parametrize("similarity", ["cosine", "dot"])
def test_conversion_matches_numpy_torch_semantics(similarity):
  checkpoint = _checkpoint(similarity)
  params, fields, step = torch_checkpoint.params_from_state_dicts(checkpoint)
  config = model_config.ModelConfig(**fields)
  assert (config.d_model, config.num_heads, config.num_layers, config.d_ff, config.d_out) == (
      D, HEADS, LAYERS, FF, OUT)
  assert (config.vocab_size, config.pad_token, config.scene_length, config.query_length) == (
      VOCAB, PAD, 9, 5)
  assert config.similarity == similarity and step == 1234
  assert float(params["tau"]) == pytest.approx(0.7)
  z, q, logits = _forward(config, params, SCENES, QUERIES)
  z_ref = _reference_tower(checkpoint["scene_encoder"], SCENES)
  q_ref = _reference_tower(checkpoint["probe_encoder"], QUERIES)
  np.testing.assert_allclose(z, z_ref, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(q, q_ref, rtol=1e-4, atol=1e-4)
  if similarity == "dot":
    logits_ref = z_ref @ q_ref[:, :-1].T + q_ref[:, -1]
  else:
    zn = z_ref / (1e-6 + np.linalg.norm(z_ref, axis=-1, keepdims=True))
    qn = q_ref / (1e-6 + np.linalg.norm(q_ref, axis=-1, keepdims=True))
    logits_ref = math.exp(0.7) * zn @ qn.T
  np.testing.assert_allclose(logits, logits_ref, rtol=1e-4, atol=1e-4)


def test_params_round_trip_exactly():
  checkpoint = _checkpoint("dot")
  params, fields, _ = torch_checkpoint.params_from_state_dicts(checkpoint)
  back = torch_checkpoint.state_dicts_from_params(params, model_config.ModelConfig(**fields), 7)
  for tower in ("scene_encoder", "probe_encoder"):
    assert list(back[tower]) == list(checkpoint[tower])
    for key, value in checkpoint[tower].items():
      np.testing.assert_array_equal(back[tower][key], value, err_msg=key)
  assert back["global_step"] == 7 and back["config"]["num_heads"] == HEADS
  assert back["config"]["eos_token"] == EOS


def test_fresh_bindjax_params_survive_the_original_layout():
  config = model_config.ModelConfig(vocab_size=VOCAB, pad_token=PAD, scene_length=9,
                                    query_length=5, d_model=D, num_heads=HEADS,
                                    num_layers=LAYERS, d_ff=FF, d_out=OUT)
  params = models.init_params(jax.random.key(0), config)
  checkpoint = torch_checkpoint.state_dicts_from_params(params, config)
  again, fields, _ = torch_checkpoint.params_from_state_dicts(checkpoint)
  assert model_config.ModelConfig(**fields) == config
  jax.tree.map(np.testing.assert_array_equal, again, jax.tree.map(np.asarray, params))
  np.testing.assert_allclose(_forward(config, params, SCENES, QUERIES)[0],
                             _reference_tower(checkpoint["scene_encoder"], SCENES), atol=1e-4)


@pytest.mark.parametrize("upper_case", [False, True])
def test_torch_save_file_round_trip(tmp_path, upper_case):
  checkpoint = _checkpoint("cosine")
  params, fields, _ = torch_checkpoint.params_from_state_dicts(checkpoint)
  config = model_config.ModelConfig(**fields)
  path = tmp_path / "model.pt"
  torch_checkpoint.save_reference_checkpoint(params, config, path, global_step=99,
                                             upper_case=upper_case)
  raw = torch_format.load(path)
  assert ("PAD_TOKEN" in raw["config"]) == upper_case
  loaded, loaded_fields, step = torch_checkpoint.load_reference_checkpoint(path)
  assert step == 99 and loaded_fields == fields
  np.testing.assert_allclose(_forward(config, loaded, SCENES, QUERIES)[2],
                             _forward(config, params, SCENES, QUERIES)[2], rtol=1e-6)


def test_config_keys_in_upper_case_and_fallbacks():
  config = {"NHEAD": HEADS, "PAD": PAD, "SOO": 8, "EOO": 9, "EOS": EOS, "NUM_CONCEPTS": 2,
            "MAX_OBJECTS": 2}
  _, fields, _ = torch_checkpoint.params_from_state_dicts(_checkpoint(config=config))
  assert (fields["num_heads"], fields["pad_token"], fields["scene_length"],
          fields["query_length"]) == (HEADS, PAD, 9, 5)
  # No PAD in the config: the last token of the vocabulary (docs/world.md#tokens).
  _, fields, _ = torch_checkpoint.params_from_state_dicts(
      _checkpoint(config={"n_heads": 4, "scene_length": 9, "query_length": 5}))
  assert fields["pad_token"] == VOCAB - 1 and fields["num_heads"] == 4


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["scene_encoder"].pop("transformer_encoder.layers.1.norm2.bias"),
     "scene_encoder: missing keys .*layers.1.norm2.bias"),
    (lambda c: c["probe_encoder"].__setitem__("extra.weight", np.zeros(3, np.float32)),
     "probe_encoder: unexpected key 'extra.weight'"),
    (lambda c: c["probe_encoder"].__setitem__("out_proj.weight", np.zeros((10, D), np.float32)),
     "probe_encoder emits 10 features"),
    (lambda c: c["config"].pop("num_heads"), "no num_heads"),
    (lambda c: c["config"].__setitem__("SOO_TOKEN", 3), "SOO_TOKEN=3: expected 8"),
    (lambda c: c["config"].__setitem__("EOS_TOKEN", 3), "eos_token=10 but EOS_TOKEN=3"),
    (lambda c: c["config"].__setitem__("num_heads", 3), "num_heads=3"),
    (lambda c: c["config"].__setitem__("similarity", "dot"), "similarity='dot'"),
    (lambda c: c["scene_encoder"].__setitem__("pos_encoder.pe", np.ones((1, 9, D), np.float32)),
     "not the fixed sinusoidal table"),
])
def test_bad_checkpoints_are_refused(mutate, message):
  checkpoint = _checkpoint()
  mutate(checkpoint)
  with pytest.raises(ValueError, match=message):
    torch_checkpoint.params_from_state_dicts(checkpoint)


def test_sinusoidal_buffer_and_dataparallel_prefix_are_accepted():
  checkpoint = _checkpoint()
  checkpoint["scene_encoder"]["pos_encoder.pe"] = models.sinusoidal_positions(20, D)[:, None]
  checkpoint["probe_encoder"] = {f"module.{k}": v for k, v in checkpoint["probe_encoder"].items()}
  params, _, _ = torch_checkpoint.params_from_state_dicts(checkpoint)
  np.testing.assert_array_equal(params["query_tower"]["proj"]["bias"],
                                checkpoint["probe_encoder"]["module.out_proj.bias"])


def test_load_errors_name_the_file(tmp_path):
  checkpoint = _checkpoint()
  del checkpoint["probe_encoder"]
  path = tmp_path / "broken.pt"
  torch_format.save(checkpoint, path)
  with pytest.raises(ValueError, match="broken.pt: checkpoint: missing state dict 'probe_encoder'"):
    torch_checkpoint.load_reference_checkpoint(path)
