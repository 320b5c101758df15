"""Extraction of embedding sets from trained dual encoders, and the end-to-end flow.

Semantics: docs/extraction.md.
"""
import dataclasses
import json
import os
import re
import shutil
import sys

import jax
import numpy as np
import pytest

from bindjax.commands import extract as extract_command
from bindjax.commands import main as cli
from bindjax.core import coverage_splits
from bindjax.core import model_config
from bindjax.core import models
from bindjax.core import world
from bindjax.frozen import embeddings
from bindjax.frozen import extract
from bindjax.frozen.geometry import interventions
from bindjax.runtime import parallel
from bindjax.training import bucket_programs
from bindjax.training import sweep
from bindjax.workdir import checkpoint
from bindjax.workdir import layout
import test_checkpoint
import test_sweep

SPACE = world.ObjectSpace((3, 2), 2)      # unequal V_c: concept-token offsets matter
TINY = dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, d_out=8)


def trained(similarity="cosine", space=SPACE, seed=0):
  config = model_config.ModelConfig.for_space(space, similarity=similarity, **TINY)
  params = jax.jit(models.init_params, static_argnums=1)(jax.random.PRNGKey(seed), config)
  return extract.TrainedModel(params=params, model=config, space=space,
                              split=coverage_splits.coverage_split(space, 0.5, 0), step=7,
                              source={"source": "test"})


def apply(model, method, tokens):
  fn = jax.jit(lambda p, t: models.DualEncoder(model.model).apply({"params": p}, t, method=method))
  return np.asarray(fn(model.params, tokens))


@pytest.fixture(scope="module")
def cosine_model():
  return trained()


