"""The grid of a sweep: `config.grid` expanded into replicas and buckets.

`config.grid` declares the sweep (see experiments/coverage_sweep.py):

  grid.spaces          ((C, V), ...) or ((C, V, K), ...) (V may be a tuple of per-concept sizes)
  grid.coverages       (ρ, ...)
  grid.seeds           (s, ...)   (model init, data and the coverage split of a replica)
  grid.learning_rates  () = config.optimizer.learning_rate
  grid.weight_decays   () = config.optimizer.weight_decay
  grid.models          () = config.model; else dicts of config.model overrides, each with an
                       optional "name"
(Tuples, because ml_collections overrides tuples but not lists on the command line, where a
comma list or a single value is enough: --config.grid.seeds=0,1,2.)

The grid expands to replicas (product, in that order). Replicas whose static settings
(`run_spec.RunSpec`: space, model, batch) agree form a *bucket*, which trains in one compiled
program (`bindjax.training.bucket_programs`); coverage, seed, learning rate and weight decay are
per-replica arrays, so they never recompile. A config without a grid (experiments/train.py) is the
grid of one replica (`single_run_config`).
"""
import dataclasses
import itertools

import jax
import ml_collections
import numpy as np

from bindjax.core import coverage_splits
from bindjax.training import run_spec
from bindjax.workdir import layout
from bindjax.workdir import results


@dataclasses.dataclass(frozen=True)
class Replica:
  """One point of the grid; `coordinates()` tags its result rows."""
  index: int
  bucket: int
  num_concepts: int
  num_values: object         # int, or tuple of per-concept sizes
  max_objects: int
  space_size: int
  coverage: float
  seed: int
  learning_rate: float
  weight_decay: float
  model: str
  num_train: int

  def coordinates(self):
    """The replica's `results.COORDINATES` as a dict (V a list when per-concept)."""
    v = list(self.num_values) if isinstance(self.num_values, tuple) else self.num_values
    return dict(zip(results.COORDINATES, (
        self.index, self.bucket, self.num_concepts, v, self.max_objects, self.space_size,
        self.coverage, self.seed, self.learning_rate, self.weight_decay, self.model,
        self.num_train)))


@dataclasses.dataclass(frozen=True, eq=False)  # arrays have no single truth value
class BucketMember:
  """One replica of a bucket: its grid point, its per-replica arrays and its coverage split."""
  replica: Replica
  inputs: run_spec.ReplicaInputs
  split: coverage_splits.CoverageSplit


@dataclasses.dataclass
class Bucket:
  """Replicas sharing one RunSpec (one compiled program), in replica order; or a part of such a
  bucket (`part`), trained in a program of its own."""
  index: int
  spec: run_spec.RunSpec
  members: list    # BucketMember per replica
  start: int = 0   # a part's position in its bucket
  bucket_size: int | None = None   # a part's bucket's size (None: not a part)

  def part(self, start, stop):
    """The bucket's members at positions start..stop-1, as a Bucket of their own."""
    return Bucket(self.index, self.spec, self.members[start:stop], start, len(self.members))

  @property
  def key(self):
    """(bucket index, start): tells the parts of one bucket apart."""
    return self.index, self.start

  @property
  def members_range(self):
    """(start, stop) of a part that is not its whole bucket, else None."""
    if self.bucket_size is None or (self.start == 0 and len(self.members) == self.bucket_size):
      return None
    return self.start, self.start + len(self.members)

  def checkpoint_dir(self, workdir):
    """Where its checkpoints live in `workdir` (`layout.Workdir.bucket_dir`)."""
    return layout.Workdir(workdir).bucket_dir(self.index, self.members_range)

  @property
  def name(self):
    """How logs name it: "bucket 2", or "bucket 2 (replicas 9-17)" for a part."""
    span = self.members_range
    return f"bucket {self.index}" + (f" (replicas {span[0]}-{span[1] - 1})" if span else "")

  @property
  def replicas(self):
    """The members' grid points."""
    return [m.replica for m in self.members]

  def stacked_inputs(self):
    """The members' ReplicaInputs with a leading replica axis (numpy)."""
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *(m.inputs for m in self.members))


def _as_list(value, name):
  if isinstance(value, (list, tuple)):
    return list(value)
  raise ValueError(f"config.grid.{name}={value!r}: expected a tuple or list")


def _space_entry(entry, default_k):
  if not isinstance(entry, (list, tuple)) or len(entry) not in (2, 3):
    raise ValueError(f"config.grid.spaces entry {entry!r}: expected (C, V) or (C, V, K)")
  c, v = entry[0], entry[1]
  k = entry[2] if len(entry) == 3 else default_k
  v = tuple(v) if isinstance(v, (list, tuple)) else v
  return int(c), v, int(k)


