"""Committed findings redraw: `bindjax report` on a findings folder's rows reproduces its table."""
import glob
import os

import pytest

from bindjax import report

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
