"""Training steps pinned: a fixed init and data stream give the loss and gradient norm recorded
here (a change to the model, the sampler, the objective or the optimiser that moves them is
seen), and the compiled step moves no array between host and device."""
import os

import jax
import jax.numpy as jnp
import numpy as np

from bindjax.commands import flags
from bindjax.training import run_spec
from bindjax.training import train

PRESETS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "experiments", "train.py")
# experiments/train.py:tiny, coverage 0.75, seed 0, 20 steps: the metrics of its fourth step
# (the first update has learning rate 0, so three moved the weights). Recorded with jax 0.10.2
# on CPU.
GOLDEN = {"loss": 4.727551, "concept_loss": 2.046511, "object_loss": 2.681039,
          "grad_norm": 0.2887619}


def _replica():
  config = flags.load_config(f"{PRESETS}:tiny")
  config.unlock()
  config.update_from_flattened_dict({"num_steps": 20, "coverage": 0.75, "seed": 0})
  spec = run_spec.RunSpec.from_config(config)
  inputs, _ = run_spec.inputs_from_config(config, spec)
  return spec, inputs, train.init(inputs.key, spec, inputs)


def test_four_steps_from_a_fixed_init_and_data_give_the_recorded_loss_and_gradient_norm():
  spec, inputs, state = _replica()
  step = jax.jit(train.train_step, static_argnums=2)
  new_state = state
  for _ in range(4):
    new_state, metrics = step(new_state, inputs, spec)
  got = {name: float(metrics[name]) for name in GOLDEN}
  np.testing.assert_allclose(list(got.values()), list(GOLDEN.values()), rtol=1e-5,
                             err_msg=str(got))
  assert int(new_state.step) == 4
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.any(a != b)),
                                       state.params, new_state.params))
  assert all(moved)   # AdamW moves every parameter once the learning rate is above 0


def test_the_compiled_step_runs_with_host_device_transfers_disallowed():
  spec, inputs, state = _replica()
  state, inputs = jax.device_put((state, inputs))
  step = jax.jit(train.train_step, static_argnums=2)
  step(state, inputs, spec)   # compile outside the guard: tracing may stage constants
  with jax.transfer_guard("disallow"):
    new_state, metrics = step(state, inputs, spec)
    jax.block_until_ready((new_state, metrics))
  assert int(new_state.step) == 1
