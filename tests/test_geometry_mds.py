"""MDS of attribute/shape quadruples (docs/geometry.md#mds) and its figures."""
import itertools
import json
import os
import sys

import numpy as np
import pytest

from bindjax.commands import mds as mds_command
from bindjax.frozen import embeddings
from bindjax.frozen.geometry import mds
from bindjax.frozen.geometry import planted
from bindjax.reporting.plots import mds as mds_plots

DATA = os.path.join(os.path.dirname(__file__), "data", "clevr_text")
SUM_ROWS, COMPOSITE_ROWS = (10, 11), (8, 9)


@pytest.fixture(scope="module")
def clevr_text():
  return embeddings.read_embeddings(DATA)


def test_noise_free_additive_sums_coincide_with_composites():
  es = planted.planted_set("position_dependent")
  quad = mds.parse_quadruple(es, "c0v0,c0v3,c1v1,c1v2")
  for bank in ("pos-avg",):
    result = mds.run_mds(es, quad, mds.MdsConfig(bank=bank, n_init=1))
    assert max(result["sum_to_composite_cosine_distance"]) < 1e-3
    distances = np.asarray(result["distances"])
    for s, c in zip(SUM_ROWS, COMPOSITE_ROWS):
      assert distances[s, c] < 1e-3
  # Position-free vectors: the slot-free bank is exact too (up to a common scale).
  es = planted.planted_set("position_independent")
  result = mds.run_mds(es, mds.parse_quadruple(es, "0,1,0,1"),
                       mds.MdsConfig(bank="obj-avg", n_init=1))
  assert max(result["sum_to_composite_cosine_distance"]) < 1e-3


def test_product_bound_sums_miss_their_composites():
  es = planted.planted_set("product")
  result = mds.run_mds(es, mds.parse_quadruple(es, "c0v0,c0v3,c1v1,c1v2"),
                       mds.MdsConfig(n_init=1))
  assert min(result["sum_to_composite_cosine_distance"]) > 0.1


def test_points_and_layout(clevr_text):
  quad = mds.parse_quadruple(clevr_text, "red,blue,cube,sphere")
  assert quad == mds.Quadruple((6, 0), (0, 2))
  labels, kinds, vectors = mds.quadruple_points(clevr_text, quad)
  assert kinds == ["attribute"] * 2 + ["shape"] * 2 + ["object"] * 4 + ["composite"] * 2 + [
      "sum"] * 2
  assert labels[:8] == ["red", "blue", "cube", "sphere", "red cube", "blue sphere",
                        "red sphere", "blue cube"]
  assert labels[8:10] == ["red cube + blue sphere", "red sphere + blue cube"]
  np.testing.assert_allclose(vectors[10], vectors[4] + vectors[5])
  # The composite is the real (centred) caption embedding of "a red cube and a blue sphere".
  row = [i for i, c in enumerate(clevr_text.captions) if c == "a red cube and a blue sphere"][0]
  two = clevr_text.embeddings[clevr_text.num_objects == 2].astype(np.float64)
  np.testing.assert_allclose(vectors[8], clevr_text.embeddings[row] - two.mean(0), atol=1e-5)
  result = mds.run_mds(clevr_text, quad, mds.MdsConfig(random_state=3, n_init=2))
  coords = np.array([p["coords"] for p in result["points"]])
  assert coords.shape == (12, 3) and np.isfinite(coords).all()
  assert result["stress"] > 0 and 0 < result["stress_1"] < 0.3
  assert result["lines"] == [[10, 8], [11, 9]]
  again = mds.run_mds(clevr_text, quad, mds.MdsConfig(random_state=3, n_init=2))
  np.testing.assert_allclose([p["coords"] for p in again["points"]], coords)


