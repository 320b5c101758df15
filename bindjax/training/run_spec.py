"""A training run's settings (docs/training.md): the config's defaults, their validation into the
static `RunSpec` (whose `ProgramSpec` shapes the compiled programs) and each replica's
`ReplicaInputs` (hyperparameters, training objects, root key and schedule length, as arrays).
"""
import dataclasses
import math

import flax.struct
import jax
import ml_collections
import numpy as np

from bindjax.core import coverage_splits
from bindjax.core import model_config
from bindjax.core import scenes
from bindjax.core import world
from bindjax.runtime import parallel
from bindjax.training import packing


def default_config():
  """The published run's settings (docs/training.md); experiments/train.py derives its presets
  from it."""
  c = ml_collections.ConfigDict()
  c.space = ml_collections.ConfigDict(dict(num_concepts=2, num_values=20, max_objects=2))
  c.coverage = 0.8
  c.seed = 0
  # Seed of the coverage split's RandomState permutation (docs/world.md); -1 means "use `seed`".
  c.split_seed = -1
  # The model's and the sampler's defaults are those of their dataclasses. scan_layers, a
  # parameter layout that computes the same function, is no setting of a run.
  c.model = ml_collections.ConfigDict(
      _field_defaults(model_config.ModelConfig, leave_out=("scan_layers",)))
  c.sampler = ml_collections.ConfigDict(
      dict(batch_size=512, **_field_defaults(scenes.SamplerConfig)))
  c.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=3e-5, weight_decay=0.1, b1=0.9, b2=0.999, eps=1e-8, warmup_fraction=0.1))
  c.num_steps = 50_000
  c.eval = ml_collections.ConfigDict(dict(every=1000, batches=10, batch_size=512))
  c.log_every = 100
  # keep_best: also keep each replica's parameters at its best held-out object accuracy.
  c.checkpoint = ml_collections.ConfigDict(dict(every=1000, keep=3, keep_best=True))
  # How the loop runs (bindjax.training.sweep): chunk_size "auto", "none" (all replicas at once)
  # or n at a time; num_data devices per replica; fast_compile cheaper XLA compiles of slower code
  # (tiny models); cpu_devices -1 one single-threaded device per CPU core, 0 JAX's default CPU
  # device; packing "auto" buckets packed onto lanes of the devices when that keeps more of them
  # busy, "none" buckets one after another over all devices (bindjax.training.packing).
  c.sweep = ml_collections.ConfigDict(dict(
      chunk_size=parallel.AUTO, num_data=1, memory_fraction=parallel.DEFAULT_MEMORY_FRACTION,
      fast_compile=False, cpu_devices=0, packing="auto"))
  return c


def _field_defaults(cls, leave_out=()):
  """{name: default} of the fields of dataclass `cls` that have a default."""
  return {f.name: f.default for f in dataclasses.fields(cls)
          if f.default is not dataclasses.MISSING and f.name not in leave_out}


# --------------------------------------------------------------------------------------------
# Static settings and per-replica hyperparameters


def _field(config, path):
  node = config
  for part in path.split("."):
    try:
      node = node[part]
    except (KeyError, AttributeError, TypeError):
      raise ValueError(f"config.{path} is missing (see "
                       "bindjax.training.run_spec.default_config())") from None
  return node


def _int(config, path, minimum):
  value = _field(config, path)
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"config.{path}={value!r}: expected an integer >= {minimum}")
  return int(value)


def _float(config, path, low, high, low_open=False, high_open=False):
  value = _field(config, path)
  if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
    raise ValueError(f"config.{path}={value!r}: expected a number")
  value = float(value)
  ok = (not math.isnan(value) and (value > low if low_open else value >= low) and
        (value < high if high_open else value <= high))
  if not ok:
    interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    raise ValueError(f"config.{path}={value!r}: expected a number in {interval}")
  return value


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
  """The settings that shape a replica's compiled programs (hashable; a static jit argument).

  Replicas that share a ProgramSpec share one compiled train_step/eval_step; what varies between
  them (coverage, seed, learning rate, weight decay, the schedule's length) lives in
  `ReplicaInputs`.
  """
  space: world.ObjectSpace
  sampler: scenes.SamplerConfig        # training batches
  eval_sampler: scenes.SamplerConfig   # evaluation batches (eval_batch_size scenes)
  model: model_config.ModelConfig
  eval_batches: int
  adam_b1: float
  adam_b2: float
  adam_eps: float

  @property
  def program(self):
    return self


