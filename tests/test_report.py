"""Report on synthetic sweep rows: planted critical coverages are recovered."""
import json
import os

import numpy as np
import pytest

from bindjax.base import files
from bindjax.commands import report as report_command
from bindjax.reporting import metrics
from bindjax.reporting import report
from bindjax.reporting import tables
from bindjax.reporting import statistics
from bindjax.reporting.plots import phase_transition
from bindjax.workdir import results

PLANTED = {(2, 20): 0.5, (2, 50): 0.32, (3, 50): 0.3}
COVERAGES = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


def _rows(planted=PLANTED, seeds=(0, 1, 2), noise=0.03, steps=(100, 200)):
  rng = np.random.default_rng(0)
  rows, replica = [], 0
  for (c, v), rho in planted.items():
    for coverage in COVERAGES:
      for seed in seeds:
        shift = rng.normal(0, 0.01)
        for step in steps:
          late = step == steps[-1]
          acc = 1 / (1 + np.exp(-25 * (coverage - rho - shift)))
          acc = float(np.clip(acc * (1.0 if late else 0.8) + rng.normal(0, noise), 0, 1))
          rows.append({"kind": "eval", "replica": replica, "C": c, "V": v, "K": 2,
                       "space_size": v ** c, "model": "tiny", "learning_rate": 3e-4,
                       "weight_decay": 0.1, "coverage": coverage, "seed": seed, "step": step,
                       "heldout/object_accuracy": acc, "heldout/object_accuracy_2obj": acc,
                       "heldout/object_accuracy_1obj": min(1.0, acc + 0.3),
                       "heldout/concept_accuracy": 0.95})
        replica += 1
  return rows


def _write(workdir, rows, torn=False):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "results.jsonl"), "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
    if torn:
      f.write('{"kind": "eval", "repl')


def test_logistic_fit_recovers_crossing():
  x = np.repeat(COVERAGES, 3)
  y = 1 / (1 + np.exp(-30 * (x - 0.37)))
  fit = statistics.fit_logistic(x, y)
  assert fit["status"] == "fit" and abs(fit["rho_star"] - 0.37) < 0.005
  assert statistics.fit_logistic(x, np.zeros_like(x))["status"] == "below"
  assert statistics.fit_logistic(x, np.ones_like(x))["status"] == "above"
  assert statistics.fit_logistic([0.5, 0.5], [0.1, 0.9])["status"] == "too_few"


def test_scaling_laws():
  sizes = np.array([400, 2500, 125000])
  laws = statistics.fit_scaling_laws(sizes, 0.9 * sizes ** -0.1)
  assert abs(laws["power_law"]["b"] + 0.1) < 1e-6 and abs(laws["power_law"]["a"] - 0.9) < 1e-6
  assert laws["best"] == "power_law" and laws["power_law"]["r2"] > 0.999
  assert statistics.fit_scaling_laws([400, 2500], [0.5, 0.3]) is None
  assert "concept_log_linear" not in statistics.fit_scaling_laws(sizes, [0.5, 0.4, 0.3], [2, 2, 2])


def test_concept_law_separates_concepts_from_size():
  # Planted: ρ* = 1.2 − 0.25·log10|O| + 0.05·C, at two C = 2 sizes and two C = 3 sizes.
  sizes = np.array([100, 144, 125, 216])
  concepts = np.array([2, 2, 3, 3])
  rho = 1.2 - 0.25 * np.log10(sizes) + 0.05 * concepts
  law = statistics.fit_scaling_laws(sizes, rho, concepts)["concept_log_linear"]
  assert np.allclose([law["a"], law["b"], law["c"]], [1.2, -0.25, 0.05])
  assert law["residual_dof"] == 1 and law["r2"] > 0.999
  assert set(law["curves"]) == {"2", "3"}
  # One C only, or C that only ever comes with one size, leaves c undetermined.
  assert statistics.fit_concept_law(sizes[:2], concepts[:2], rho[:2]) is None
  assert statistics.fit_concept_law([100, 125], [2, 3], [0.8, 0.6]) is None
  # Intervals come from the points' own: a tight point interval gives a tight c around 0.05,
  # a wide one an interval that holds 0 as well.
  for se, holds_zero in ((0.002, False), (0.1, True)):
    rows = [{"space_size": n, "C": c, "rho_star": r, "standard_error": se, "num_seeds": 4}
            for n, c, r in zip(sizes, concepts, rho)]
    laws = statistics.scaling_law_intervals(rows, statistics.fit_scaling_laws(sizes, rho, concepts),
                                            num_draws=400)
    low, high = laws["concept_log_linear"]["c_interval"]
    assert low < 0.05 < high and (low < 0 < high) == holds_zero, (se, low, high)


