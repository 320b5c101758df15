"""Trained dual encoder -> EmbeddingSet, so every frozen-embedding analysis runs on it.

Semantics: docs/extraction.md.

Sources: one replica of a `bindjax train` or `bindjax sweep` workdir (config.json + orbax
checkpoints; the best parameters by default) or an original PyTorch checkpoint file (through
bindjax.frozen.compat.torch_checkpoint, no torch needed).

Objects: all |O| ids, or the training / held-out ids of the run's coverage split, ascending.
Scenes: every ordered pair of those objects including identical ones, row-major (scene 1 is
[o_0, o_1]); optionally preceded by each object alone. Embeddings come from the scene tower.
Probes: "concept_{c}" [V_c, D] = normalised query-tower outputs of concept c's tokens, "object"
[U, D] = normalised outputs of the object queries, rows in the set's object_ids() order (which is
ascending id order here). For "dot" models the per-query bias (last output) is dropped and the
vectors are kept unnormalised, so dot products rank like the model's logits up to that bias.
"""
import contextlib
import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bindjax.base import errors
from bindjax.base import files
from bindjax.core import coverage_splits
from bindjax.core import model_config
from bindjax.core import models
from bindjax.core import world
from bindjax.frozen import embeddings

OBJECT_SETS = ("all", "train", "held-out")
CHECKPOINTS = ("best", "latest")


@dataclasses.dataclass(frozen=True)
class TrainedModel:
  """Parameters of a dual encoder with the object space and split it was trained on."""
  params: dict
  model: model_config.ModelConfig
  space: world.ObjectSpace
  split: coverage_splits.CoverageSplit | None
  step: int
  source: dict


def _has_steps(directory):
  return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


def _read_run(workdir):
  """(loop settings, replicas, buckets) of the run in `workdir` (`run_spec.LoopSpec`, the grid's
  `grid.expand_grid`); ValueError naming what is wrong."""
  from bindjax.training import grid  # pylint: disable=g-import-not-at-top
  from bindjax.training import run_spec  # pylint: disable=g-import-not-at-top
  from bindjax.workdir import layout  # pylint: disable=g-import-not-at-top
  from bindjax.workdir import results  # pylint: disable=g-import-not-at-top
  if not workdir.is_dir():
    raise ValueError(f"workdir {workdir} does not exist")
  config_path = layout.Workdir(workdir).config_file
  if not config_path.exists():
    raise ValueError(f"workdir {workdir}: no {layout.CONFIG_FILE}; expected a `bindjax train` or "
                     "`bindjax sweep` workdir (or pass a PyTorch checkpoint file with "
                     "--checkpoint)")
  try:
    with config_path.open() as f:
      config = ml_collections.ConfigDict(results.with_added_settings(json.load(f)))
    replicas, buckets = grid.expand_grid(config)
    settings = run_spec.LoopSpec.from_config(config)
  except (ValueError, TypeError, KeyError, AttributeError, json.JSONDecodeError) as e:
    raise ValueError(f"{config_path}: cannot rebuild the models from this config: {e}") from None
  return settings, replicas, buckets


@dataclasses.dataclass(frozen=True)
class TrainedBucket:
  """Parameters of every replica of one sweep bucket (leading axis R, in bucket order), with
  the object space, each replica's coverage split and the step its parameters are from."""
  params: dict
  model: model_config.ModelConfig
  space: world.ObjectSpace
  splits: list          # coverage_splits.CoverageSplit per replica
  steps: np.ndarray     # int [R]
  checkpoints: list     # "best" or "latest" per replica (what its parameters are)
  replicas: list        # the sweep's Replica of each row
  workdir: str

  def trained(self, position):
    """TrainedModel of the replica at `position` in this bucket."""
    replica = self.replicas[position]
    return TrainedModel(
        params=jax.tree.map(lambda x: x[position], self.params), model=self.model,
        space=self.space, split=self.splits[position], step=int(self.steps[position]),
        source={"source": "bindjax_workdir", "workdir": self.workdir, "replica": replica.index,
                "checkpoint": self.checkpoints[position],
                "coordinates": replica.coordinates()})


def read_buckets(workdir):
  """(loop settings, replicas, buckets) of a `bindjax train` or `bindjax sweep` workdir
  (ValueError naming what is wrong)."""
  return _read_run(files.as_path(workdir))


