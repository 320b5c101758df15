"""The original PyTorch dual-encoder checkpoints (docs/file_formats.md#dual-encoder-checkpoints) <->
bindjax parameters, without torch.

A checkpoint is a dict {"scene_encoder": state_dict, "probe_encoder": state_dict, "tau",
"config", "global_step"}. Each state dict holds a pre-LN encoder (nn.TransformerEncoderLayer,
norm_first=True) under these keys:
  token_embedder.weight                                   [V, d]
  transformer_encoder.layers.{i}.self_attn.in_proj_weight [3d, d]   (q | k | v rows)
  transformer_encoder.layers.{i}.self_attn.in_proj_bias   [3d]
  transformer_encoder.layers.{i}.self_attn.out_proj.{weight [d, d], bias [d]}
  transformer_encoder.layers.{i}.linear1.{weight [F, d], bias [F]}
  transformer_encoder.layers.{i}.linear2.{weight [d, F], bias [d]}
  transformer_encoder.layers.{i}.norm1/norm2.{weight, bias}
  out_proj.{weight [O, d], bias [O]}
PyTorch's Linear weights are [out, in]; bindjax kernels are [in, out] (transposed). Fixed
sinusoidal position buffers (a key ending in "pe"), if present, are checked against the fixed
table (docs/models.md#pre-ln-tower) and dropped; any other unknown key is an error.
"""
from __future__ import annotations

import collections
import os

import numpy as np

from bindjax.core import model_config
from bindjax.core import models
from bindjax.frozen.compat import torch_format

_LAYER_PREFIX = "transformer_encoder.layers."
_LAYER_KEYS = ("self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
               "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
               "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias")
_TOP_KEYS = ("token_embedder.weight", "out_proj.weight", "out_proj.bias")

# Lower-cased config keys the original code may use for each ModelConfig field.
_CONFIG_ALIASES = {
    "num_heads": ("num_heads", "nhead", "n_heads", "nheads", "heads", "num_attention_heads"),
    "pad_token": ("pad_token", "pad", "pad_token_id", "pad_id", "pad_idx", "pad_token_idx"),
    "scene_length": ("scene_length", "max_scene_length", "scene_seq_len", "max_length",
                     "max_len", "seq_len", "sequence_length"),
    "query_length": ("query_length", "max_query_length", "probe_length", "query_seq_len"),
    "similarity": ("similarity", "similarity_type", "sim", "sim_type"),
    "num_concepts": ("num_concepts", "n_concepts"),
    "max_objects": ("max_objects", "max_num_objects", "num_objects_per_scene", "max_k"),
}
_SPECIAL_TOKENS = ("soo", "eoo", "eos", "pad")


def _array(value, name):
  array = np.asarray(value)
  if array.dtype == object or not (np.issubdtype(array.dtype, np.floating) or
                                   array.dtype.name == "bfloat16"):
    raise ValueError(f"checkpoint entry {name!r}: expected a float tensor, got {array.dtype}")
  return array.astype(np.float32)


def _strip_module_prefix(state_dict):
  keys = list(state_dict)
  if keys and all(k.startswith("module.") for k in keys):  # saved from nn.DataParallel
    return {k[len("module."):]: v for k, v in state_dict.items()}
  return dict(state_dict)


def _num_layers(state_dict, name):
  indices = set()
  for key in state_dict:
    if key.startswith(_LAYER_PREFIX):
      index = key[len(_LAYER_PREFIX):].split(".", 1)[0]
      if not index.isdigit():
        raise ValueError(f"{name}: unexpected key {key!r}")
      indices.add(int(index))
  if not indices or indices != set(range(len(indices))):
    raise ValueError(f"{name}: expected layers 0..N-1 under {_LAYER_PREFIX!r}, found "
                     f"{sorted(indices)}")
  return len(indices)


def _check_positions_buffer(key, value, d_model, name):
  table = np.asarray(value, np.float32).reshape(-1, d_model) if np.size(value) % d_model == 0 \
      else None
  if table is None or not np.allclose(table, models.sinusoidal_positions(len(table), d_model),
                                      atol=1e-5):
    raise ValueError(f"{name}: buffer {key!r} is not the fixed sinusoidal table of the pre-LN "
                     "tower; "
                     "bindjax cannot represent these positions")