def test_predictions_at_sizes_not_run_follow_each_law_and_its_refits():
  """Planted ρ* = 1.2 − 0.25·log10|O| + 0.05·C: each law's prediction at a new size is its own
  value there, the concept law's moves with C and the size laws' do not, and every range holds
  its value and narrows with the points' standard errors."""
  sizes = np.array([100, 144, 125, 216])
  concepts = np.array([2, 2, 3, 3])
  rho = 1.2 - 0.25 * np.log10(sizes) + 0.05 * concepts
  widths = []
  for se in (0.002, 0.05):
    rows = [{"space_size": n, "C": c, "rho_star": r, "standard_error": se, "num_seeds": 4}
            for n, c, r in zip(sizes, concepts, rho)]
    laws = statistics.scaling_law_intervals(rows, statistics.fit_scaling_laws(sizes, rho, concepts),
                                            num_draws=400, predict_at=[(400, 2), (400, 4)])
    at_c2, at_c4 = laws["predictions"]
    assert (at_c2["space_size"], at_c2["C"], at_c4["C"]) == (400, 2, 4)
    assert np.isclose(at_c2["concept_log_linear"]["rho_star"], 1.2 - 0.25 * np.log10(400) + 0.1)
    assert np.isclose(at_c4["concept_log_linear"]["rho_star"] - at_c2["concept_log_linear"]
                      ["rho_star"], 0.1)
    assert at_c2["power_law"] == at_c4["power_law"]
    for p in (at_c2, at_c4):
      for law in ("power_law", "log_linear", "concept_log_linear"):
        low, high = p[law]["range"]
        assert low <= p[law]["rho_star"] <= high, (se, law, p[law])
    widths.append(np.diff(at_c4["concept_log_linear"]["range"])[0])
  assert widths[0] < widths[1] / 5
  assert "| 400 | 4 |" in tables.markdown_table([], laws, "final")


def test_select_best_and_final():
  rows = _rows(planted={(2, 20): 0.5}, seeds=(0,))
  best = results.select_evaluations(rows, "best")
  final = results.select_evaluations(rows, "final")
  assert len(best) == len(final) == len(COVERAGES)
  assert all(r["step"] == 200 for r in final)
  with pytest.raises(ValueError, match="step='last'"):
    results.select_evaluations(rows, "last")


def test_select_at_a_step_reads_the_sweep_as_it_stood():
  """An integer step takes each replica's last evaluation at or before it; a divergence after
  it is not counted, one before it is; a replica first evaluated after it is an error naming it."""
  rows = _rows(planted={(2, 20): 0.5}, seeds=(0,), steps=(100, 200, 300))
  rows.append({"kind": "diverged", "replica": 1, "step": 250, "diverged": True,
               "diverged_step": 250})
  assert results.parse_step("250") == 250 and results.parse_step("final") == "final"
  for step, expected in ((100, 100), (199, 100), (200, 200), (10_000, 300)):
    chosen = results.select_evaluations(rows, str(step))
    assert [r["replica"] for r in chosen] == list(range(len(COVERAGES)))
    assert {r["step"] for r in chosen if r["replica"] != 1} == {expected}
    assert chosen[1]["diverged"] == (step >= 250), step
  with pytest.raises(ValueError, match="step=99: replica 0 has no evaluation.*step 100"):
    results.select_evaluations(rows, 99)
  for bad in ("-1", "1e3", "last"):
    with pytest.raises(ValueError, match="expected one of"):
      results.parse_step(bad)


