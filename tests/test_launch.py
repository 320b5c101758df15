"""Launchers' --dry-run output: the commands they would run."""
import datetime
import importlib.util
import os
import shlex
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name):
  spec = importlib.util.spec_from_file_location(f"launch_{name}",
                                                os.path.join(REPO, "launch", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _lines(capsys):
  return [l for l in capsys.readouterr().out.splitlines() if l]


def test_dated_workdir():
  common = _load("common")
  now = datetime.datetime(2026, 1, 30, 12, 0, 5)
  assert (common.dated_workdir("gs://b/runs/", "experiments/coverage_sweep.py:paper", now) ==
          "gs://b/runs/20260130-120005-coverage_sweep-paper")


def test_tpu_pod_dry_run(capsys):
  tpu = _load("tpu_pod")
  assert tpu.main(["--name=pod", "--zone=us-central2-b", "--accelerator_type=v4-64",
                   "--project=proj", "--spot", "--gcs_bucket=my-bucket",
                   "--config=experiments/coverage_sweep.py:paper", "--workdir_root=/mnt/gcs/x",
                   "--dry-run", "--", "--config.grid.seeds=(0,)"]) == 0
  lines = _lines(capsys)
  assert lines[0].startswith("# workdir: /mnt/gcs/x/") and lines[0].endswith("coverage_sweep-paper")
  workdir = lines[0].split(": ", 1)[1]
  create, pack, scp, install, run = lines[1:]
  assert create.startswith("gcloud compute tpus tpu-vm describe pod --zone=us-central2-b "
                           "--project=proj >/dev/null 2>&1 || gcloud compute tpus tpu-vm create pod")
  assert "--accelerator-type=v4-64" in create and "--spot" in create
  assert pack.startswith("tar czf") and "--exclude=.venv" in pack and REPO in pack
  assert scp.startswith("gcloud compute tpus tpu-vm scp") and "--worker=all" in scp
  install_argv = shlex.split(install)
  assert install_argv[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
  assert "--worker=all" in install_argv
  command = [a for a in install_argv if a.startswith("--command=")][0]
  assert "gcsfuse --implicit-dirs my-bucket /mnt/gcs" in command and "pip install" in command
  assert "jax[tpu]" in command
  run_argv = shlex.split(run)
  assert "--worker=all" in run_argv
  remote = shlex.split([a for a in run_argv if a.startswith("--command=")][0][len("--command="):])
  assert remote[remote.index("&&") + 1:] == [
      ".venv/bin/bindjax", "sweep", "--config=experiments/coverage_sweep.py:paper",
      f"--workdir={workdir}", "--config.grid.seeds=(0,)"]


def test_tpu_pod_requires_name():
  tpu = _load("tpu_pod")
  with pytest.raises(SystemExit):
    tpu.main(["--zone=z", "--dry-run"])


def test_slurm_dry_run(capsys, tmp_path):
  slurm = _load("slurm")
  assert slurm.main(["--nodes=4", "--gpus_per_node=8", "--partition=gpu", "--time=2:00:00",
                     f"--workdir={tmp_path}/w", "--account=acct", "--dry-run"]) == 0
  lines = _lines(capsys)
  script = "\n".join(lines)
  for expected in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1",
                   "#SBATCH --gpus-per-node=8", "#SBATCH --partition=gpu",
                   "#SBATCH --time=2:00:00", "#SBATCH --account=acct"):
    assert expected in lines, expected
  srun = [l for l in lines if l.startswith("srun ")][0]
  assert shlex.split(srun)[2:] == [".venv/bin/bindjax", "sweep",
                                   "--config=experiments/coverage_sweep.py:paper",
                                   f"--workdir={tmp_path}/w"]
  assert lines[-1] == f"sbatch {tmp_path}/w/sweep.sbatch"
  assert not os.path.exists(f"{tmp_path}/w")  # a dry run writes nothing
  assert "#!/bin/bash" in script
  with pytest.raises(SystemExit):
    slurm.main(["--nodes=0", "--dry-run"])


def test_local_dry_run(capsys, tmp_path, monkeypatch):
  local = _load("local")
  assert local.main([f"--workdir_root={tmp_path}", "--dry-run"]) == 0
  lines = _lines(capsys)
  workdir = lines[0].split(": ", 1)[1]
  assert workdir.startswith(str(tmp_path)) and workdir.endswith("coverage_sweep-smoke")
  sweep, report = (shlex.split(l) for l in lines[1:])
  assert sweep[1:] == ["sweep", "--config=experiments/coverage_sweep.py:smoke",
                       f"--workdir={workdir}"]
  assert report[1:] == ["report", f"--workdir={workdir}"]
  monkeypatch.setattr(local.parallel, "available_cores", lambda: [0, 1, 2, 3, 4])
  assert local.main([f"--workdir={tmp_path}/w", "--num_processes=2", "--port=4321",
                     "--dry-run"]) == 0
  lines = _lines(capsys)
  assert lines[1:3] == ["# process 0 pinned to cores 0,1,2", "# process 1 pinned to cores 3,4"]
  assert len(lines) == 6
  for i, line in enumerate(lines[3:5]):
    assert f"--process_id={i}" in line and "--coordinator_address=127.0.0.1:4321" in line
    assert "--num_processes=2" in line
  assert not os.path.exists(f"{tmp_path}/w")
  assert local.main([f"--workdir={tmp_path}/w", "--num_processes=2", "--no-pin",
                     "--dry-run"]) == 0
  assert not any("pinned" in line for line in _lines(capsys))
  assert local.main([f"--workdir={tmp_path}/w", "--num_processes=6", "--dry-run"]) == 0
  assert "# not pinned: more processes (6) than cores" in _lines(capsys)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux CPU affinity and two cores")
def test_local_pins_each_process_to_its_cores(capfd, tmp_path, monkeypatch):
  local = _load("local")
  cores = sorted(os.sched_getaffinity(0))[:2]
  monkeypatch.setattr(local.parallel, "available_cores", lambda: cores)
  show = [sys.executable, "-c", "import os; print('cores', sorted(os.sched_getaffinity(0)))"]
  monkeypatch.setattr(local, "build_commands",
                      lambda args, extra, workdir: ([show, show], [sys.executable, "-c", ""]))
  assert local.main([f"--workdir={tmp_path}/w", "--num_processes=2"]) == 0
  printed = sorted(l for l in capfd.readouterr().out.splitlines() if l.startswith("cores"))
  assert printed == [f"cores [{cores[0]}]", f"cores [{cores[1]}]"]