def test_all_ordered_pairs_row_major_with_probe_vectors(cosine_model):
  es = extract.extract(cosine_model, "all")
  u = SPACE.num_objects
  assert (es.num_scenes, es.dim) == (u * u, 8)
  ids = np.arange(u)
  values = SPACE.object_values(ids)
  np.testing.assert_array_equal(es.objects[1], values[[0, 1]])        # scene 1 = [o_0, o_1]
  np.testing.assert_array_equal(es.objects[u], values[[1, 0]])
  np.testing.assert_array_equal(es.objects[:, 0], np.repeat(values, u, axis=0))
  np.testing.assert_array_equal(es.objects[:, 1], np.tile(values, (u, 1)))
  assert np.all(es.num_objects == 2)
  tokens = SPACE.scene_tokens(es.objects, es.num_objects)
  np.testing.assert_allclose(es.embeddings, apply(cosine_model, models.DualEncoder.encode_scenes,
                                                  tokens), rtol=1e-5, atol=1e-6)
  # Probe rows follow the set's own object ids (first appearance = ascending ids here).
  _, unique = es.object_ids()
  np.testing.assert_array_equal(unique, values)
  q = apply(cosine_model, models.DualEncoder.encode_queries, SPACE.object_query_tokens(ids))
  np.testing.assert_allclose(es.probes["object"], q / np.linalg.norm(q, axis=1, keepdims=True),
                             rtol=1e-5, atol=1e-6)
  c = apply(cosine_model, models.DualEncoder.encode_queries, SPACE.concept_query_tokens())
  c = c / np.linalg.norm(c, axis=1, keepdims=True)
  np.testing.assert_allclose(es.probes["concept_0"], c[:3], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(es.probes["concept_1"], c[3:], rtol=1e-5, atol=1e-6)
  assert es.provenance["step"] == 7 and es.provenance["objects"] == "all"


def test_train_and_heldout_objects(cosine_model):
  split = cosine_model.split
  for objects, ids in (("train", split.train_ids), ("held-out", split.heldout_ids)):
    es = extract.extract(cosine_model, objects, single_objects=True)
    ids = np.sort(ids)
    n = len(ids)
    assert es.num_scenes == n + n * n and es.provenance["object_ids"] == ids.tolist()
    np.testing.assert_array_equal(es.objects[:n, 0], SPACE.object_values(ids))
    assert np.all(es.num_objects[:n] == 1) and np.all(es.num_objects[n:] == 2)
    assert es.probes["object"].shape == (n, 8)
  full = extract.extract(cosine_model, "all")
  held = extract.extract(cosine_model, "held-out")
  # Same model, same scene -> same embedding, whatever the object subset.
  first = split.heldout_ids.min()
  row = first * SPACE.num_objects + first
  np.testing.assert_allclose(held.embeddings[0], full.embeddings[row], rtol=1e-5, atol=1e-6)
  no_split = extract.TrainedModel(**{**cosine_model.__dict__, "split": None})
  with pytest.raises(ValueError, match="split"):
    extract.extract(no_split, "train")
  with pytest.raises(ValueError, match="objects='some'"):
    extract.extract(cosine_model, "some")


def test_dot_model_probes_drop_the_bias():
  model = trained("dot")
  es = extract.extract(model, "all")
  q = apply(model, models.DualEncoder.encode_queries,
            SPACE.object_query_tokens(np.arange(SPACE.num_objects)))
  assert q.shape[1] == 9
  np.testing.assert_allclose(es.probes["object"], q[:, :8], rtol=1e-5, atol=1e-6)


def test_extracted_set_feeds_the_frozen_embedding_analyses(cosine_model, tmp_path):
  es = extract.extract(cosine_model, "all", single_objects=True)
  es.save(tmp_path / "set")
  loaded = embeddings.read_embeddings(tmp_path / "set")
  summary, _ = interventions.run_interventions(loaded, interventions.InterventionConfig())
  assert summary["probes"] == "stored"   # the query-tower probe vectors, no fitting
  # 6 objects = 3 attributes x 2 shapes: 36 pairs, 2·9 with equal shapes -> 2·18 cases.
  assert summary["num_cases"] == 36
  assert set(summary["results"]) == {"obj-avg", "pos-avg", "single-object"}


def test_reference_checkpoint_round_trip(cosine_model, tmp_path):
  from bindjax.frozen.compat import torch_checkpoint  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "model.pt")
  torch_checkpoint.save_reference_checkpoint(cosine_model.params, cosine_model.model, path,
                                             global_step=11)
  with pytest.raises(ValueError, match="values_per_concept"):
    extract.load_reference(path)   # 5 concept tokens do not split equally over 2 concepts
  split_path = str(tmp_path / coverage_splits.split_filename(0, 0.5))
  cosine_model.split.save(split_path, SPACE)
  loaded = extract.load_reference(path, values_per_concept=(3, 2), split_path=split_path)
  assert loaded.step == 11 and loaded.space == SPACE
  for objects in ("all", "held-out"):
    a = extract.extract(cosine_model, objects)
    b = extract.extract(loaded, objects)
    np.testing.assert_allclose(b.embeddings, a.embeddings, rtol=1e-4, atol=1e-5)
    for name in a.probes:
      np.testing.assert_allclose(b.probes[name], a.probes[name], rtol=1e-4, atol=1e-5)
  out = tmp_path / "from_pt"
  code = extract_command.main(["bindjax extract", f"--checkpoint={path}", f"--out={out}",
                               "--values_per_concept=3,2"])
  assert code == 0
  assert embeddings.read_embeddings(out).num_scenes == 36


def listing(path):
  return sorted(os.path.relpath(os.path.join(d, f), path)
                for d, _, files in os.walk(path) for f in files)


def test_unusable_workdirs_get_clear_errors_and_nothing_is_written(tmp_path):
  from bindjax.training import grid  # pylint: disable=g-import-not-at-top
  from bindjax.training import run_spec  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="does not exist"):
    extract.load_workdir(tmp_path / "missing")
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ValueError, match="no config.json"):
    extract.load_workdir(empty)
  config = run_spec.default_config()
  config.space.num_values = 3
  good = json.loads(grid.single_run_config(config).to_json_best_effort())
  bad = dict(good, model=dict(good["model"], num_heads=3))   # 256 is not divisible by 3
  for name, content, message in (("no_ckpt", good, "no checkpoint"),
                                 ("bad_config", bad, "cannot rebuild.*num_heads"),
                                 ("not_json", None, "cannot rebuild")):
    run = tmp_path / name
    run.mkdir()
    (run / "config.json").write_text("{not json" if content is None else json.dumps(content))
    before = listing(run)
    with pytest.raises(ValueError, match=message):
      extract.load_workdir(run)
    with pytest.raises(SystemExit) as e:
      extract_command.main(["bindjax extract", f"--workdir={run}"])
    assert e.value.code == 1 and listing(run) == before, name
  for argv in (["bindjax extract"], ["bindjax extract", f"--workdir={empty}", "--checkpoint=x.pt"]):
    with pytest.raises(SystemExit) as e:
      extract_command.main(argv)
    assert e.value.code == 2


