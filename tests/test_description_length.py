"""Prequential description length (docs/complexity.md, "Description length"): block partition,
planted families, determinism, config errors, and the `bindjax complexity` option.

Bits per scene are printed by the tests (`pytest -s`).
"""
import json
import os
import sys

import jax
import numpy as np
import pytest

from bindjax.commands import complexity as complexity_command
from bindjax.complexity import data as data_lib
from bindjax.complexity import description_length as dl
from bindjax.complexity import families
from bindjax.complexity import fit_settings
from bindjax.frozen.probes import linear
from bindjax.frozen.probes import probe_analysis
from bindjax.runtime import engine
from test_complexity import DATA, REPO, make_data

# All 625 ordered 2-object scenes of 5 × 5 values, D = 8, planted and fitted with E = 2. Every
# planted test fits with the same shapes and settings, so later tests reuse the compiled programs,
# on one device (unbatched models compile faster than the 8-device sharded batch).
V5 = (5, 5)
CODE = dl.CodeConfig(block_fractions=(0.2, 0.4, 0.6, 0.8), restarts=2)
FIT = fit_settings.FitConfig(steps=2000, eval_every=2000, **fit_settings.ORIGINAL)
LEARNING_RATES = (1e-2,)
# Families: the two planted ones and sum_product, which contains both and comes second on
# additive data (docs/complexity.md, "Description length", has the other families too).
FAMILIES = {f: families.make(f, V5, 2, out_dim=8, embed_dim=2)
            for f in ("additive", "product", "sum_product")}


def planted(family, draw=5):
  """ComplexityData of all scenes, embeddings planted by `family` with random parameters."""
  objects, ids = data_lib.all_scenes(V5, 2)
  model = FAMILIES[family]
  targets = model.apply(model.init(jax.random.PRNGKey(draw)), objects)
  return make_data(V5, objects, ids, np.asarray(targets))


def code(models, data, seed=0):
  """Description-length rows of `models` on `data`, the planted tests' settings, one device."""
  return dl.measure(models, data, [seed], LEARNING_RATES, CODE, FIT, mesh=engine.auto_mesh(1))


def bits_per_scene(rows):
  return {r["name"]: round(r["bits_per_scene"], 2) for r in rows}


@pytest.fixture(scope="module")
def additive_rows():
  return code(list(FAMILIES.values()), planted("additive"))


def test_blocks_partition_the_scenes_by_object_prefix():
  objects, ids = data_lib.all_scenes((8, 3), 2)
  data = make_data((8, 3), objects, ids, np.zeros((len(ids), 4)))
  boundaries = dl.block_boundaries(24, (0.1, 0.3, 0.31, 0.5, 0.9))
  assert boundaries == [2, 7, 12, 21, 24]  # 0.3 and 0.31 give the same 7 objects: one boundary
  for seed in (0, 3):
    permutation, _ = data_lib.object_split(24, 0.5, seed)
    block_N = dl.scene_blocks(ids, permutation, boundaries)
    assert sorted(set(block_N.tolist())) == list(range(len(boundaries)))
    covered = np.zeros(len(ids), int)
    for j, k in enumerate(boundaries):
      within_N = np.asarray(data_lib.scene_masks(data.object_ids_NxK, permutation, k)[0])
      before_N = (np.asarray(data_lib.scene_masks(data.object_ids_NxK, permutation,
                                                   boundaries[j - 1])[0]) if j else
                  np.zeros(len(ids), bool))
      in_block = within_N & ~before_N
      np.testing.assert_array_equal(block_N == j, in_block)
      covered += in_block
    assert (covered == 1).all()
  points, coords = dl.candidates(24, [0, 3], [1e-2, 3e-3], dl.CodeConfig(block_fractions=(
      0.1, 0.5), restarts=2))
  assert len(coords) == 2 * 2 * 2 * 2
  # Block j is coded by fits on the first boundaries[j − 1] objects of the seed's permutation.
  first_restarts = [int(n) for n, c in zip(points.num_train_M, coords) if c[2:] == (1e-2, 0)]
  assert first_restarts == [2, 12] * 2


