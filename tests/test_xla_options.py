"""Compiler options of the training programs: which apply where, and that they take effect."""
import jax
import jax.numpy as jnp
import pytest

from bindjax import xla_options


def test_cpu_programs_turn_off_ynn_fusions_unless_xla_flags_choose():
  assert xla_options.compiler_options("cpu", environ={}) == {xla_options.YNN_FLAG: ""}
  assert xla_options.compiler_options("gpu", environ={}) is None
  assert xla_options.compiler_options("tpu", fast_compile=True, environ={}) is None
  assert xla_options.compiler_options("gpu", fast_compile=True, environ={}) is None
  both = xla_options.compiler_options("cpu", fast_compile=True, environ={})
  assert both == {xla_options.YNN_FLAG: "", **xla_options.FAST_COMPILE_OPTIONS}
  chosen = {"XLA_FLAGS": f"--{xla_options.YNN_FLAG}=individual_dot"}
  assert xla_options.compiler_options("cpu", environ=chosen) is None


def test_the_cpu_option_removes_ynn_fusions_from_the_compiled_program():
  if jax.default_backend() != "cpu":
    pytest.skip("XLA:CPU option")

  def layer(x, w):
    h = x @ w
    return jnp.sum((h - h.mean(-1, keepdims=True)) ** 2)

  args = (jnp.ones((8, 64, 32)), jnp.ones((8, 32, 32)))
  lowered = jax.jit(jax.vmap(jax.grad(layer))).lower(*args)
  if "__ynn_fusion" not in lowered.compile().as_text():
    pytest.skip("this XLA build makes no YNNPACK fusions here: nothing to turn off")
  options = xla_options.compiler_options("cpu", environ={})
  assert "__ynn_fusion" not in lowered.compile(options).as_text()
