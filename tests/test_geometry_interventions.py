"""Object-replacement interventions (docs/geometry.md#interventions) and the interventions table."""
import json
import os
import random
import sys

import numpy as np
import pytest

from bindjax.commands import interventions as interventions_command
from bindjax.commands import interventions_table as table_command
from bindjax.frozen import embeddings
from bindjax.frozen.geometry import common
from bindjax.frozen.geometry import interventions
from bindjax.frozen.geometry import planted
from bindjax.frozen.probes import linear
from bindjax.frozen.probes import probe_analysis

DATA = os.path.join(os.path.dirname(__file__), "data", "clevr_text")
PROBE = linear.ProbeConfig(steps=300)
SMALL_FLAGS = ["--config=experiments/geometry.py:smoke", "--config.probe.steps=300"]


def config(**kwargs):
  return interventions.InterventionConfig(probe=PROBE, **kwargs)


def run_command(module, monkeypatch, argv):
  # ml_collections reads --config.field overrides from sys.argv, as under the real CLI.
  monkeypatch.setattr(sys, "argv", list(argv))
  try:
    return module.main(argv)
  except SystemExit as e:   # the command policy's exits: 1 bad input, 2 usage
    return e.code


@pytest.fixture(scope="module")
def clevr_text():
  es = embeddings.read_embeddings(DATA)
  return es, interventions.run_interventions(es, config(strengths=(1.0, 0.0)))


def test_clevr_text_case_count_follows_the_rule(clevr_text):
  es, (summary, rows) = clevr_text
  # 24 objects = 8 attributes x 3 shapes; 576 ordered pairs, of which 3·64 share the shape.
  # Rule: every pair with two different shapes, left edit then right edit -> 2·384 cases.
  assert summary["num_two_object_scenes"] == 576
  assert summary["num_scenes_with_different_shapes"] == 576 - 3 * 8 * 8 == 384
  assert summary["num_cases"] == 768
  for bank in ("obj-avg", "pos-avg", "single-object"):
    result = summary["results"][bank]
    assert sum(result["skipped"].values()) == 0
    metrics = result["by_strength"]["1"]
    assert metrics["all"]["cases"] == 768
    # Same attribute, different shapes: 8 attributes x 6 ordered shape pairs x 2 edits.
    assert metrics["shared_attribute"]["cases"] == 96
    assert metrics["different_attribute"]["cases"] == 672
  assert len(rows) == 768 * 3 * 2


def test_targets_follow_the_seeded_generator_and_order(clevr_text):
  es, (summary, rows) = clevr_text
  index = common.scene_index(es)
  cases = interventions.enumerate_cases(es, index, config())
  rng = random.Random(42)
  expected = []
  for row, ids in zip(index.rows_N, index.ids_Nx2):
    (a1, s1), (a2, s2) = index.unique_UxC[ids]
    if s1 == s2:
      continue
    target = rng.choice([a for a in range(8) if a not in (a1, a2)])
    expected += [(int(row), 0, target), (int(row), 1, target)]
  assert [(c.scene_row, c.slot, c.target) for c in cases] == expected
  for case in cases:
    counterpart = es.objects[case.counterpart_row]
    original = es.objects[case.scene_row]
    assert counterpart[case.slot, 0] == case.target and counterpart[case.slot, 1] == original[
        case.slot, 1]
    assert np.array_equal(counterpart[1 - case.slot], original[1 - case.slot])
  per_object = interventions.enumerate_cases(es, index, config(target_draws="per_object"))
  assert len(per_object) == 768
  assert [c.target for c in per_object] != [c.target for c in cases]


def test_clevr_text_results(clevr_text):
  _, (summary, rows) = clevr_text
  res = {b: r["by_strength"]["1"] for b, r in summary["results"].items()}
  # Measured on these MiniLM captions: pos-avg 0.927, obj-avg 0.811 (0.814 counting each scene
  # once instead of each slot occurrence), single-object 0.401.
  assert res["pos-avg"]["all"]["retrieval"] > 0.9
  assert 0.7 < res["obj-avg"]["all"]["retrieval"] < res["pos-avg"]["all"]["retrieval"]
  assert res["single-object"]["all"]["retrieval"] < res["obj-avg"]["all"]["retrieval"]
  for bank in res:
    # Averaging over slot occurrences makes one exact tie on this set; ties are reported.
    assert res[bank]["all"]["ties"] == (1 if bank == "obj-avg" else 0)
    # Recolouring is harder when both objects share the attribute being changed.
    assert (res[bank]["shared_attribute"]["retrieval"] <
            res[bank]["different_attribute"]["retrieval"])
    assert res[bank]["all"]["retrieval_order_insensitive"] >= res[bank]["all"]["retrieval"]
  assert summary["probes"] == "fitted" and res["pos-avg"]["all"]["probe"] > 0.95
  # k = 0 leaves the scene unchanged: it retrieves itself, never the counterpart.
  assert summary["results"]["pos-avg"]["by_strength"]["0"]["all"]["retrieval"] == 0.0
  hits = [r for r in rows if r["bank"] == "pos-avg" and r["k"] == 1.0 and r["hit"]]
  assert hits and all(r["top_row"] == r["counterpart_row"] for r in hits)