@contextlib.contextmanager
def _bucket_checkpoint(workdir, bucket, keep_best):
  """(checkpoints, step, state) of the bucket's newest checkpoint: state is the bucket state's
  abstract per-layer layout on one device, as that checkpoint holds it. What goes wrong reading
  it becomes a ValueError naming the workdir (a CorruptCheckpointError for damaged files)."""
  from bindjax.runtime import parallel  # pylint: disable=g-import-not-at-top
  from bindjax.training import bucket_programs  # pylint: disable=g-import-not-at-top
  from bindjax.workdir import checkpoint  # pylint: disable=g-import-not-at-top
  from bindjax.workdir import layout  # pylint: disable=g-import-not-at-top
  directory = bucket.checkpoint_dir(workdir)
  if not _has_steps(directory):
    raise ValueError(f"workdir {workdir}: no checkpoint under {directory} (expected <step>/ "
                     "folders); has the run saved one yet?")
  ckpt = checkpoint.Checkpoints(directory)
  try:
    step = ckpt.latest_step()
    padded = int(ckpt.metadata(step).get("padded_replicas", len(bucket.replicas)))
    inputs, _ = parallel.pad_to_multiple(bucket.stacked_inputs(), padded)
    abstract = jax.eval_shape(
        lambda h: bucket_programs.init_bucket_state(h, bucket.spec, keep_best), inputs)
    yield ckpt, step, bucket_programs.checkpoint_target(abstract, _device())
  except checkpoint.CorruptCheckpointError as e:
    raise checkpoint.CorruptCheckpointError(f"workdir {workdir}: {e}") from None
  except Exception as e:  # orbax raises many types for mismatched trees
    raise ValueError(f"workdir {workdir}: the checkpoint in {directory} does not match the models "
                     f"of {layout.CONFIG_FILE}: {type(e).__name__}: {e}") from None
  finally:
    ckpt.close()


def _device():
  return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _only(state, train=(), best=()):
  """The bucket state `state` with every leaf `checkpoint.SKIP` (not read) but the fields
  `train` of its TrainState and `best` of its best-parameters record."""
  from bindjax.workdir import checkpoint  # pylint: disable=g-import-not-at-top
  skip = jax.tree.map(lambda _: checkpoint.SKIP, state)
  out = dict(skip, train=skip["train"].replace(**{f: getattr(state["train"], f) for f in train}))
  if best:
    out["best"] = dict(skip["best"], **{f: state["best"][f] for f in best})
  return out


def _choice(train_steps, best_steps):
  """(steps, which replicas take their best parameters) from the replicas' train steps and best
  steps (-1: none yet; None: the run kept no best parameters)."""
  steps = np.asarray(train_steps).astype(np.int64)
  if best_steps is None:
    return steps, np.zeros(steps.shape, bool)
  best_steps = np.asarray(best_steps)
  use_best = best_steps >= 0
  return np.where(use_best, best_steps, steps), use_best


def _trained_bucket(workdir, bucket, params, steps, use_best, positions):
  """TrainedBucket of the replicas at `positions` of `bucket` (params: their stacked parameters,
  in the layout the model trains in)."""
  return TrainedBucket(params=params, model=bucket.spec.model, space=bucket.spec.space,
                       splits=[bucket.members[p].split for p in positions], steps=steps,
                       checkpoints=["best" if b else "latest" for b in use_best],
                       replicas=[bucket.replicas[p] for p in positions], workdir=str(workdir))


def load_bucket(workdir, bucket, which="best", run=None):
  """TrainedBucket of bucket number `bucket` of a `bindjax train` or `bindjax sweep` workdir.

  which: "best" (each replica's parameters at its best held-out object accuracy; the latest ones
  for a replica the run kept no best for or that has not evaluated yet) or "latest". Reads the
  parameters and steps of every replica from the bucket's newest checkpoint, not its optimiser
  state. run: `read_buckets(workdir)` when the caller has it already. ValueError naming what is
  missing or wrong; reads only: never creates files in the workdir.
  """
  if which not in CHECKPOINTS:
    raise ValueError(f"checkpoint {which!r}: expected one of {CHECKPOINTS}")
  workdir = files.as_path(workdir)
  settings, _, buckets = run or _read_run(workdir)
  bucket = buckets[bucket]
  keep_best = settings.keep_best
  use_best = which == "best" and keep_best
  loaded = [_load_part(workdir, part, keep_best, use_best) for part in _parts(workdir, bucket)]
  params, steps, best = (jax.tree.map(lambda *xs: np.concatenate(xs), *column)
                         for column in zip(*loaded))
  return _trained_bucket(workdir, bucket, params, steps, best, range(len(bucket.replicas)))