@dataclasses.dataclass(frozen=True)
class RunSpec(ProgramSpec):
  """A run's settings shared by its replicas: its program's, and the loop's (how many steps,
  how often it evaluates), which are not part of any compiled program.

  Every field is required: default_config() holds the defaults, once.
  """
  num_steps: int
  warmup_fraction: float
  eval_every: int

  @property
  def warmup_steps(self):
    return int(self.warmup_fraction * self.num_steps)

  @property
  def program(self):
    """The ProgramSpec part: what the compiled programs depend on."""
    return ProgramSpec(**{f.name: getattr(self, f.name)
                          for f in dataclasses.fields(ProgramSpec)})

  @classmethod
  def from_config(cls, config):
    """Builds and validates the static settings; also checks the per-replica ones.

    Raises ValueError naming the field, its value and what was expected, before anything is
    compiled.
    """
    space_values = _field(config, "space.num_values")
    num_concepts = _int(config, "space.num_concepts", 1)
    max_objects = _int(config, "space.max_objects", 1)
    try:
      space = world.ObjectSpace.create(
          tuple(space_values) if isinstance(space_values, (list, tuple)) else space_values,
          max_objects, num_concepts=num_concepts)
      space.check_enumerable("training (a permutation of all object ids)")
      if space.num_objects < 2:
        # With one object there is nothing to tell apart: every accuracy would be 1.
        raise ValueError(f"values_per_concept={list(space.values_per_concept)} gives "
                         f"|O| = {space.num_objects} object; expected at least 2 objects")
    except ValueError as e:
      raise ValueError(f"config.space: {e}") from None
    try:
      model = model_config.ModelConfig.for_space(space, **dict(_field(config, "model")))
    except (ValueError, TypeError) as e:
      raise ValueError(f"config.model: {e}") from None
    try:
      sampler = scenes.SamplerConfig(**dict(_field(config, "sampler")))
      eval_sampler = dataclasses.replace(
          sampler, batch_size=_int(config, "eval.batch_size", 1))
    except (ValueError, TypeError) as e:
      raise ValueError(f"config.sampler: {e}") from None
    spec = cls(
        space=space, sampler=sampler, eval_sampler=eval_sampler, model=model,
        num_steps=_int(config, "num_steps", 1),
        warmup_fraction=_float(config, "optimizer.warmup_fraction", 0.0, 1.0, high_open=True),
        eval_every=_int(config, "eval.every", 1),
        eval_batches=_int(config, "eval.batches", 1),
        adam_b1=_float(config, "optimizer.b1", 0.0, 1.0, high_open=True),
        adam_b2=_float(config, "optimizer.b2", 0.0, 1.0, high_open=True),
        adam_eps=_float(config, "optimizer.eps", 0.0, math.inf, low_open=True, high_open=True))
    # Per-replica and loop settings: checked here so a bad run fails before compiling.
    coverage = _float(config, "coverage", 0.0, 1.0, low_open=True)
    if coverage < 1.0 and space.num_objects < 2:
      raise ValueError(f"config.coverage={coverage}: a held-out set needs |O| >= 2, "
                       f"the space has {space.num_objects} object")
    check_hyper(learning_rate=_field(config, "optimizer.learning_rate"),
                weight_decay=_field(config, "optimizer.weight_decay"))
    _int(config, "seed", 0)
    _int(config, "split_seed", -1)
    return spec


def _bool(config, path):
  value = _field(config, path)
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"config.{path}={value!r}: expected True or False")
  return bool(value)