def tower_params_from_state_dict(state_dict, name="state_dict"):
  """One tower's torch state dict (numpy arrays) -> (bindjax Tower params, shape info dict).

  The params come in the scanned layout of `ModelConfig()` (`models.stack_blocks`).
  """
  state_dict = _strip_module_prefix(state_dict)
  num_layers = _num_layers(state_dict, name)
  expected = set(_TOP_KEYS) | {f"{_LAYER_PREFIX}{i}.{k}" for i in range(num_layers)
                               for k in _LAYER_KEYS}
  missing = sorted(expected - set(state_dict))
  if missing:
    raise ValueError(f"{name}: missing keys {missing[:6]}{' ...' if len(missing) > 6 else ''}")
  get = lambda key: _array(state_dict[key], f"{name}.{key}")
  embedding_VxD = get("token_embedder.weight")
  vocab_size, d_model = embedding_VxD.shape
  for key in sorted(set(state_dict) - expected):
    if key.split(".")[-1] == "pe":
      _check_positions_buffer(key, state_dict[key], d_model, name)
    else:
      raise ValueError(f"{name}: unexpected key {key!r} (only the pre-LN layout of the original "
                       "checkpoints is "
                       "supported)")

  params = {"embed": {"embedding": embedding_VxD}}
  d_ff = None
  for i in range(num_layers):
    layer = lambda key: get(f"{_LAYER_PREFIX}{i}.{key}")
    qkv_3DxD = layer("self_attn.in_proj_weight")
    fc1_FxD = layer("linear1.weight")
    if qkv_3DxD.shape != (3 * d_model, d_model):
      raise ValueError(f"{name}: layer {i} in_proj_weight has shape {qkv_3DxD.shape}, expected "
                       f"{(3 * d_model, d_model)}")
    d_ff = fc1_FxD.shape[0] if d_ff is None else d_ff
    if fc1_FxD.shape != (d_ff, d_model):
      raise ValueError(f"{name}: layer {i} linear1.weight has shape {fc1_FxD.shape}, expected "
                       f"{(d_ff, d_model)}")
    params[f"block_{i}"] = {
        "attn_norm": {"scale": layer("norm1.weight"), "bias": layer("norm1.bias")},
        "attn": {
            "qkv": {"kernel": qkv_3DxD.T, "bias": layer("self_attn.in_proj_bias")},
            "out": {"kernel": layer("self_attn.out_proj.weight").T,
                    "bias": layer("self_attn.out_proj.bias")},
        },
        "mlp_norm": {"scale": layer("norm2.weight"), "bias": layer("norm2.bias")},
        "mlp": {
            "fc1": {"kernel": fc1_FxD.T, "bias": layer("linear1.bias")},
            "fc2": {"kernel": layer("linear2.weight").T, "bias": layer("linear2.bias")},
        },
    }
  proj_OxD = get("out_proj.weight")
  if proj_OxD.shape[1] != d_model:
    raise ValueError(f"{name}: out_proj.weight has shape {proj_OxD.shape}, expected [out, "
                     f"{d_model}]")
  params["proj"] = {"kernel": proj_OxD.T, "bias": get("out_proj.bias")}
  info = dict(vocab_size=int(vocab_size), d_model=int(d_model), num_layers=num_layers,
              d_ff=int(d_ff), out_features=int(proj_OxD.shape[0]))
  return models.stack_blocks(params), info


def tower_state_dict_from_params(params):
  """bindjax Tower params (pre_ln, either layout) -> torch state dict of float32 numpy arrays
  (OrderedDict)."""
  np32 = lambda x: np.asarray(x, np.float32)
  params = models.unstack_blocks(params)
  out = collections.OrderedDict()
  out["token_embedder.weight"] = np32(params["embed"]["embedding"])
  num_layers = sum(1 for k in params if k.startswith("block_"))
  for i in range(num_layers):
    block, prefix = params[f"block_{i}"], f"{_LAYER_PREFIX}{i}."
    out[prefix + "self_attn.in_proj_weight"] = np32(block["attn"]["qkv"]["kernel"]).T.copy()
    out[prefix + "self_attn.in_proj_bias"] = np32(block["attn"]["qkv"]["bias"])
    out[prefix + "self_attn.out_proj.weight"] = np32(block["attn"]["out"]["kernel"]).T.copy()
    out[prefix + "self_attn.out_proj.bias"] = np32(block["attn"]["out"]["bias"])
    out[prefix + "linear1.weight"] = np32(block["mlp"]["fc1"]["kernel"]).T.copy()
    out[prefix + "linear1.bias"] = np32(block["mlp"]["fc1"]["bias"])
    out[prefix + "linear2.weight"] = np32(block["mlp"]["fc2"]["kernel"]).T.copy()
    out[prefix + "linear2.bias"] = np32(block["mlp"]["fc2"]["bias"])
    out[prefix + "norm1.weight"] = np32(block["attn_norm"]["scale"])
    out[prefix + "norm1.bias"] = np32(block["attn_norm"]["bias"])
    out[prefix + "norm2.weight"] = np32(block["mlp_norm"]["scale"])
    out[prefix + "norm2.bias"] = np32(block["mlp_norm"]["bias"])
  out["out_proj.weight"] = np32(params["proj"]["kernel"]).T.copy()
  out["out_proj.bias"] = np32(params["proj"]["bias"])
  return out