def test_clevr_text_sums_sit_next_to_their_own_composites(clevr_text):
  # Measured: sum→composite cosine distance 0.015–0.052, and in 150 of 168 quadruples each sum
  # is closer to its own composite than to the attribute-swapped one.
  ctx = mds.context(clevr_text)
  own_closer, total = 0, 0
  for (a, b), (x, y) in itertools.product(itertools.combinations(range(8), 2),
                                          itertools.permutations(range(3), 2)):
    _, _, vectors = mds.quadruple_points(clevr_text, mds.Quadruple((a, b), (x, y)), ctx=ctx)
    d = mds.cosine_distances(vectors)
    assert d[10, 8] < 0.06 and d[11, 9] < 0.06
    own_closer += (d[10, 8] < d[10, 9]) and (d[11, 9] < d[11, 8])
    total += 1
  assert total == 168 and own_closer / total > 0.8


def test_bad_quadruples_are_rejected(clevr_text):
  with pytest.raises(ValueError, match="'pink'.*blue"):
    mds.parse_quadruple(clevr_text, "red,pink,cube,sphere")
  with pytest.raises(ValueError, match="shape 'cone'"):
    mds.parse_quadruple(clevr_text, "red,blue,cube,cone")
  with pytest.raises(ValueError, match="4 values"):
    mds.parse_quadruple(clevr_text, "red,blue,cube")
  with pytest.raises(ValueError, match="two different"):
    mds.parse_quadruple(clevr_text, "red,red,cube,sphere")
  with pytest.raises(ValueError, match="'9'"):
    mds.parse_quadruple(clevr_text, "0,9,0,1")
  # A composite scene missing from the set.
  rows = [i for i, c in enumerate(clevr_text.captions) if c != "a red cube and a blue sphere"]
  subset = clevr_text.subset(rows)
  with pytest.raises(ValueError, match=r"composite scene \[red cube \+ blue sphere\]"):
    mds.quadruple_points(subset, mds.parse_quadruple(subset, "red,blue,cube,sphere"))
  singles_free = clevr_text.subset(np.flatnonzero(clevr_text.num_objects == 2))
  with pytest.raises(ValueError, match="single-object"):
    mds.quadruple_points(singles_free, mds.Quadruple((6, 0), (0, 2)),
                         mds.MdsConfig(bank="single-object"))


def _run_mds(monkeypatch, workdir, *extra):
  argv = ["bindjax mds", f"--embeddings={DATA}", f"--workdir={workdir}",
          "--quadruple=red,blue,cube,sphere", "--config=experiments/geometry.py:smoke",
          "--config.mds.n_init=1", *extra]
  monkeypatch.setattr(sys, "argv", argv)
  assert mds_command.main(argv) == 0


def test_command_writes_json_and_figures(tmp_path, monkeypatch):
  out = tmp_path / "mds"
  _run_mds(monkeypatch, out, "--quadruple=green,gray,cylinder,cube")
  assert sorted(os.listdir(out)) == [
      "mds_green-gray-cylinder-cube.json", "mds_green-gray-cylinder-cube.png", "mds_grid.png",
      "mds_red-blue-cube-sphere.json", "mds_red-blue-cube-sphere.png"]
  result = json.loads((out / "mds_red-blue-cube-sphere.json").read_text())
  assert result["bank"] == "pos-avg" and len(result["points"]) == 12
  for name in ("mds_grid.png", "mds_red-blue-cube-sphere.png"):
    assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  # The config's bank is the one used, and the one recorded.
  other = tmp_path / "obj_avg"
  _run_mds(monkeypatch, other, "--config.mds.bank=obj-avg")
  by_bank = json.loads((other / "mds_red-blue-cube-sphere.json").read_text())
  assert by_bank["bank"] == "obj-avg" and by_bank["distances"] != result["distances"]
  # A quadruple the set lacks: error, nothing written (not even the valid quadruple's files).
  bad = tmp_path / "bad"
  argv = ["bindjax mds", f"--embeddings={DATA}", f"--workdir={bad}",
          "--quadruple=red,blue,cube,sphere", "--quadruple=red,pink,cube,sphere"]
  monkeypatch.setattr(sys, "argv", argv)
  with pytest.raises(SystemExit) as e:
    mds_command.main(argv)
  assert e.value.code == 2 and not bad.exists()
  with pytest.raises(ValueError, match="at least one"):
    mds_plots.plot_grid([], str(tmp_path / "x.png"))
