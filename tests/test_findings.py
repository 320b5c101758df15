"""Committed findings redraw: `bindjax report` on a findings folder's rows reproduces its table,
and the committed rows, summaries and binding tables carry every field the code reads."""
import csv
import glob
import os
import re

import pytest

from bindjax.complexity import replicas
from bindjax.reporting.plots import phase_transition
from bindjax.reporting import metrics
from bindjax.reporting import report
from bindjax.reporting import tables
from bindjax.workdir import layout
from bindjax.workdir import results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = sorted(os.path.dirname(p) for p in glob.glob(
    os.path.join(REPO, "docs", "findings", "**", "results.jsonl"), recursive=True))


def test_the_readme_figure_has_its_rows():
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  drawn = [os.path.relpath(folder, REPO) for folder in FOLDERS]
  assert any(folder + "/" in readme for folder in drawn), drawn


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: os.path.relpath(p, REPO))
def test_findings_folder_redraws_its_table(folder, tmp_path):
  with open(os.path.join(folder, "critical_coverage.md")) as f:
    committed = f.read()
  report.make_report(folder, out_dir=str(tmp_path), formats=("png",))
  with open(tmp_path / "critical_coverage.md") as f:
    assert f.read() == committed


EARLIER = sorted(glob.glob(os.path.join(REPO, "docs", "findings", "**",
                                     "critical_coverage_step*.md"), recursive=True))


@pytest.mark.parametrize("path", EARLIER, ids=lambda p: os.path.relpath(p, REPO))
def test_an_earlier_steps_table_redraws(path, tmp_path):
  # critical_coverage_stepN.md: the folder's report as it stood at step N (`--step=N`).
  step = int(re.fullmatch(r"critical_coverage_step(\d+)\.md", os.path.basename(path)).group(1))
  report.make_report(os.path.dirname(path), step=step, out_dir=str(tmp_path), formats=())
  with open(path) as f:
    assert (tmp_path / "critical_coverage.md").read_text() == f.read()


REPORTS = sorted(os.path.dirname(p) for p in glob.glob(
    os.path.join(REPO, "docs", "findings", "**", "workdirs.txt"), recursive=True))


@pytest.mark.parametrize("folder", REPORTS, ids=lambda p: os.path.relpath(p, REPO))
def test_a_report_of_several_sweeps_redraws_its_table(folder, tmp_path):
  # workdirs.txt names the findings folders (relative to the repository) reported together;
  # predict.txt, where there is one, the sizes (N:C lines) the laws were asked to predict.
  with open(os.path.join(folder, "workdirs.txt")) as f:
    workdirs = [os.path.join(REPO, line.strip()) for line in f if line.strip()]
  assert len(workdirs) > 1 and all(w in FOLDERS for w in workdirs), workdirs
  # options.txt, where there is one: a boolean option of `make_report` per line (`pool`,
  # `law_per_towers`), each set, with why after a '#'.
  options = {}
  if os.path.exists(os.path.join(folder, "options.txt")):
    with open(os.path.join(folder, "options.txt")) as f:
      options = {line.split("#")[0].strip(): True for line in f if line.split("#")[0].strip()}
    assert set(options) <= {"pool", "law_per_towers"}, options
  predict_at = []
  if os.path.exists(os.path.join(folder, "predict.txt")):
    with open(os.path.join(folder, "predict.txt")) as f:
      predict_at = [tuple(map(int, line.split(":"))) for line in f if line.strip()]
  with open(os.path.join(folder, "critical_coverage.md")) as f:
    committed = f.read()
  report.make_report(workdirs, out_dir=str(tmp_path), formats=(), predict_at=predict_at,
                     **options)
  with open(tmp_path / "critical_coverage.md") as f:
    assert f.read() == committed


# Every metric the report and its figures read from an evaluation row.
READ_METRICS = sorted({*metrics.REPORT_METRICS, *(m for m, _ in tables.TABLE_METRICS),
                       *(m for m, _ in phase_transition.PANELS), *results.SUMMARY_METRICS})


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: os.path.relpath(p, REPO))
def test_the_committed_rows_carry_what_the_report_reads(folder, tmp_path):
  coordinates = layout.Workdir(folder).read_replicas()
  rows = layout.Workdir(folder).read_rows()
  evals = [r for r in rows if r[results.KIND] == "eval"]
  assert evals and coordinates
  assert [tuple(c) for c in coordinates] == [results.COORDINATES] * len(coordinates)
  for row in evals:
    assert tuple(row)[:len(results.COORDINATES) + 2] == (
        results.KIND, *results.COORDINATES, results.STEP)
    missing = [m for m in READ_METRICS
               if not isinstance(results.metric_value(row, m), (int, float))]
    assert not missing, (row[results.REPLICA], row[results.STEP], missing)
  row = evals[0]
  k = row[results.MAX_OBJECTS]
  generated = [results.USES_TRAINING_OBJECTS, *results.SUMMARY_METRICS]
  for split in (results.HELDOUT, results.TRAIN):
    generated.append(results.binding(split))
    for count in (None, *range(1, k + 1)):
      generated += [results.object_accuracy(split, count), results.concept_accuracy(split, count)]
  assert set(generated) <= set(row)
  # The row's own K stands in for ROW_K: the binding metric is the K-object accuracy.
  assert (results.metric_value(row, metrics.BINDING_METRIC)
          == row[results.object_accuracy(results.HELDOUT, k)])
  if not os.path.exists(os.path.join(folder, layout.DONE_FILE)):
    return  # an unfinished sweep writes no summary yet
  layout.Workdir(str(tmp_path)).write_summary(rows, coordinates)
  with open(os.path.join(folder, layout.SUMMARY_FILE)) as f:
    assert (tmp_path / layout.SUMMARY_FILE).read_text() == f.read()


def test_the_committed_binding_tables_carry_what_the_correlations_read():
  with open(os.path.join(REPO, "docs", "findings", "binding_fits", "cpu", "results.csv")) as f:
    table = list(csv.DictReader(f))
  # Tables written before a column was added lack it; every column they have is still known,
  # and the ones the correlations read are there.
  assert set(table[0]) <= set(replicas.CSV_COLUMNS), set(table[0]) - set(replicas.CSV_COLUMNS)
  assert {"status", replicas.ACCURACY_COLUMN, replicas.QUALITY_COLUMN} <= set(table[0])
  fitted = [r for r in table if r["status"] == "fitted"]
  assert fitted
  for row in fitted:
    float(row[replicas.ACCURACY_COLUMN])
    float(row[replicas.QUALITY_COLUMN])