def _parts(workdir, bucket):
  """The bucket, or the parts of it that a packed sweep trained and checkpointed on their own
  (docs/training.md, "Lanes"), in order."""
  from bindjax.workdir import layout  # pylint: disable=g-import-not-at-top
  spans = layout.Workdir(workdir).bucket_parts(bucket.index)
  return [bucket.part(start, stop) for start, stop in spans] if spans else [bucket]


def _load_part(workdir, bucket, keep_best, use_best):
  """(parameters, steps, which take their best parameters) of every replica of a bucket or of a
  part of one, from its newest checkpoint: the parameters and steps only."""
  from bindjax.runtime import parallel  # pylint: disable=g-import-not-at-top
  from bindjax.training import bucket_programs  # pylint: disable=g-import-not-at-top
  fields = ("params", "step")
  with _bucket_checkpoint(workdir, bucket, keep_best) as (ckpt, step, state):
    _, state, _ = ckpt.restore(_only(state, fields, fields if use_best else ()), step=step)
    params = {"latest": state["train"].params}
    if use_best:
      params["best"] = state["best"]["params"]
    params = parallel.to_host(bucket_programs.from_checkpoint(params, _device()))
  size = len(bucket.replicas)
  params = jax.tree.map(lambda x: x[:size], params)
  steps, best = _choice(np.asarray(state["train"].step)[:size],
                        np.asarray(state["best"]["step"])[:size] if use_best else None)
  chosen = params["latest"]
  if "best" in params:
    chosen = jax.tree.map(
        lambda b, l: np.where(best.reshape((-1,) + (1,) * (l.ndim - 1)), b, l),
        params["best"], chosen)
  return chosen, steps, best


def _load_replica(workdir, keep_best, bucket, position, which):
  """TrainedModel of the replica at `position` of `bucket`, read alone: the one row of the
  arrays it needs (`checkpoint.Checkpoints.restore_row`). None when the bucket's newest
  checkpoint records no row checksums (one written before they were)."""
  use_best = which == "best" and keep_best
  with _bucket_checkpoint(workdir, bucket, keep_best) as (ckpt, step, state):
    read = ckpt.restore_row(_only(state, ("step",), ("step",) if use_best else ()), position,
                            step=step)
    if read is None:
      return None
    _, row, _ = read
    steps, use_best = _choice([row["train"].step], [row["best"]["step"]] if use_best else None)
    fields = _only(state, best=("params",)) if use_best[0] else _only(state, train=("params",))
    _, row, _ = ckpt.restore_row(fields, position, step=step)
  params = row["best"]["params"] if use_best[0] else row["train"].params
  params = jax.tree.map(lambda x: np.asarray(x)[None], models.stack_blocks(params))
  return _trained_bucket(workdir, bucket, params, steps, use_best, [position]).trained(0)


def load_workdir(workdir, which="best", replica=None):
  """TrainedModel of one replica of a `bindjax train` or `bindjax sweep` workdir.

  replica: its index in replicas.json; may be omitted when the workdir holds one replica (a
  `bindjax train` run). which: as in `load_bucket`. Reads that replica's row of the parameters
  it returns and of the steps alone, each verified against the checksum its save recorded for
  it; a checkpoint written before row checksums were recorded is read as `load_bucket` reads it.
  ValueError naming what is missing or wrong (errors.ConfigError for a `which` or `replica` the
  workdir cannot serve); reads only: never creates files in the workdir.
  """
  from bindjax.workdir import layout  # pylint: disable=g-import-not-at-top
  if which not in CHECKPOINTS:
    raise errors.ConfigError(f"checkpoint {which!r}: expected one of {CHECKPOINTS}")
  workdir = files.as_path(workdir)
  run = _read_run(workdir)
  settings, replicas, buckets = run
  if replica is None:
    if len(replicas) != 1:
      raise errors.ConfigError(
          f"workdir {workdir} holds {len(replicas)} replicas: pass --replica=N, N in "
          f"0..{len(replicas) - 1} ({layout.REPLICAS_FILE} lists them)")
    replica = 0
  if not 0 <= replica < len(replicas):
    raise errors.ConfigError(f"replica={replica}: expected 0..{len(replicas) - 1} (workdir "
                             f"{workdir} holds {len(replicas)} replicas)")
  chosen = replicas[replica]
  bucket = buckets[chosen.bucket]
  position = bucket.replicas.index(chosen)
  part = next(p for p in _parts(workdir, bucket) if chosen in p.replicas)
  trained = _load_replica(workdir, settings.keep_best, part, position - part.start, which)
  if trained is None:
    trained = load_bucket(workdir, chosen.bucket, which, run).trained(position)
  return trained