# ------------------------------------------------------------------------------------------------
# End to end: `bindjax train` -> `bindjax extract` -> `bindjax complexity`.


def run_cli(monkeypatch, argv):
  # ml_collections reads --config.field overrides from sys.argv, as under the real CLI.
  monkeypatch.setattr(sys, "argv", ["bindjax"] + argv)
  return cli.main(argv)


# The smoke preset (C=2, V=4: 16 objects, coverage 0.75) for a few steps.
TRAIN_OVERRIDES = ["--config.num_steps=4", "--config.eval.every=2", "--config.eval.batches=1",
                   "--config.log_every=2", "--config.checkpoint.every=2", "--noprogress"]


@pytest.mark.slow
def test_train_extract_complexity_end_to_end(tmp_path, monkeypatch):
  run = tmp_path / "run"
  assert run_cli(monkeypatch, ["train", "--config=experiments/train.py:smoke",
                               *TRAIN_OVERRIDES, f"--workdir={run}"]) == 0
  assert run_cli(monkeypatch, ["extract", f"--workdir={run}", "--objects=all"]) == 0
  assert run_cli(monkeypatch, ["extract", f"--workdir={run}", "--objects=held-out"]) == 0
  es = embeddings.read_embeddings(run / "embeddings_all")
  assert es.num_scenes == 16 * 16 and sorted(es.probes) == ["concept_0", "concept_1", "object"]
  assert es.provenance["checkpoint"] == "best"
  held = embeddings.read_embeddings(run / "embeddings_held-out")
  assert held.num_scenes == (16 - coverage_splits.num_train_objects(16, 0.75)) ** 2 == 16
  # Refuses to write into the non-empty output directory: a usage error.
  with pytest.raises(SystemExit) as e:
    run_cli(monkeypatch, ["extract", f"--workdir={run}", "--objects=all"])
  assert e.value.code == 2
  out = tmp_path / "complexity"
  assert run_cli(monkeypatch, [
      "complexity", "--config=experiments/complexity.py:smoke",
      f"--config.embeddings={run / 'embeddings_all'}", "--config.models=additive,product",
      "--config.train_fractions=(0.5,)", "--config.steps=50", "--config.eval_every=25",
      f"--workdir={out}"]) == 0
  results = json.loads((out / "results.json").read_text())
  # One fit per model at fraction 0.5 of the 16 objects: 8 training objects, on all 256 pairs.
  assert sorted(row["name"] for row in results["rows"]) == ["additive", "product"]
  assert results["num_scenes"] == 256 and results["num_objects"] == 16
  assert all(row["num_train_objects"] == 8 for row in results["rows"])
  # A config that no longer matches the checkpoint is reported, not silently restored.
  changed = tmp_path / "changed"
  shutil.copytree(run, changed)
  config = json.loads((changed / "config.json").read_text())
  config["model"]["d_model"] *= 2
  (changed / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="does not match|cannot be read"):
    extract.load_workdir(changed)


# ------------------------------------------------------------------------------------------------
# One replica of a sweep bucket: its row of the parameters it returns, nothing else.


@pytest.fixture(scope="module")
def sweep_workdir(tmp_path_factory):
  """test_sweep's tiny sweep: 12 replicas in one bucket (16 rows once padded), half of them
  diverged (no best parameters), the others with best parameters from step 3 or 6."""
  workdir = tmp_path_factory.mktemp("extract_sweep") / "run"
  sweep.run_sweep(test_sweep.tiny_config(), workdir, progress=False, log=lambda _: None)
  return workdir