def test_report_at_a_step_equals_the_report_of_rows_cut_there(tmp_path, capsys):
  """`--step=N` gives the ρ* table of results.jsonl filtered to steps <= N, and says which step
  it read; a --step that is neither a choice nor a number is a usage error."""
  rows = _rows(planted={(2, 20): 0.5, (2, 50): 0.32}, seeds=(0, 1, 2))
  _write(str(tmp_path / "all"), rows)
  _write(str(tmp_path / "cut"), [r for r in rows if r["step"] <= 150])
  tables = []
  for name, step in (("all", "150"), ("cut", "final")):
    out = tmp_path / f"out_{name}"
    assert report_command.main(["bindjax report", f"--workdir={tmp_path / name}", f"--out={out}",
                                "--draws=20", f"--step={step}"]) == 0
    tables.append(json.loads((out / "critical_coverage.json").read_text())["critical_coverage"])
  assert tables[0] == tables[1]
  assert "step ≤ 150" in capsys.readouterr().out
  assert "at or before step 150" in (tmp_path / "out_all" / "critical_coverage.md").read_text()
  assert abs(tables[0][0]["rho_star"] - 0.5) > 0.01  # the early rows differ from the final ones


def _sweep_with_config(workdir, rows, **config):
  _write(workdir, rows)
  files.write_json(os.path.join(workdir, "config.json"),
                   {"grid": {"coverages": sorted({r["coverage"] for r in rows})},
                    "sweep": {"packing": "auto"}, "num_steps": 200, **config})


def test_pooled_sweeps_make_one_curve_and_refuse_what_cannot_pool(tmp_path):
  """Two sweeps of one setting at different coverages pool into the curve of one sweep holding
  both; configs that differ outside the grid, or a coverage and seed held twice, are refused."""
  rows = _rows(planted={(2, 20): 0.5}, seeds=(0, 1, 2))
  low = [r for r in rows if r["coverage"] < 0.45]
  high = [dict(r, replica=r["replica"] + 1000) for r in rows if r["coverage"] >= 0.45]
  _sweep_with_config(str(tmp_path / "whole"), rows)
  _sweep_with_config(str(tmp_path / "low"), low)
  _sweep_with_config(str(tmp_path / "high"), high, sweep={"packing": "bucket"})
  whole = report.make_report(str(tmp_path / "whole"), num_draws=20, formats=("png",),
                             out_dir=str(tmp_path / "r_whole"))
  pooled = report.make_report([str(tmp_path / "low"), str(tmp_path / "high")], pool=True,
                              num_draws=20, formats=("png",), out_dir=str(tmp_path / "r_pool"))
  apart = report.make_report([str(tmp_path / "low"), str(tmp_path / "high")], num_draws=20,
                             formats=("png",), out_dir=str(tmp_path / "r_apart"))
  assert pooled["critical_coverage"] == whole["critical_coverage"] and pooled["pooled"]
  assert len(apart["critical_coverage"]) == 2   # without --pool, a curve per sweep
  _sweep_with_config(str(tmp_path / "other"), high, optimizer={"learning_rate": 1.0})
  with pytest.raises(ValueError, match="differ in optimizer.learning_rate"):
    report.make_report([str(tmp_path / "low"), str(tmp_path / "other")], pool=True,
                       out_dir=str(tmp_path / "r_other"))
  with pytest.raises(ValueError, match="both hold coverage 0.1, seed 0"):
    report.make_report([str(tmp_path / "low"), str(tmp_path / "whole")], pool=True,
                       out_dir=str(tmp_path / "r_twice"))


def test_two_concept_counts_at_one_size_make_one_law(tmp_path):
  """|O| = 256 at C = 2 and C = 4 beside two more sizes: one law over all four series, whose
  term in C is fitted from the pair at one |O|."""
  planted = {(2, 10): 0.8, (2, 14): 0.58, (2, 16): 0.57, (4, 4): 0.34}
  _write(str(tmp_path / "sweep"), _rows(planted=planted, noise=0.01))
  summary = report.make_report(str(tmp_path / "sweep"), num_draws=50, formats=("png",),
                               out_dir=str(tmp_path / "out"))
  laws = summary["scaling_law"]
  assert laws["num_points"] == 4
  # The pair at |O| = 256 alone sets c: (0.34 − 0.57) / (4 − 2).
  concept = laws["concept_log_linear"]
  assert abs(concept["c"] - (-0.115)) < 0.02 and concept["c_interval"][1] < 0