def load_reference(path, values_per_concept=None, split_path=None):
  """TrainedModel from an original PyTorch dual-encoder checkpoint file.

  values_per_concept: per-concept value counts (default: Σ V_c from the vocabulary shared equally
  by the C concepts of the query length); split_path: a split file
  (docs/file_formats.md#split-files), needed for objects="train" / "held-out".
  """
  from bindjax.frozen.compat import torch_checkpoint  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  if not os.path.exists(path):
    raise ValueError(f"checkpoint file {path} does not exist")
  params, fields, step = torch_checkpoint.load_reference_checkpoint(path)
  model = model_config.ModelConfig(**fields)
  num_concepts = model.query_length - 3
  num_tokens = model.vocab_size - 4
  if num_concepts < 1 or (model.scene_length - 1) % (num_concepts + 2):
    raise ValueError(f"{path}: scene_length={model.scene_length}, query_length="
                     f"{model.query_length} do not fit the scene and query lengths "
                     "(C+2)·K+1 and C+3")
  max_objects = (model.scene_length - 1) // (num_concepts + 2)
  if values_per_concept is None:
    if num_tokens % num_concepts:
      raise ValueError(f"{path}: {num_tokens} concept tokens do not split equally over "
                       f"{num_concepts} concepts; pass values_per_concept")
    values_per_concept = (num_tokens // num_concepts,) * num_concepts
  values_per_concept = tuple(int(v) for v in values_per_concept)
  if len(values_per_concept) != num_concepts or sum(values_per_concept) != num_tokens:
    raise ValueError(f"values_per_concept={list(values_per_concept)}: the checkpoint has "
                     f"{num_concepts} concepts and {num_tokens} concept tokens")
  space = world.ObjectSpace(values_per_concept, max_objects)
  split = coverage_splits.CoverageSplit.load(split_path, space) if split_path else None
  params = jax.tree_util.tree_map(jnp.asarray, params)
  return TrainedModel(params=params, model=model, space=space, split=split, step=step,
                      source={"source": "reference_checkpoint", "checkpoint_file":
                              os.path.abspath(path), "split_file": split_path})


def object_ids_for(trained, objects):
  """Ascending object ids of `objects` (all | train | held-out)."""
  if objects not in OBJECT_SETS:
    raise ValueError(f"objects={objects!r}: expected one of {OBJECT_SETS}")
  if objects == "all":
    trained.space.check_enumerable("extraction of all objects")
    return np.arange(trained.space.num_objects, dtype=np.int32)
  if trained.split is None:
    raise ValueError(f"objects={objects!r} needs the coverage split; this model has none "
                     "(pass the split file)")
  ids = trained.split.train_ids if objects == "train" else trained.split.heldout_ids
  if len(ids) == 0:
    raise ValueError(f"objects={objects!r}: the split has no such objects (coverage "
                     f"{trained.split.coverage})")
  return np.sort(np.asarray(ids, np.int32))


@functools.partial(jax.jit, static_argnames=("config", "tower"))
def _apply_towers(params_R, tokens_BxL, config, tower):
  method = (models.DualEncoder.encode_scenes if tower == "scene"
            else models.DualEncoder.encode_queries)
  return jax.vmap(lambda p: models.DualEncoder(config).apply({"params": p}, tokens_BxL,
                                                             method=method))(params_R)


def _encode(params_R, config, tower, tokens_NxL, batch_size):
  """[R, N, D] outputs of one tower for every replica of params_R (float32 host numpy)."""
  fn = functools.partial(_apply_towers, config=config, tower=tower)
  n = len(tokens_NxL)
  # Chunks of a power-of-two size: few compiled shapes across object subsets.
  size = min(batch_size, 1 << max(n - 1, 0).bit_length())
  out = []
  for start in range(0, n, size):
    chunk = tokens_NxL[start:start + size]
    pad = size - len(chunk)
    if pad:  # one compiled shape: pad the last chunk with copies of its first row
      chunk = np.concatenate([chunk, np.repeat(chunk[:1], pad, axis=0)])
    out.append(np.asarray(fn(params_R, jnp.asarray(chunk)))[:, :size - pad])
  return np.concatenate(out, axis=1).astype(np.float32)


def _probe_vectors(config, q_RxQxD):
  if config.similarity == "dot":
    return q_RxQxD[..., :-1]
  return q_RxQxD / (models.NORM_EPS + np.linalg.norm(q_RxQxD, axis=-1, keepdims=True))


def check_pairs(model, space):
  """ValueError unless a model of `model` on `space` can embed two-object scenes."""
  if space.max_objects < 2:
    raise ValueError(f"scenes are pairs of objects but the model was trained with max_objects="
                     f"{space.max_objects}")
  if (model.scene_length, model.query_length) != (space.scene_length, space.query_length):
    raise ValueError(f"model lengths {model.scene_length}/{model.query_length} "
                     f"do not match the space's {space.scene_length}/{space.query_length}")


def pair_scenes(space, ids_U, single_objects=False):
  """(objects [N, K, C], num_objects [N]) of every ordered pair of the objects ids_U, row-major,
  optionally preceded by each object alone (docs/extraction.md, "Scenes")."""
  values_UxC = space.object_values(ids_U)
  num_u, num_c = len(ids_U), space.num_concepts
  first_P, second_P = coverage_splits.ordered_pairs(num_u)
  objects_NxKxC = np.full((num_u * num_u, space.max_objects, num_c), -1, np.int32)
  objects_NxKxC[:, 0] = values_UxC[first_P]
  objects_NxKxC[:, 1] = values_UxC[second_P]
  num_objects_N = np.full(num_u * num_u, 2, np.int32)
  if single_objects:
    singles = np.full((num_u, space.max_objects, num_c), -1, np.int32)
    singles[:, 0] = values_UxC
    objects_NxKxC = np.concatenate([singles, objects_NxKxC])
    num_objects_N = np.concatenate([np.ones(num_u, np.int32), num_objects_N])
  return objects_NxKxC, num_objects_N


def encode_replicas(params_R, model, space, ids_U, objects_NxKxC, num_objects_N,
                    batch_size=4096):
  """Scene embeddings [R, N, D] of the given scenes and probe vectors of the objects ids_U for
  every replica of the stacked parameters params_R (leading axis R): one vmapped forward pass
  per chunk of batch_size scenes. Probes: {"concept_{c}": [R, V_c, D'], "object": [R, U, D']}
  (docs/extraction.md, "Probe vectors")."""
  tokens_NxL = np.asarray(space.scene_tokens(objects_NxKxC, num_objects_N))
  z_RxNxD = _encode(params_R, model, "scene", tokens_NxL, batch_size)
  concept_tokens = np.asarray(space.concept_query_tokens())
  queries = np.concatenate([concept_tokens, np.asarray(space.object_query_tokens(ids_U))])
  q_RxQxD = _probe_vectors(model, _encode(params_R, model, "query", queries, batch_size))
  concept_q, object_q = np.split(q_RxQxD, [len(concept_tokens)], axis=1)
  offsets = space.concept_token_offsets
  probes = {f"concept_{c}": concept_q[:, offsets[c]:offsets[c] + v]
            for c, v in enumerate(space.values_per_concept)}
  probes["object"] = object_q
  return z_RxNxD, probes


def embedding_set(trained, objects, ids_U, objects_NxKxC, num_objects_N, z_NxD, probes):
  """The validated EmbeddingSet of one replica's embeddings and probes, with its provenance
  (source, step, objects, similarity and, when the model has one, its coverage split)."""
  provenance = dict(trained.source, step=trained.step, objects=objects,
                    object_ids=np.asarray(ids_U).tolist(), similarity=trained.model.similarity,
                    single_objects=bool((num_objects_N == 1).any()),
                    model="bindjax dual encoder")
  if trained.split is not None:
    provenance["coverage"] = float(trained.split.coverage)
    provenance["coverage_split"] = {"permutation": trained.split.permutation.tolist(),
                                    "num_train": trained.split.num_train}
  out = embeddings.EmbeddingSet(z_NxD, objects_NxKxC, num_objects_N,
                                trained.space.values_per_concept, provenance=provenance,
                                probes=probes)
  out.validate()
  return out


def extract(trained, objects="all", single_objects=False, batch_size=4096):
  """EmbeddingSet of all ordered pairs of the chosen objects, with probe vectors.

  See docs/extraction.md.
  """
  check_pairs(trained.model, trained.space)
  ids_U = object_ids_for(trained, objects)
  objects_NxKxC, num_objects_N = pair_scenes(trained.space, ids_U, single_objects)
  params_1 = jax.tree.map(lambda x: x[None], trained.params)
  z_1xNxD, probes = encode_replicas(params_1, trained.model, trained.space, ids_U,
                                    objects_NxKxC, num_objects_N, batch_size)
  return embedding_set(trained, objects, ids_U, objects_NxKxC, num_objects_N, z_1xNxD[0],
                       {name: v[0] for name, v in probes.items()})