def _step_dir(workdir):
  """The folder of the bucket's newest checkpoint."""
  directory = layout.Workdir(workdir).bucket_dir(0)
  return directory / str(max(int(p.name) for p in directory.iterdir()))


def _abstract_state(workdir, ckpt):
  """(bucket, its abstract state as the sweep trains it, one device)."""
  _, _, (bucket,) = extract.read_buckets(workdir)
  inputs, _ = parallel.pad_to_multiple(bucket.stacked_inputs(),
                                       ckpt.metadata()["padded_replicas"])
  abstract = jax.eval_shape(
      lambda h: bucket_programs.init_bucket_state(h, bucket.spec, True), inputs)
  return bucket, abstract, jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _whole_restore(workdir):
  """(bucket, state): the bucket's newest checkpoint restored whole, optimiser state and all
  replicas included, onto one device (how extraction read it before reading one row)."""
  with checkpoint.Checkpoints(layout.Workdir(workdir).bucket_dir(0)) as ckpt:
    bucket, abstract, device = _abstract_state(workdir, ckpt)
    _, state, _ = bucket_programs.restore_state(ckpt.restore, abstract, device)
  return bucket, parallel.to_host(state)


def _expected(state, k, which):
  """(step, "best" or "latest", parameters) of replica k from the whole state."""
  best_step = int(state["best"]["step"][k])
  if which == "best" and best_step >= 0:
    return best_step, "best", jax.tree.map(lambda x: x[k], state["best"]["params"])
  return (int(state["train"].step[k]), "latest",
          jax.tree.map(lambda x: x[k], state["train"].params))


def _assert_identical(got, expected):
  def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
  jax.tree.map(same, jax.tree.map(np.asarray, got), expected)


@pytest.mark.slow
def test_one_replica_read_is_bit_identical_to_the_whole_restore(sweep_workdir, monkeypatch):
  bucket, state = _whole_restore(sweep_workdir)
  assert [r.index for r in bucket.replicas] == list(range(12))
  # The replica's own row is all that is read: never the bucket.
  monkeypatch.setattr(extract, "load_bucket", None)
  # Each kind of read (asked for, found) at the first and the last row that has it.
  rows_of = {}
  for which in extract.CHECKPOINTS:
    for k in range(12):
      rows_of.setdefault((which, _expected(state, k, which)[1]), []).append(k)
  assert set(rows_of) == {("best", "best"), ("best", "latest"), ("latest", "latest")}
  for (which, _), ks in rows_of.items():
    for k in sorted({ks[0], ks[-1]}):
      trained = extract.load_workdir(sweep_workdir, which, replica=k)
      step, kind, params = _expected(state, k, which)
      assert (trained.step, trained.source["checkpoint"]) == (step, kind), (which, k)
      _assert_identical(trained.params, params)
      got = extract.extract(trained, "all")
      expected = extract.extract(dataclasses.replace(trained, params=params), "all")
      assert got.embeddings.tobytes() == expected.embeddings.tobytes()
      for name in expected.probes:
        assert got.probes[name].tobytes() == expected.probes[name].tobytes()