def test_no_formats_writes_the_tables_alone(tmp_path, monkeypatch):
  """formats=(): the same tables as a report with figures, and no figure drawn or written."""
  planted = {(2, 10): 0.8, (2, 14): 0.58}
  _write(str(tmp_path / "sweep"), _rows(planted=planted, noise=0.01))
  drawn = report.make_report(str(tmp_path / "sweep"), num_draws=20, formats=("png",),
                             out_dir=str(tmp_path / "drawn"))

  def no_drawing(*args, **kwargs):
    raise AssertionError("a figure was drawn")

  monkeypatch.setattr(phase_transition, "plot", no_drawing)
  tables = report.make_report(str(tmp_path / "sweep"), num_draws=20, formats=(),
                              out_dir=str(tmp_path / "tables"))
  assert tables["critical_coverage"] == drawn["critical_coverage"]
  assert sorted(os.listdir(tmp_path / "tables")) == [
      "bindjax_outputs.json", "critical_coverage.json", "critical_coverage.md", "points.json"]
  assert ((tmp_path / "tables" / "critical_coverage.md").read_text()
          == (tmp_path / "drawn" / "critical_coverage.md").read_text())
  assert "phase_transition.png" in os.listdir(tmp_path / "drawn")


def test_a_law_per_kind_of_towers(tmp_path):
  """Sweeps of two kinds of towers at the same sizes: one law over both cannot be fitted (two ρ*
  per size), one law per kind recovers each kind's planted ρ*, and the table says which is which."""
  planted = {"both": {(2, 20): 0.5, (2, 50): 0.32, (3, 50): 0.3},
             "none": {(2, 20): 0.7, (2, 50): 0.55, (3, 50): 0.5}}
  workdirs = []
  for readout, rhos in planted.items():
    workdirs.append(str(tmp_path / readout))
    _sweep_with_config(workdirs[-1], _rows(planted=rhos, noise=0.01),
                       model={"product_readout": readout, "num_layers": 2, "d_model": 64,
                              "d_ff": 256})
  mixed = report.make_report(workdirs, num_draws=20, formats=("png",), out_dir=str(tmp_path / "m"))
  assert mixed["scaling_law"] is None and mixed["scaling_laws"] is None
  apart = report.make_report(workdirs, num_draws=20, formats=("png",), out_dir=str(tmp_path / "a"),
                             law_per_towers=True)
  assert apart["scaling_law"] is None
  groups = {g["towers"].split(",")[0]: g for g in apart["scaling_laws"]}
  assert sorted(groups) == ["plain towers", "product read-out"]
  for words, rhos in (("product read-out", planted["both"]), ("plain towers", planted["none"])):
    group = groups[words]
    assert group["towers"].endswith("d_ff 256; lr 0.0003, weight decay 0.1"), group["towers"]
    rows = [r for r in apart["critical_coverage"] if r["towers"].startswith(words)]
    measured = {(r["C"], r["V"]): r["rho_star"] for r in rows}
    assert measured.keys() == rhos.keys()
    assert all(abs(measured[k] - rhos[k]) < 0.03 for k in rhos), (measured, rhos)
    assert group["laws"]["num_points"] == 3
  table = (tmp_path / "a" / "critical_coverage.md").read_text()
  assert table.count("### Scaling law of ") == 2
  assert (tmp_path / "a" / "scaling_law.png").exists()


def test_report_recovers_planted_rho_star(tmp_path, capsys):
  workdir = str(tmp_path / "sweep")
  rows = _rows()
  rows.append({"kind": "train", "replica": 0, "step": 150, "diverged": True})
  _write(workdir, rows, torn=True)
  assert report_command.main(["bindjax report", f"--workdir={workdir}", "--draws=100"]) == 0
  out_dir = os.path.join(workdir, "report")
  for name in ("phase_transition.png", "phase_transition.pdf", "critical_coverage.md",
               "critical_coverage.json", "points.json"):
    assert os.path.getsize(os.path.join(out_dir, name)) > 0, name
  summary = json.load(open(os.path.join(out_dir, "critical_coverage.json")))
  assert summary["num_replicas"] == 3 * 9 * 3 and summary["num_diverged"] == 1
  table = {(r["C"], r["V"]): r for r in summary["critical_coverage"]}
  for key, rho in PLANTED.items():
    assert table[key]["status"] == "fit"
    assert abs(table[key]["rho_star"] - rho) < 0.03, (key, table[key])
    low, high = table[key]["interval"]
    assert low - 0.02 <= rho <= high + 0.02
  assert [r["space_size"] for r in summary["critical_coverage"]] == [400, 2500, 125000]
  law = summary["scaling_law"]
  assert law is not None and law["power_law"]["b"] < 0
  assert law["power_law"]["b_interval"][0] <= law["power_law"]["b"] <= (
      law["power_law"]["b_interval"][1])
  md = open(os.path.join(out_dir, "critical_coverage.md")).read()
  assert "125,000" in md and "Scaling law" in md and "## Per coverage" in md
  assert os.path.getsize(os.path.join(out_dir, "scaling_law.png")) > 0
  assert "rho* = 0.5" in capsys.readouterr().out