@dataclasses.dataclass(frozen=True)
class LoopSpec:
  """How a sweep's loop runs its programs, apart from what they compute (config.sweep,
  config.checkpoint and log_every): no compiled program's shape depends on it, every replica of
  a sweep shares it.

  Parsed once from the config at a command's or `run_sweep`'s door (`from_config`); nothing
  below reads these settings from the config again.
  """
  chunk_size: object       # parallel.AUTO, None (all replicas at once) or a count
  num_data: int            # devices that share one replica's batch
  memory_fraction: float   # of a device's memory the auto chunk size may plan for
  fast_compile: bool       # cheaper XLA:CPU compiles of slower code (xla_options)
  cpu_devices: int         # -1 one single-threaded device per core, 0 JAX's default, or n
  packing: str             # one of bindjax.training.packing.PACKINGS
  log_every: int
  checkpoint_every: int
  checkpoint_keep: int
  keep_best: bool          # checkpoints also hold each replica's best parameters

  @classmethod
  def from_config(cls, config):
    """The loop settings of `config`; ValueError naming the field, its value and what was
    expected."""
    packing_setting = _field(config, "sweep.packing")
    packing.check_setting(packing_setting)
    return cls(
        chunk_size=parallel.chunk_setting(_field(config, "sweep.chunk_size"),
                                          "config.sweep.chunk_size"),
        num_data=_int(config, "sweep.num_data", 1),
        memory_fraction=_float(config, "sweep.memory_fraction", 0.0, 1.0, low_open=True),
        fast_compile=_bool(config, "sweep.fast_compile"),
        cpu_devices=_int(config, "sweep.cpu_devices", -1),
        packing=packing_setting,
        log_every=_int(config, "log_every", 1),
        checkpoint_every=_int(config, "checkpoint.every", 1),
        checkpoint_keep=_int(config, "checkpoint.keep", 1),
        keep_best=_bool(config, "checkpoint.keep_best"))


def check_hyper(*, learning_rate, weight_decay):
  """Raises ValueError unless learning_rate > 0 and weight_decay >= 0 (both finite)."""
  for name, value, low_open in (("optimizer.learning_rate", learning_rate, True),
                                ("optimizer.weight_decay", weight_decay, False)):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
      raise ValueError(f"config.{name}={value!r}: expected a number")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (low_open and value == 0):
      raise ValueError(f"config.{name}={value!r}: expected a finite number "
                       f"{'> 0' if low_open else '>= 0'}")


@flax.struct.dataclass
class ReplicaInputs:
  """What one replica's programs take besides their state, all arrays (stack along a leading
  axis to vmap replicas): its hyperparameters, its training objects and its root key."""
  learning_rate: jax.Array   # float32 [], peak learning rate
  weight_decay: jax.Array    # float32 []
  permutation_O: jax.Array   # int32 [|O|]; training objects are permutation_O[:num_train]
  num_train: jax.Array       # int32 []; == |O| means no held-out set (coverage 1)
  key: jax.Array             # uint32 [2], the replica's root PRNG key
  num_steps: jax.Array       # int32 [], the schedule's length (it decays to 0 there)
  warmup_steps: jax.Array    # int32 []


def make_inputs(split, *, seed, learning_rate, weight_decay, num_steps, warmup_steps):
  """ReplicaInputs of one replica from its coverage split, seed, optimiser settings and schedule
  length (numpy arrays)."""
  check_hyper(learning_rate=learning_rate, weight_decay=weight_decay)
  return ReplicaInputs(
      learning_rate=np.float32(learning_rate), weight_decay=np.float32(weight_decay),
      permutation_O=np.asarray(split.permutation, np.int32),
      num_train=np.int32(split.num_train),
      key=np.asarray(jax.random.key_data(jax.random.key(int(seed))), np.uint32),
      num_steps=np.int32(num_steps), warmup_steps=np.int32(warmup_steps))


def inputs_from_config(config, spec):
  """(ReplicaInputs, CoverageSplit) of the run described by `config` (docs/world.md coverage
  split)."""
  seed = _int(config, "seed", 0)
  split_seed = _int(config, "split_seed", -1)
  split = coverage_splits.coverage_split(spec.space, _field(config, "coverage"),
                               seed if split_seed < 0 else split_seed)
  inputs = make_inputs(split, seed=seed,
                       learning_rate=_field(config, "optimizer.learning_rate"),
                       weight_decay=_field(config, "optimizer.weight_decay"),
                       num_steps=spec.num_steps, warmup_steps=spec.warmup_steps)
  return inputs, split
