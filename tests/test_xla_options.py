"""Compiler options of the training programs: which apply where, and that this XLA takes them."""
import jax
import jax.numpy as jnp
import pytest

from bindjax.runtime import xla_options


def test_cpu_programs_turn_off_ynn_fusions_unless_xla_flags_choose():
  assert xla_options.compiler_options("cpu", environ={}) == {xla_options.YNN_FLAG: ""}
  assert xla_options.compiler_options("gpu", environ={}) is None
  assert xla_options.compiler_options("tpu", fast_compile=True, environ={}) is None
  assert xla_options.compiler_options("gpu", fast_compile=True, environ={}) is None
  both = xla_options.compiler_options("cpu", fast_compile=True, environ={})
  assert both == {xla_options.YNN_FLAG: "", **xla_options.FAST_COMPILE_OPTIONS}
  chosen = {"XLA_FLAGS": f"--{xla_options.YNN_FLAG}=individual_dot"}
  assert xla_options.compiler_options("cpu", environ=chosen) is None


def test_every_option_set_is_one_this_xla_accepts():
  """XLA refuses a compile option it does not know, so a misspelt or retired name in
  xla_options would fail every training program's compile; a small program finds it first."""
  if jax.default_backend() != "cpu":
    pytest.skip("XLA:CPU options")
  lowered = jax.jit(lambda x: jnp.sum(x @ x.T)).lower(jnp.ones((4, 4)))
  for fast_compile in (False, True):
    lowered.compile(xla_options.compiler_options("cpu", fast_compile, environ={}))
  with pytest.raises(Exception, match="xla_cpu_no_such_option"):
    lowered.compile({"xla_cpu_no_such_option": ""})