def test_planted_additive_data_has_the_shortest_additive_code(additive_rows):
  report = bits_per_scene(additive_rows)
  print("additive planted, bits per scene:", report,
        "baseline", round(additive_rows[0]["baseline_bits_per_scene"], 2))
  assert min(report, key=report.get) == "additive"
  assert report["additive"] < min(v for k, v in report.items() if k != "additive") - 5
  for row in additive_rows:
    assert sum(b["num_scenes"] for b in row["blocks"]) == 625
    assert row["total_bits"] == pytest.approx(sum(b["bits"] for b in row["blocks"]))
    # Block 0 is the baseline code, shared by every family.
    assert row["blocks"][0]["bits"] == additive_rows[0]["blocks"][0]["bits"]
    assert row["num_parameters"] == FAMILIES[row["family"]].num_parameters()


def test_planted_product_data_is_coded_shorter_by_the_product_family():
  models = [FAMILIES["additive"], FAMILIES["product"]]
  rows = code(models, planted("product"))
  report = bits_per_scene(rows)
  print("product planted, bits per scene:", report)
  assert report["product"] < report["additive"] - 10


def test_code_length_is_deterministic_given_the_seed(additive_rows):
  data = planted("additive")
  (again,) = code([FAMILIES["additive"]], data)
  assert again == additive_rows[0]
  (other,) = code([FAMILIES["additive"]], data, seed=1)
  assert other["total_bits"] != again["total_bits"]


@pytest.mark.parametrize("fields,named", [
    ({"block_fractions": (0.5, 0.3)}, "block_fractions"),
    ({"block_fractions": (0.2, 1.0)}, "block_fractions"),
    ({"block_fractions": ()}, "block_fractions"),
    ({"restarts": 0}, "restarts"),
    ({"precision": 0.0}, "precision")])
def test_bad_code_config_names_the_field(fields, named):
  with pytest.raises(ValueError, match=named):
    dl.CodeConfig(**fields).validate()


@pytest.mark.skipif(not os.path.isdir(DATA), reason="tests/data/clevr_text missing")
def test_complexity_command_writes_the_description_length(tmp_path, capsys, monkeypatch):
  workdir = str(tmp_path / "grid")
  # Random probes from a file: the test needs no probe fit (the code does not use probes).
  weights = linear.init_weights(jax.random.PRNGKey(0), (8, 3), 24, 384, linear.ProbeConfig())
  probes_file, _ = probe_analysis.write_probes(linear.weights_to_probes(weights, (8, 3)), {},
                                               str(tmp_path))
  argv = ["bindjax complexity", f"--config={REPO}/experiments/complexity.py:smoke",
          f"--config.embeddings={DATA}", f"--workdir={workdir}", "--config.models=additive",
          "--config.train_fractions=(0.5,)", "--config.steps=50", "--config.eval_every=50",
          f"--config.probes_file={probes_file}", "--config.description_length=True",
          "--config.dl_block_fractions=(0.3,0.6)", "--config.dl_restarts=1", "--noprogress"]
  monkeypatch.setattr(sys, "argv", list(argv))
  assert complexity_command.main(argv) == 0
  with open(os.path.join(workdir, "description_length.json")) as f:
    written = json.load(f)
  (row,) = written["rows"]
  assert row["name"] == "additive" and row["num_scenes"] == 576 and row["num_blocks"] == 3
  assert [b["objects"] for b in row["blocks"]] == [[0, 7], [7, 14], [14, 24]]
  with open(os.path.join(workdir, "description_length.csv")) as f:
    assert f.read().splitlines()[0] == ",".join(dl.CSV_COLUMNS)
  assert "bits/scene" in capsys.readouterr().out


@pytest.mark.skipif(not os.path.isdir(DATA), reason="tests/data/clevr_text missing")
def test_bad_description_length_config_is_a_one_line_error(tmp_path, capsys, monkeypatch):
  """A bad dl_* setting is a usage error (exit 2) before any fit, naming the field."""
  workdir = tmp_path / "grid"
  argv = ["bindjax complexity", f"--config={REPO}/experiments/complexity.py:smoke",
          f"--config.embeddings={DATA}", f"--workdir={workdir}",
          "--config.description_length=True", "--config.dl_restarts=0"]
  monkeypatch.setattr(sys, "argv", list(argv))
  with pytest.raises(SystemExit) as e:
    complexity_command.main(argv)
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "dl_restarts" in err[0], err
  assert not workdir.exists()