def _lowered(config):
  """{lower-case key: (original key, value)}; the same key in two spellings must agree."""
  lowered = {}
  for key, value in config.items():
    low = str(key).lower()
    if low in lowered and not np.array_equal(np.asarray(lowered[low][1]), np.asarray(value)):
      raise ValueError(f"checkpoint config {lowered[low][0]}={lowered[low][1]!r} but "
                       f"{key}={value!r}; expected one value")
    lowered[low] = (key, value)
  return lowered


def _config_value(config, field):
  lowered = _lowered(config)
  for alias in _CONFIG_ALIASES.get(field, (field,)):
    if alias in lowered and lowered[alias][1] is not None:
      return lowered[alias][1]
  return None


def _config_int(config, field):
  value = _config_value(config, field)
  if value is None:
    return None
  try:
    return int(np.asarray(value).item())
  except (TypeError, ValueError) as e:
    raise ValueError(f"checkpoint config {field}={value!r}: expected an integer") from e


def params_from_state_dicts(checkpoint, **overrides):
  """Loaded checkpoint dict (numpy arrays) -> (params, ModelConfig kwargs dict, global_step).

  Widths, layers, vocabulary and similarity come from the tensor shapes (a probe encoder with
  one more output than the scene encoder means "dot"); heads, PAD token and lengths from the
  checkpoint's `config` (keys in any case); `overrides` (ModelConfig fields) win over both.
  Missing lengths fall back to (C+2)·K+1 and C+3 (docs/world.md#scene-sequences) when the
  config gives C and K.
  """
  if not isinstance(checkpoint, dict):
    raise ValueError(f"checkpoint: expected a dict, got {type(checkpoint).__name__}")
  scene, query, fields = _towers(checkpoint)
  config = checkpoint.get("config") or {}
  if not isinstance(config, dict):
    config = dict(getattr(config, "__dict__", {}))
  stated = _config_value(config, "similarity")
  if stated is not None and str(stated).lower() != fields["similarity"]:
    raise ValueError(f"checkpoint config similarity={stated!r} but the tower shapes say "
                     f"{fields['similarity']!r}")
  fields.update(_config_fields(config, fields["vocab_size"]))
  fields.update(overrides)
  for field in ("num_heads", "scene_length", "query_length"):
    if field not in fields:
      raise ValueError(f"checkpoint config has no {field} (looked for "
                       f"{_CONFIG_ALIASES.get(field, (field,))} in {sorted(config)}); pass "
                       f"{field}=... explicitly")
  _check_special_tokens(config, fields)
  model_config.ModelConfig(**fields)  # validates

  tau = np.asarray(checkpoint.get("tau", model_config.ModelConfig.tau_init), np.float32)
  if tau.size != 1:
    raise ValueError(f"checkpoint tau: expected a scalar, got shape {tau.shape}")
  params = {"scene_tower": scene, "query_tower": query, "tau": tau.reshape(())}
  step = checkpoint.get("global_step", 0)
  return params, fields, int(np.asarray(0 if step is None else step).item())


def _towers(checkpoint):
  """(scene tower params, query tower params, ModelConfig fields the shapes give) of a
  checkpoint's two state dicts."""
  for key in ("scene_encoder", "probe_encoder"):
    if not isinstance(checkpoint.get(key), dict):
      raise ValueError(f"checkpoint: missing state dict {key!r} (keys: {sorted(checkpoint)})")
  scene, scene_info = tower_params_from_state_dict(checkpoint["scene_encoder"], "scene_encoder")
  query, query_info = tower_params_from_state_dict(checkpoint["probe_encoder"], "probe_encoder")
  for field in ("vocab_size", "d_model", "num_layers", "d_ff"):
    if scene_info[field] != query_info[field]:
      raise ValueError(f"checkpoint: scene_encoder {field}={scene_info[field]} but "
                       f"probe_encoder {field}={query_info[field]}; expected equal towers")
  d_out = scene_info["out_features"]
  extra = query_info["out_features"] - d_out
  if extra not in (0, 1):
    raise ValueError(f"checkpoint: probe_encoder emits {query_info['out_features']} features "
                     f"for scene_encoder's {d_out}; expected equal (cosine) or one more (dot)")
  fields = dict(vocab_size=scene_info["vocab_size"], d_model=scene_info["d_model"],
                num_layers=scene_info["num_layers"], d_ff=scene_info["d_ff"], d_out=d_out,
                similarity="dot" if extra else "cosine", variant="pre_ln")
  return scene, query, fields