@pytest.mark.slow
def test_one_replica_read_reads_no_optimiser_state_and_no_other_replica(sweep_workdir, tmp_path):
  _, state = _whole_restore(sweep_workdir)
  k = 4                                  # best parameters from step 3 (earlier than the latest)
  assert 0 <= state["best"]["step"][k] < state["train"].step[k]
  expected = {which: extract.load_workdir(sweep_workdir, which, replica=k)
              for which in extract.CHECKPOINTS}
  # The parameters alone (every replica): the optimiser state's chunks gone, the bucket still
  # loads for `bindjax binding`, while the whole restore cannot.
  no_moments = tmp_path / "no_moments"
  shutil.copytree(sweep_workdir, no_moments)
  assert test_checkpoint.delete_chunks(
      _step_dir(no_moments) / "state", lambda name, _: ".opt_state." in name) > 0
  bucket = extract.load_bucket(no_moments, 0, "best")
  _assert_identical(bucket.trained(k).params, jax.tree.map(np.asarray, expected["best"].params))
  with pytest.raises(checkpoint.CorruptCheckpointError, match="cannot be read"):
    _whole_restore(no_moments)
  # One replica: every chunk gone but row k of the parameters and steps (no optimiser state,
  # no other replica's row), and it still extracts, bit for bit.
  one_row = tmp_path / "one_row"
  shutil.copytree(sweep_workdir, one_row)
  kept = (".params.", ".step")
  assert test_checkpoint.delete_chunks(
      _step_dir(one_row) / "state",
      lambda name, chunk: chunk[0] != k or not any(part in name for part in kept)
      or ".opt_state." in name) > 0
  for which in extract.CHECKPOINTS:
    trained = extract.load_workdir(one_row, which, replica=k)
    assert trained.step == expected[which].step
    _assert_identical(trained.params, jax.tree.map(np.asarray, expected[which].params))
  with pytest.raises(ValueError, match="cannot be read"):
    extract.load_workdir(one_row, "best", replica=k + 1)
  with pytest.raises(ValueError, match="cannot be read"):
    extract.load_bucket(one_row, 0, "best")


@pytest.mark.slow
def test_a_damaged_row_of_the_replica_is_refused(sweep_workdir, tmp_path):
  damaged = tmp_path / "damaged"
  shutil.copytree(sweep_workdir, damaged)
  k = 4
  assert extract.load_workdir(sweep_workdir, "best", replica=k).source["checkpoint"] == "best"
  name = "best.params.scene_tower.proj.kernel"
  test_checkpoint.flip_bit(_step_dir(damaged) / "state", name, k)
  with pytest.raises(checkpoint.CorruptCheckpointError,
                     match=rf"^workdir {re.escape(str(damaged))}: checkpoint "
                           rf"{re.escape(str(_step_dir(damaged)))}: row {k} of "
                           r"array \['best'\]\['params'\]\['scene_tower'\]\['proj'\]"
                           r"\['kernel'\] does not match the checksum recorded when it was saved "
                           r"\(corrupt data\)$"):
    extract.load_workdir(damaged, "best", replica=k)
  # The latest parameters of k, and every other replica, are untouched and still extract.
  extract.load_workdir(damaged, "latest", replica=k)
  extract.load_workdir(damaged, "best", replica=k + 1)
  with pytest.raises(SystemExit) as e:
    extract_command.main(["bindjax extract", f"--workdir={damaged}", f"--replica={k}",
                          f"--out={tmp_path / 'out'}"])
  assert e.value.code == 1


@pytest.mark.slow
def test_a_checkpoint_without_row_checksums_extracts_through_the_whole_restore(sweep_workdir,
                                                                                tmp_path):
  old = tmp_path / "old"
  shutil.copytree(sweep_workdir, old)
  directory = layout.Workdir(old).bucket_dir(0)
  with checkpoint.Checkpoints(directory) as ckpt:
    _, abstract, device = _abstract_state(old, ckpt)
    step, state, metadata = ckpt.restore(bucket_programs.checkpoint_target(abstract, device))
  shutil.rmtree(directory)
  test_checkpoint.save_without_row_checksums(directory, step, state, metadata)
  with checkpoint.Checkpoints(directory) as ckpt:
    assert ckpt.restore_row(checkpoint.abstract_target(state), 0) is None
  for which in extract.CHECKPOINTS:
    for k in (0, 4, 7):
      expected = extract.load_workdir(sweep_workdir, which, replica=k)
      trained = extract.load_workdir(old, which, replica=k)
      assert (trained.step, trained.source) == (expected.step, dict(expected.source,
                                                                    workdir=str(old)))
      _assert_identical(trained.params, jax.tree.map(np.asarray, expected.params))
  # Verified as before: a flipped bit anywhere in an array it reads is refused.
  test_checkpoint.flip_bit(_step_dir(old) / "state", "train.params.query_tower.proj.kernel", 9)
  with pytest.raises(checkpoint.CorruptCheckpointError,
                     match=r"array \['train'\].params\['query_tower'\]\['proj'\]\['kernel'\] "
                           "does not match the checksum"):
    extract.load_workdir(old, "latest", replica=0)
