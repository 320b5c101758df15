"""The accelerator script's CPU fallback runs its three steps end to end."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "experiments", "benchmarks", "device_sweep.sh")


@pytest.mark.slow
def test_cpu_fallback_measures_throughput_sizes_and_runs_the_quick_sweep(tmp_path):
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