def test_report_without_results_is_bad_input_and_writes_nothing(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    report_command.main(["bindjax report", f"--workdir={tmp_path}"])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 1 and len(err) == 1 and "no result rows" in err[0]
  assert os.listdir(tmp_path) == []


def _sweep_with_heldout_at(tmp_path, step, value):
  """A 2-seed sweep evaluated at steps 100, 200, 300 whose held-out accuracy at `step` is
  `value` for every replica; returns its workdir."""
  rows = _rows(planted={(2, 20): 0.5}, seeds=(0, 1), steps=(100, 200, 300))
  for row in rows:
    if row["step"] == step:
      row["heldout/object_accuracy"] = row["heldout/object_accuracy_2obj"] = value
  workdir = str(tmp_path / "sweep")
  _write(workdir, rows)
  return workdir


def test_step_final_reads_the_last_evaluation(tmp_path):
  """Early evaluations are 0.8× the late ones, so "best" and "final" are both the late step; a
  late collapse makes them differ, and --step=final must report the collapsed values."""
  workdir = _sweep_with_heldout_at(tmp_path, 300, 0.0)
  best = report.make_report(workdir, step="best", num_draws=20, out_dir=str(tmp_path / "b"),
                            formats=("png",))
  final = report.make_report(workdir, step="final", num_draws=20,
                             out_dir=str(tmp_path / "f"), formats=("png",))
  assert best["critical_coverage"][0]["status"] == "fit"
  (row,) = final["critical_coverage"]
  assert row["status"] == "below" and row["rho_star"] is None
  points = json.load(open(tmp_path / "f" / "points.json"))
  assert all(p["heldout/object_accuracy_{K}obj"]["mean"] == 0.0 for p in points[0]["points"])
  assert "final" in open(tmp_path / "f" / "critical_coverage.md").read()


def test_no_crossing_and_shared_space_size(tmp_path):
  """A curve that never reaches 0.5 has no ρ*; two models on one |O| give two curves and no
  scaling law (it needs one ρ* per size)."""
  rows = _rows(planted={(2, 20): 0.5}, seeds=(0, 1))
  other = []
  for row in rows:
    copy = dict(row, model="flat", replica=row["replica"] + 1000)
    copy["heldout/object_accuracy"] = copy["heldout/object_accuracy_2obj"] = 0.1
    other.append(copy)
  workdir = str(tmp_path / "sweep")
  _write(workdir, rows + other)
  summary = report.make_report(workdir, num_draws=20, formats=("png",))
  statuses = sorted(r["status"] for r in summary["critical_coverage"])
  assert statuses == ["below", "fit"] and summary["scaling_law"] is None
  assert [r["space_size"] for r in summary["critical_coverage"]] == [400, 400]
  md = open(os.path.join(workdir, "report", "critical_coverage.md")).read()
  assert "needs ρ* at three or more" in md


def test_default_step_selects_nothing_on_heldout_objects(tmp_path):
  """Held-out accuracy that peaks early and then falls: the default report reads the last
  evaluation of every replica, not the held-out peak."""
  workdir = _sweep_with_heldout_at(tmp_path, 100, 1.0)
  summary = report.make_report(workdir, num_draws=20, formats=("png",))
  assert summary["step"] == "final"
  points = json.load(open(os.path.join(workdir, "report", "points.json")))
  assert {s for p in points[0]["points"] for s in p["steps"]} == {300}
  assert summary["critical_coverage"][0]["status"] == "fit"
  md = open(os.path.join(workdir, "report", "critical_coverage.md")).read()
  assert "no selection on held-out objects" in md


def _planted_experiment(rng, rho, num_seeds, spread, noise,
                        coverages=(0.3, 0.5, 0.7, 0.8, 0.9), slope=20.0):
  """Selected rows of one planted sweep: each seed's curve crosses 0.5 at rho + N(0, spread)."""
  rows = []
  for seed in range(num_seeds):
    shift = rng.normal(0, spread)
    for coverage in coverages:
      acc = 1 / (1 + np.exp(-slope * (coverage - rho - shift))) + rng.normal(0, noise)
      rows.append({"kind": "eval", "replica": len(rows), "C": 2, "V": 10, "K": 2,
                   "space_size": 100, "model": "m", "learning_rate": 1e-3,
                   "weight_decay": 0.0, "coverage": coverage, "seed": seed, "step": 10,
                   "heldout/object_accuracy_2obj": float(np.clip(acc, 0, 1))})
  return rows


def test_rho_star_interval_has_its_coverage():
  """A seeded simulation of sweeps with a known spread between seeds (4 seeds, as committed
  runs have): the 95% interval holds the planted ρ* in 90–99% of 300 experiments, and is not
  trivially wide. An experiment in which noise keeps a seed from crossing 0.5 has no interval;
  those stay rare."""
  rng = np.random.default_rng(2024)
  hits, widths, censored = [], [], 0
  for _ in range(300):
    series = report.aggregate(_planted_experiment(rng, 0.75, 4, spread=0.04, noise=0.03),
                              (metrics.BINDING_METRIC,))
    (row,) = statistics.critical_coverages(series)
    if row["interval"] is None:
      censored += 1
      continue
    hits.append(row["interval"][0] <= 0.75 <= row["interval"][1])
    widths.append(row["interval"][1] - row["interval"][0])
  assert censored < 15
  assert 0.90 <= np.mean(hits) <= 0.99, np.mean(hits)
  assert np.median(widths) < 0.2


def test_seed_that_never_crosses_leaves_no_interval():
  rows = _planted_experiment(np.random.default_rng(0), 0.6, 4, spread=0.0, noise=0.0)
  for row in rows:
    if row["seed"] == 3:
      row["heldout/object_accuracy_2obj"] = 0.1
  (row,) = statistics.critical_coverages(report.aggregate(rows, (metrics.BINDING_METRIC,)))
  assert row["status"] == "fit" and row["interval"] is None and row["censored_seeds"] == ["3"]
  assert row["rho_star"] == row["pooled_rho_star"]


def test_several_sweeps_report_together(tmp_path):
  """One sweep per size, reported together: the same table as one sweep holding both sizes."""
  both = _rows(planted={(2, 20): 0.5, (2, 50): 0.32}, seeds=(0, 1, 2))
  _write(str(tmp_path / "both"), both)
  for v in (20, 50):  # each sweep numbers its replicas from 0
    part = [dict(r) for r in both if r["V"] == v]
    first = min(r["replica"] for r in part)
    _write(str(tmp_path / f"v{v}"), [dict(r, replica=r["replica"] - first) for r in part])
  whole = report.make_report(str(tmp_path / "both"), num_draws=20, formats=("png",))
  parts = report_command.main(["bindjax report", f"--workdir={tmp_path / 'v20'},{tmp_path / 'v50'}",
                               f"--out={tmp_path / 'out'}", "--draws=20"])
  assert parts == 0
  together = json.load(open(tmp_path / "out" / "critical_coverage.json"))
  assert together["critical_coverage"] == whole["critical_coverage"]
  assert os.path.getsize(tmp_path / "out" / "scaling_law.png") > 0
  with pytest.raises(SystemExit) as e:
    report_command.main(["bindjax report", f"--workdir={tmp_path / 'v20'},{tmp_path / 'v50'}"])
  assert e.value.code == 2


def test_sweeps_holding_the_same_series_are_kept_apart(tmp_path):
  """Two sweeps of one size whose rows look alike (their models differ only in the config, say)
  give one curve each, labelled by sweep, each with the ρ* of its own report."""
  for name, rho in (("plain", 0.5), ("product", 0.32)):
    _write(str(tmp_path / name), _rows(planted={(2, 20): rho}, seeds=(0, 1, 2)))
  alone = {name: report.make_report(str(tmp_path / name), num_draws=20, formats=("png",),
                                    out_dir=str(tmp_path / f"{name}_report"))
           for name in ("plain", "product")}
  together = report.make_report([str(tmp_path / "plain"), str(tmp_path / "product")],
                                num_draws=20, formats=("png",), out_dir=str(tmp_path / "out"))
  rows = together["critical_coverage"]
  assert [r["label"] for r in rows] == ["|O|=400 (C=2, V=20) sweep=plain",
                                        "|O|=400 (C=2, V=20) sweep=product"]
  for row in rows:
    (own,) = alone[row["sweep"]]["critical_coverage"]
    assert row["rho_star"] == own["rho_star"] and row["interval"] == own["interval"]
  assert together["scaling_law"] is None  # two curves of one size are not a law in |O|
  assert "sweep" not in alone["plain"]["critical_coverage"][0]


def test_points_with_at_most_k_held_out_objects_are_drawn_but_not_fitted(tmp_path):
  """With at most K held-out objects every held-out scene holds all the candidates, so its
  accuracy is no evidence: whatever such a coverage reads (0 here, to make it count if it were
  fitted), ρ* stays where it was."""
  rows = [dict(r, num_train_objects=round(r["coverage"] * 400))
          for r in _rows(planted={(2, 20): 0.5})]
  base = report.make_report(_write_and_return(tmp_path / "base", rows), num_draws=20,
                            formats=("png",))
  near_all = [dict(r, replica=1000 + r["replica"], coverage=0.995, num_train_objects=399,
                   **{"heldout/object_accuracy_2obj": 0.0})
              for r in rows if r["coverage"] == 0.9]
  both = report.make_report(_write_and_return(tmp_path / "both", rows + near_all), num_draws=20,
                            formats=("png",))
  (before,), (after,) = base["critical_coverage"], both["critical_coverage"]
  assert after["rho_star"] == before["rho_star"] and after["interval"] == before["interval"]
  assert 0.995 in after["coverages"]
  with open(tmp_path / "both" / "report" / "critical_coverage.md") as f:
    assert "| 0.995 | 1 (≤ K: not fitted) |" in f.read()


def _write_and_return(workdir, rows):
  _write(str(workdir), rows)
  return str(workdir)


def test_a_long_title_stays_inside_the_scaling_law_figure(monkeypatch):
  from bindjax.reporting.plots import phase_transition  # pylint: disable=g-import-not-at-top
  boxes = []

  def measure_title(fig, *_, **__):
    fig.canvas.draw()    # as saving does
    boxes.append((fig.axes[0].title.get_window_extent(fig.canvas.get_renderer()), fig.bbox.width))
    return []
  monkeypatch.setattr(files, "save_figures", measure_title)
  critical = [{results.NUM_CONCEPTS: 2, results.SPACE_SIZE: n, "rho_star": rho,
               "interval": (rho - 0.05, rho + 0.05)} for n, rho in ((100, 0.81), (196, 0.58))]
  names = " + ".join(f"scaling_law/cpu_{n}" for n in (100, 125, 144, 196))
  phase_transition.plot_scaling_law(critical, None, "unused",
                                    title=f"{names}: |O| = 100, 125, 144, 196; final step")
  ((box, width),) = boxes
  assert 0 <= box.x0 and box.x1 <= width, (box, width)


def test_the_report_records_only_the_figures_it_draws(tmp_path):
  """One size: no scaling law, so bindjax_outputs.json does not name scaling_law.png."""
  folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                        "findings", "scaling_law", "cpu_196")
  summary = report.make_report(folder, out_dir=str(tmp_path), num_draws=10, formats=("png",))
  recorded = files.recorded_outputs(tmp_path)
  assert summary["figures"] == [str(tmp_path / "phase_transition.png")]
  assert "phase_transition.png" in recorded and not any("scaling_law" in n for n in recorded)
  assert sorted(os.listdir(tmp_path)) == sorted(recorded + [files.OUTPUTS_FILE])