def _config_fields(config, vocab_size):
  """ModelConfig fields the checkpoint's config gives: heads, PAD token (else the last token)
  and the sequence lengths (else from C and K)."""
  fields = {}
  num_heads = _config_int(config, "num_heads")
  if num_heads is not None:
    fields["num_heads"] = num_heads
  pad = _config_int(config, "pad_token")
  # PAD is the last token (docs/world.md#tokens).
  fields["pad_token"] = vocab_size - 1 if pad is None else pad
  num_concepts = _config_int(config, "num_concepts")
  max_objects = _config_int(config, "max_objects")
  scene_length = _config_int(config, "scene_length")
  query_length = _config_int(config, "query_length")
  if scene_length is None and num_concepts is not None and max_objects is not None:
    scene_length = (num_concepts + 2) * max_objects + 1
  if query_length is None and num_concepts is not None:
    query_length = num_concepts + 3
  if scene_length is not None:
    fields["scene_length"] = scene_length
  if query_length is not None:
    fields["query_length"] = query_length
  return fields


def _check_special_tokens(config, fields):
  """Special tokens stated in the config must be SOO, EOO, EOS, PAD, the last four tokens.

  See docs/world.md#tokens.
  """
  pad = fields["pad_token"]
  lowered = _lowered(config)
  for offset, name in enumerate(_SPECIAL_TOKENS):
    for low in (name, f"{name}_token", f"{name}_token_id", f"{name}_id", f"{name}_idx"):
      if low in lowered and lowered[low][1] is not None:
        key, value = lowered[low]
        value = int(np.asarray(value).item())
        if value != pad - 3 + offset:
          raise ValueError(f"checkpoint config {key}={value}: expected {pad - 3 + offset} "
                           f"(SOO, EOO, EOS, PAD must be consecutive with PAD={pad})")


def state_dicts_from_params(params, config: model_config.ModelConfig, global_step=0,
                            upper_case=False):
  """bindjax params -> a checkpoint dict in the original layout (numpy arrays).

  The config dict names heads, lengths, similarity and the four special tokens, in upper case
  when `upper_case` (the original code wrote either spelling).
  """
  if config.variant != "pre_ln":
    raise ValueError(f"ModelConfig.variant={config.variant!r}: the original checkpoint layout "
                     "exists only for 'pre_ln'")
  pad = config.pad_token
  tokens = {f"{name}_token": pad - 3 + i for i, name in enumerate(_SPECIAL_TOKENS)}
  if upper_case:
    tokens = {k.upper(): v for k, v in tokens.items()}
  meta = dict(vocab_size=config.vocab_size, d_model=config.d_model, num_heads=config.num_heads,
              num_layers=config.num_layers, d_ff=config.d_ff, d_out=config.d_out,
              similarity=config.similarity, scene_length=config.scene_length,
              query_length=config.query_length, **tokens)
  return {
      "scene_encoder": tower_state_dict_from_params(params["scene_tower"]),
      "probe_encoder": tower_state_dict_from_params(params["query_tower"]),
      "tau": np.asarray(params["tau"], np.float32).reshape(()),
      "config": meta,
      "global_step": int(global_step),
  }


def load_reference_checkpoint(path, **overrides):
  """Reads an original dual-encoder checkpoint file -> (params, ModelConfig kwargs, global_step).

  `path` is a torch.save file (zip or legacy) or pickle; no torch needed. Errors name the file.
  """
  path = os.fspath(path)
  checkpoint = torch_format.load(path)
  try:
    return params_from_state_dicts(checkpoint, **overrides)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from e


def save_reference_checkpoint(params, config: model_config.ModelConfig, path, global_step=0,
                              upper_case=False):
  """Writes bindjax params as a torch.save zip in the original checkpoint layout."""
  torch_format.save(state_dicts_from_params(params, config, global_step, upper_case), path)