def test_planted_position_dependent_pos_avg_retrieves_everything():
  es = planted.planted_set("position_dependent", noise=0.05)
  summary, _ = interventions.run_interventions(es, config(probes="none"))
  assert summary["num_cases"] == 2 * (144 - 3 * 16)
  res = {b: r["by_strength"]["1"]["all"] for b, r in summary["results"].items()}
  assert res["pos-avg"]["retrieval"] == 1.0
  assert res["obj-avg"]["retrieval"] < 0.8


def test_planted_position_independent_ties_are_reported():
  es = planted.planted_set("position_independent")
  summary, rows = interventions.run_interventions(es, config(banks=("obj-avg", "pos-avg"),
                                                            probes="none"))
  for bank in ("obj-avg", "pos-avg"):
    m = summary["results"][bank]["by_strength"]["1"]["all"]
    # The counterpart and its swapped order embed identically: a tie, counted as a miss.
    assert m["ties"] == m["cases"] == summary["num_cases"]
    assert m["retrieval"] == 0.0 and m["retrieval_order_insensitive"] == 1.0
  assert all(r["tie"] and not r["hit"] for r in rows)


def test_planted_product_binding_defeats_replacement():
  es = planted.planted_set("product")
  summary, _ = interventions.run_interventions(es, config(probes="none"))
  assert summary["probes"] is None and summary["results"]
  for result in summary["results"].values():
    m = result["by_strength"]["1"]["all"]
    assert m["retrieval"] < 0.05 and "probe" not in m


def test_missing_control_scenes_are_skipped_and_counted():
  full = planted.planted_set("position_dependent", noise=0.05)
  rng = np.random.RandomState(0)
  two = full.two_object_rows()
  dropped = set(rng.choice(two, 30, replace=False).tolist())
  singles_dropped = {0, 5}   # objects 0 and 5 lose their single-object scene
  es = full.subset([r for r in range(full.num_scenes) if r not in dropped | singles_dropped])
  summary, rows = interventions.run_interventions(es, config(probes="none"))
  index = common.scene_index(es)
  scenes = {tuple(map(tuple, es.objects[r].tolist())) for r in index.rows_N}
  cases = interventions.enumerate_cases(es, index, config())
  absent = 0
  for case in cases:
    objs = [list(o) for o in es.objects[case.scene_row]]
    objs[case.slot][0] = case.target
    absent += tuple(map(tuple, objs)) not in scenes
  assert absent > 0 and summary["results"]
  for bank, result in summary["results"].items():
    assert result["skipped"]["counterpart_absent"] == absent
    evaluated = result["by_strength"]["1"]["all"]["cases"]
    assert evaluated + sum(result["skipped"].values()) == summary["num_cases"]
  assert summary["results"]["single-object"]["skipped"]["bank_vector_absent"] > 0
  assert summary["results"]["pos-avg"]["skipped"]["bank_vector_absent"] == 0
  assert sum(1 for r in rows if r.get("skipped") == "counterpart_absent") == absent


def test_bad_input_is_rejected_and_nothing_written(tmp_path, monkeypatch):
  es = planted.planted_set("position_dependent", single_objects=False)
  with pytest.raises(ValueError, match="single-object"):
    interventions.run_interventions(es, config(banks=("single-object",)))
  with pytest.raises(ValueError, match="attribute_concept"):
    interventions.run_interventions(es, config(attribute_concept=1, shape_concept=1))
  with pytest.raises(ValueError, match="probes='stored'"):
    interventions.run_interventions(es, config(probes="stored"))
  summary, _ = interventions.run_interventions(es, config(probes="none"))
  assert summary["banks"] == ["obj-avg", "pos-avg"]
  es.save(tmp_path / "set")
  # A bank the set cannot provide is bad input (1); values no set could use are usage errors (2).
  for extra, expected in ((["--config.interventions.banks=single-object"], 1),
                          (["--config.interventions.strengths=one"], 2),
                          (["--config.interventions.banks=avg"], 2)):
    out = tmp_path / "out"
    code = run_command(interventions_command, monkeypatch, [
        "bindjax interventions", f"--embeddings={tmp_path / 'set'}", f"--workdir={out}",
        *SMALL_FLAGS, *extra])
    assert code == expected and not out.exists(), extra