def expand_grid(config):
  """Replicas and buckets of config.grid, validated (ValueError names the bad field).

  Returns (replicas, buckets). Replica order: spaces, models, learning rates, weight decays,
  coverages, seeds (the last varies fastest). Buckets appear in order of first replica.
  """
  spaces, models, lrs, wds, coverages, seeds = _grid_axes(config)
  base = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  replicas, buckets, by_spec = [], [], {}
  for space_entry, model, lr, wd, coverage, seed in itertools.product(
      spaces, models, lrs, wds, coverages, seeds):
    c, v, k = _space_entry(space_entry, int(config.space.max_objects))
    model = dict(model)
    model_name = str(model.pop("name", "default" if not model else
                               ",".join(f"{a}={b}" for a, b in sorted(model.items()))))
    replica_config = _replica_config(base, (c, v, k), model, lr, wd, coverage, seed)
    spec = run_spec.RunSpec.from_config(replica_config)
    inputs, split = run_spec.inputs_from_config(replica_config, spec)
    if spec not in by_spec:
      by_spec[spec] = Bucket(len(buckets), spec, [])
      buckets.append(by_spec[spec])
    bucket = by_spec[spec]
    replica = Replica(index=len(replicas), bucket=bucket.index, num_concepts=c,
                      num_values=v, max_objects=k, space_size=spec.space.num_objects,
                      coverage=float(coverage), seed=int(seed), learning_rate=float(lr),
                      weight_decay=float(wd), model=model_name, num_train=int(split.num_train))
    replicas.append(replica)
    bucket.members.append(BucketMember(replica, inputs, split))
  return replicas, buckets


def _grid_axes(config):
  """The grid's (spaces, models, learning rates, weight decays, coverages, seeds), validated;
  learning rate, weight decay and model default to the config's own."""
  if "grid" not in config:
    raise ValueError("config.grid is missing: a sweep needs grid.spaces, grid.coverages and "
                     "grid.seeds (see experiments/coverage_sweep.py)")
  grid = config.grid
  spaces = _as_list(grid.get("spaces"), "spaces")
  coverages = _as_list(grid.get("coverages"), "coverages")
  seeds = _as_list(grid.get("seeds"), "seeds")
  for name, values in (("spaces", spaces), ("coverages", coverages), ("seeds", seeds)):
    if not values:
      raise ValueError(f"config.grid.{name}=(): expected at least one value")
  lrs = _as_list(grid.get("learning_rates", []) or [], "learning_rates") or [
      config.optimizer.learning_rate]
  wds = _as_list(grid.get("weight_decays", []) or [], "weight_decays") or [
      config.optimizer.weight_decay]
  models = _as_list(grid.get("models", []) or [], "models") or [{}]
  for i, seed in enumerate(seeds):
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
      raise ValueError(f"config.grid.seeds[{i}]={seed!r}: expected an integer >= 0")
  for i, coverage in enumerate(coverages):
    try:
      coverage_splits.check_coverage(coverage)
    except ValueError:
      raise ValueError(f"config.grid.coverages[{i}]={coverage!r}: expected a number in "
                       f"(0, 1]") from None
  return spaces, models, lrs, wds, coverages, seeds


def _replica_config(base, space, model, lr, wd, coverage, seed):
  """The config of one replica: `base` (the sweep's config as a dict) with its space (C, V, K),
  model fields, learning rate, weight decay, coverage and seed."""
  c, v, k = space
  replica_config = ml_collections.ConfigDict(base)
  replica_config.space.num_concepts = c
  replica_config.space.num_values = list(v) if isinstance(v, tuple) else v
  replica_config.space.max_objects = k
  replica_config.coverage = float(coverage)
  replica_config.seed = int(seed)
  replica_config.optimizer.learning_rate = float(lr)
  replica_config.optimizer.weight_decay = float(wd)
  for key, value in model.items():
    if key not in replica_config.model:
      raise ValueError(f"config.grid.models entry {model!r}: unknown model field {key!r}; "
                       f"expected one of {sorted(replica_config.model.keys())}")
    replica_config.model[key] = value
  return replica_config


def single_run_config(config):
  """A single-run config (experiments/train.py: no grid) as the config of a one-replica sweep.

  The grid holds the run's own space, coverage and seed; learning rate, weight decay and model
  come from the config as they do for any sweep without those axes.
  """
  if "grid" in config:
    raise ValueError("config.grid is set: a config with a grid is a sweep; run it with "
                     "`bindjax sweep`")
  run_spec.RunSpec.from_config(config)   # errors name the single run's own fields
  c = ml_collections.ConfigDict(config.to_dict())
  values = c.space.num_values
  values = tuple(values) if isinstance(values, (list, tuple)) else values
  c.grid = ml_collections.ConfigDict(dict(
      spaces=((c.space.num_concepts, values, c.space.max_objects),), coverages=(c.coverage,),
      seeds=(c.seed,), learning_rates=(), weight_decays=(), models=()))
  return c
