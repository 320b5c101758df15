"""The accelerator script's CPU fallback runs its stages end to end."""
import json
import os
import subprocess
import sys
import tarfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "experiments", "benchmarks", "device_sweep.sh")


@pytest.mark.slow
def test_cpu_fallback_measures_throughput_runs_the_quick_sweep_and_its_binding_fits(
    tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(DEVICE_SWEEP_CPU="1", OUT=str(tmp_path), PYTHON=sys.executable,
             BINDJAX_COMPILATION_CACHE="0")
  done = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
  log = done.stdout + done.stderr
  assert done.returncode == 0, log[-3000:]
  rows = json.load(open(tmp_path / "throughput.json"))["rows"]
  assert [r["replicas"] for r in rows] == [1, 2]
  assert all(r["replica_steps_per_s"] > 0 for r in rows)
  # The quick sweep's steps come from the measured rate (a multiple of the fallback's 10).
  steps = int(log.split("quick sweep: ")[1].split()[0])
  assert steps >= 10 and steps % 10 == 0
  evaluations = [json.loads(line) for line in open(tmp_path / "quick" / "results.jsonl")
                 if '"eval"' in line]
  assert max(r["step"] for r in evaluations) == steps
  assert (tmp_path / "quick" / "report" / "phase_transition.png").exists()
  assert (tmp_path / "device_sweep.log").exists()
  # The binding fits of the quick sweep's replicas, and the projection drawn from their timings.
  fits = json.load(open(tmp_path / "quick_binding" / "results.json"))
  assert fits["replicas"]["fitted"] == 1
  projection = json.load(open(tmp_path / "binding_projection.json"))
  assert projection["replicas"] == 1 and projection["target"] == 500
  assert projection["projected_s"] == pytest.approx(
      projection["compile_s"] + 500 * projection["seconds_per_replica"])
  assert projection["seconds_per_replica"] > 0


@pytest.mark.slow
def test_cpu_fallback_of_the_learning_time_stage_tabulates_its_rows(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(DEVICE_SWEEP_CPU="1", OUT=str(tmp_path), PYTHON=sys.executable,
             BINDJAX_COMPILATION_CACHE="0", LT_SEEDS="2")
  done = subprocess.run(["bash", SCRIPT, "learning_time"], env=env, capture_output=True,
                        text=True, timeout=900)
  assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
  table = json.load(open(tmp_path / "learning_time.json"))["table"]
  assert [(r["space_size"], r["model"], r["seeds"], r["final_step"]) for r in table] == [
      (9, "cpu", 2, 20)]
  assert not (tmp_path / "throughput.json").exists()   # a named stage runs alone


@pytest.mark.slow
def test_cpu_fallback_of_the_plain400_stage_sizes_the_sweep_and_brings_back_its_rows(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(DEVICE_SWEEP_CPU="1", OUT=str(tmp_path / "out"), PYTHON=sys.executable,
             BINDJAX_COMPILATION_CACHE="0", PLAIN_WORKDIR=str(tmp_path / "work"))
  done = subprocess.run(["bash", SCRIPT, "plain400"], env=env, capture_output=True, text=True,
                        timeout=900)
  log = done.stdout + done.stderr
  assert done.returncode == 0, log[-3000:]
  rows = json.load(open(tmp_path / "out" / "plain400_throughput.json"))["rows"]
  assert [r["replicas"] for r in rows] == [1] and rows[0]["replica_steps_per_s"] > 0
  steps = int(log.split("plain sweep: ")[1].split()[0])
  assert steps >= 10 and steps % 10 == 0
  with tarfile.open(tmp_path / "out" / "plain400.tar.gz") as tar:
    names = set(tar.getnames())
    rows = [json.loads(line) for line in tar.extractfile("results.jsonl")]
  assert {"config.json", "replicas.json", "results.jsonl", "report/critical_coverage.md"} <= names
  assert max(r["step"] for r in rows if r["kind"] == "eval") == steps
  # Only what comes back from a device lies in $OUT: no checkpoints.
  assert sorted(os.listdir(tmp_path / "out")) == [
      "device_sweep.log", "plain400.tar.gz", "plain400_throughput.json",
      "plain400_throughput.md"]