def test_command_and_table(tmp_path, monkeypatch, capsys):
  planted.planted_set("position_dependent", noise=0.05).save(tmp_path / "dep")
  planted.planted_set("position_independent", single_objects=False).save(tmp_path / "indep")
  for name in ("dep", "indep"):
    code = run_command(interventions_command, monkeypatch, [
        "bindjax interventions", f"--embeddings={tmp_path / name}",
        f"--workdir={tmp_path / ('run_' + name)}", *SMALL_FLAGS,
        "--config.interventions.strengths=1,2", "--config.interventions.probes=none",
        f"--config.model_name=model_{name}"])
    assert code == 0
  summary = json.loads((tmp_path / "run_dep" / interventions.SUMMARY_FILE).read_text())
  assert summary["dataset"] == "dep" and summary["model"] == "model_dep"
  assert set(summary["results"]["pos-avg"]["by_strength"]) == {"1", "2"}
  lines = (tmp_path / "run_dep" / interventions.CASES_FILE).read_text().splitlines()
  assert len(lines) == summary["num_cases"] * 3 * 2
  assert {"case", "bank", "k", "hit", "tie", "order_insensitive_hit"} <= set(json.loads(lines[0]))
  out = tmp_path / "tables"
  code = table_command.main(["bindjax interventions-table",
                             f"--summaries={tmp_path / 'run_dep'},{tmp_path / 'run_indep'}",
                             f"--workdir={out}"])
  assert code == 0
  markdown = (out / "interventions_table.md").read_text().splitlines()
  assert markdown[0] == "| dataset | model | obj-avg | pos-avg | single-object |"
  assert markdown[2].startswith("| dep | model_dep |") and "1.00" in markdown[2]
  # The independent set has no single-object scenes (–) and only ties (0.00).
  assert markdown[3] == "| indep | model_indep | 0.00 | 0.00 | – |"
  latex = (out / "interventions_table.tex").read_text()
  assert r"\begin{tabular}{llccc}" in latex and r"indep & model\_indep & 0.00 & 0.00 & --" in latex
  with pytest.raises(SystemExit) as e:
    table_command.main(["bindjax interventions-table", f"--summaries={tmp_path / 'nope'}",
                        f"--workdir={tmp_path / 'tables2'}"])
  assert e.value.code == 1 and not (tmp_path / "tables2").exists()
  md, _ = interventions.summary_table([interventions.load_summary(tmp_path / "run_dep")],
                                      strength=2, metric="retrieval_order_insensitive",
                                      group="all")
  assert "| dep | model_dep |" in md
  with pytest.raises(ValueError, match="k=3"):
    interventions.summary_table([interventions.load_summary(tmp_path / "run_dep")], strength=3,
                                metric="retrieval", group="all")


def test_probes_file_replaces_fitting(clevr_text, tmp_path):
  """Probe vectors written by `bindjax probe` are used as they are (no fit); a bad file is
  rejected up front, naming it."""
  es, _ = clevr_text
  rng = np.random.default_rng(0)
  probes = {f"concept_{c}": rng.normal(size=(v, es.embeddings.shape[1])).astype(np.float32)
            for c, v in enumerate(es.values_per_concept)}
  probes["object"] = rng.normal(size=(24, es.embeddings.shape[1])).astype(np.float32)
  path, _ = probe_analysis.write_probes(probes, {}, str(tmp_path))
  summary, _ = interventions.run_interventions(es, config(banks=("pos-avg",), probes_file=path))
  assert summary["probes"] == path
  assert summary["results"]["pos-avg"]["by_strength"]["1"]["all"]["probe"] < 0.5  # random
  (tmp_path / "bad.npz").write_text("not an npz")
  with pytest.raises(ValueError, match="bad.npz"):
    interventions.run_interventions(es, config(probes_file=str(tmp_path / "bad.npz")))
