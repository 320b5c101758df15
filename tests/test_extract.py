"""Extraction of embedding sets from trained dual encoders, and the end-to-end flow.

Semantics: docs/extraction.md.
"""
import json
import os
import shutil
import sys

import jax
import numpy as np
import pytest

from bindjax import cli
from bindjax import embeddings
from bindjax import extract
from bindjax import models
from bindjax import world
from bindjax.commands import extract as extract_command
from bindjax.geometry import interventions

SPACE = world.ObjectSpace((3, 2), 2)      # unequal V_c: concept-token offsets matter
TINY = dict(d_model=16, num_heads=2, num_layers=1, d_ff=32, d_out=8)


def trained(similarity="cosine", space=SPACE, seed=0):
  config = models.ModelConfig.for_space(space, similarity=similarity, **TINY)
  params = jax.jit(models.init_params, static_argnums=1)(jax.random.PRNGKey(seed), config)
  return extract.TrainedModel(params=params, model=config, space=space,
                              split=world.coverage_split(space, 0.5, 0), step=7,
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
  from bindjax.compat import torch_checkpoint  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "model.pt")
  torch_checkpoint.save_reference_checkpoint(cosine_model.params, cosine_model.model, path,
                                             global_step=11)
  with pytest.raises(ValueError, match="values_per_concept"):
    extract.load_reference(path)   # 5 concept tokens do not split equally over 2 concepts
  split_path = str(tmp_path / world.split_filename(0, 0.5))
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
  from bindjax import grid  # pylint: disable=g-import-not-at-top
  from bindjax import train  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="does not exist"):
    extract.load_workdir(tmp_path / "missing")
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(ValueError, match="no config.json"):
    extract.load_workdir(empty)
  config = train.default_config()
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
  assert held.num_scenes == (16 - world.num_train_objects(16, 0.75)) ** 2 == 16
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
