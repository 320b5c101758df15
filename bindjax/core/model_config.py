"""The dual encoder's static settings (docs/models.md): `ModelConfig`, validated on construction.

Its defaults are the published model's; `bindjax.core.models` builds the towers from it.
"""
import dataclasses
import math

import jax.numpy as jnp
import numpy as np

VARIANTS = ("pre_ln", "clip")
SIMILARITIES = ("cosine", "dot")
COMPUTE_DTYPES = ("float32", "bfloat16")
PRODUCT_READOUTS = ("none", "query", "both")


def _check_int(name, value, minimum):
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"ModelConfig.{name}={value!r}: expected an integer >= {minimum}")
  if value < minimum:
    raise ValueError(f"ModelConfig.{name}={value}: expected an integer >= {minimum}")


def _check_choice(name, value, choices):
  if value not in choices:
    raise ValueError(f"ModelConfig.{name}={value!r}: expected one of {', '.join(choices)}")


def _check_float(name, value, positive):
  if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
    raise ValueError(f"ModelConfig.{name}={value!r}: expected a number")
  if math.isnan(value) or (positive and not value > 0) or (not positive and math.isinf(value)):
    expected = "a number > 0" if positive else "a finite number"
    raise ValueError(f"ModelConfig.{name}={value}: expected {expected}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Static model settings (hashable: a jit static argument). Validated on construction. The
  defaults are the published model's (`run_spec.default_config` takes them from here).

  `d_ff` is the pre-LN feed-forward width; the "clip" variant uses 4·d_model (see `mlp_width`).
  `compute_dtype="bfloat16"` runs matmuls in bfloat16 (params, norms, softmax and outputs stay
  float32); meant for accelerators. `scan_layers` picks the parameter layout (module docstring);
  both compute the same function.
  """
  vocab_size: int
  pad_token: int
  scene_length: int
  query_length: int
  d_model: int = 256
  num_heads: int = 4
  num_layers: int = 6
  d_ff: int = 2048
  d_out: int = 64
  variant: str = "pre_ln"
  similarity: str = "cosine"
  tau_init: float = 1.15
  train_logit_cap: float = 10.0
  eval_logit_cap: float = 100.0
  compute_dtype: str = "float32"
  product_readout: str = "none"
  scan_layers: bool = True

  def __post_init__(self):
    self.validate()

  @classmethod
  def for_space(cls, space, **overrides) -> "ModelConfig":
    """Config whose vocabulary, PAD token and lengths come from an `ObjectSpace`."""
    fields = dict(vocab_size=int(space.vocab_size), pad_token=int(space.pad_token),
                  scene_length=int(space.scene_length), query_length=int(space.query_length))
    fields.update(overrides)
    return cls(**fields)

  def validate(self) -> None:
    """Raises ValueError naming the field, its value and what was expected."""
    _check_int("vocab_size", self.vocab_size, 1)
    _check_int("pad_token", self.pad_token, 0)
    if self.pad_token >= self.vocab_size:
      raise ValueError(f"ModelConfig.pad_token={self.pad_token}: expected a token id below "
                       f"vocab_size={self.vocab_size}")
    _check_int("scene_length", self.scene_length, 1)
    _check_int("query_length", self.query_length, 1)
    _check_int("d_model", self.d_model, 1)
    _check_int("num_heads", self.num_heads, 1)
    _check_int("num_layers", self.num_layers, 1)
    _check_int("d_ff", self.d_ff, 1)
    _check_int("d_out", self.d_out, 1)
    _check_choice("variant", self.variant, VARIANTS)
    _check_choice("similarity", self.similarity, SIMILARITIES)
    _check_choice("compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
    _check_choice("product_readout", self.product_readout, PRODUCT_READOUTS)
    if self.product_readout != "none" and (
        self.query_length < 4 or (self.scene_length - 1) % (self.query_length - 1)):
      raise ValueError(
          f"ModelConfig.product_readout={self.product_readout!r}: needs the token layout of "
          f"bindjax.core.world (query_length = C + 3, scene_length = (C + 2)·K + 1), got "
          f"query_length={self.query_length}, scene_length={self.scene_length}")
    if self.d_model % self.num_heads:
      raise ValueError(f"ModelConfig.num_heads={self.num_heads}: expected a divisor of "
                       f"d_model={self.d_model}")
    if self.variant == "pre_ln" and self.d_model % 2:
      raise ValueError(f"ModelConfig.d_model={self.d_model}: the sinusoidal positions of the "
                       "pre_ln variant need an even d_model")
    _check_float("tau_init", self.tau_init, positive=False)
    _check_float("train_logit_cap", self.train_logit_cap, positive=True)
    _check_float("eval_logit_cap", self.eval_logit_cap, positive=True)
    if not isinstance(self.scan_layers, bool):
      raise ValueError(f"ModelConfig.scan_layers={self.scan_layers!r}: expected True or False")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def mlp_width(self) -> int:
    return 4 * self.d_model if self.variant == "clip" else self.d_ff

  @property
  def query_out_features(self) -> int:
    """Query-tower output width: d_out, plus one per-query bias for dot similarity."""
    return self.d_out + (1 if self.similarity == "dot" else 0)

  @property
  def dtype(self):
    return jnp.dtype(self.compute_dtype)

  @property
  def num_concepts(self) -> int:
    """C of the token layout (object query [SOO, tok_0 … tok_{C-1}, EOO, EOS])."""
    return self.query_length - 3

  @property
  def soo_token(self) -> int:
    """The start-of-object token, three below PAD in bindjax.core.world's vocabulary."""
    return self.pad_token - 3

  def has_product_readout(self, tower) -> bool:
    """Whether `tower` ("scene" or "query") adds the per-object product read-out."""
    return self.product_readout == "both" or (self.product_readout == "query" and
                                               tower == "query")
