"""Launchers run for real against stand-ins for gcloud, sbatch, srun, pip and bindjax: what runs
where, in which order, with which flags."""
import datetime
import importlib.util
import json
import os
import shlex
import socket
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP_CONFIG = "experiments/coverage_sweep.py:paper"
# A stand-in for a command-line tool: it logs its name, arguments, directory and cores, fails
# when its call contains $FAKE_FAIL, and does the one thing a launch needs of it.
FAKE_TOOL = """#!{python}
import json, os, shutil, subprocess, sys
tool, argv = os.path.basename(sys.argv[0]), sys.argv[1:]
cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
with open(os.environ["FAKE_LOG"], "a") as f:
  f.write(json.dumps(dict(tool=tool, argv=argv, cwd=os.getcwd(), cores=cores,
                         sid=os.getsid(0))) + "\\n")
if os.environ.get("FAKE_FAIL") and os.environ["FAKE_FAIL"] in " ".join([tool] + argv):
  sys.exit(1)
if tool == "mountpoint":   # nothing is mounted yet
  sys.exit(1)
if tool == "python3" and argv[:2] == ["-m", "venv"]:
  os.makedirs(os.path.join(argv[2], "bin"), exist_ok=True)
  shutil.copy(sys.argv[0], os.path.join(argv[2], "bin", "pip"))
if tool == "pip" and "-e" in argv:   # installs the bindjax command beside itself
  shutil.copy(sys.argv[0], os.path.join(os.path.dirname(sys.argv[0]), "bindjax"))
if tool == "gcloud" and "ssh" in argv:   # runs the command on the worker
  command = [a for a in argv if a.startswith("--command=")][0][len("--command="):]
  sys.exit(subprocess.run(["bash", "-c", command],
                          env=dict(os.environ, HOME=os.environ["FAKE_HOME"])).returncode)
if tool == "sbatch":   # runs the job script, as a node would
  sys.exit(subprocess.run(["bash", argv[-1]]).returncode)
if tool == "srun":   # starts the task that follows its options
  task = next(i for i, a in enumerate(argv) if not a.startswith("-"))
  sys.exit(subprocess.run(argv[task:]).returncode)
"""


def _load(name):
  spec = importlib.util.spec_from_file_location(f"launch_{name}",
                                                os.path.join(REPO, "launch", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.fixture
def fake(tmp_path, monkeypatch):
  """Makes stand-in tools on request (`fake.tool(name, directory=bin)`); `fake.calls()` lists
  their calls in order."""
  class Fake:
    bin = tmp_path / "bin"
    home = tmp_path / "worker_home"
    log = tmp_path / "calls.jsonl"

    def tool(self, name, directory=None):
      path = (directory or self.bin) / name
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(FAKE_TOOL.format(python=sys.executable))
      path.chmod(0o755)
      return str(path)

    def calls(self, tool=None):
      if not self.log.exists():
        return []
      calls = [json.loads(line) for line in self.log.read_text().splitlines()]
      return [c for c in calls if tool in (None, c["tool"])]

  fake = Fake()
  fake.home.mkdir()
  monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setenv("FAKE_LOG", str(fake.log))
  monkeypatch.setenv("FAKE_HOME", str(fake.home))
  return fake


def test_dated_workdir():
  common = _load("common")
  now = datetime.datetime(2026, 1, 30, 12, 0, 5)
  assert (common.dated_workdir("gs://b/runs/", "experiments/coverage_sweep.py:paper", now) ==
          "gs://b/runs/20260130-120005-coverage_sweep-paper")


def _tpu_flags(tmp_path, *extra):
  return ["--name=pod", "--zone=us-central2-b", "--accelerator_type=v4-64", "--project=proj",
          "--spot", "--gcs_bucket=my-bucket", f"--mount_point={tmp_path / 'gcs'}",
          f"--config={SWEEP_CONFIG}", f"--workdir_root={tmp_path / 'gcs' / 'runs'}", *extra]


def test_tpu_pod_creates_the_vm_installs_and_runs_the_sweep_on_every_worker(
    tmp_path, fake, monkeypatch):
  tpu = _load("tpu_pod")
  for name in ("gcloud", "tar", "mountpoint", "gcsfuse", "python3"):
    fake.tool(name)
  monkeypatch.setenv("FAKE_FAIL", "tpu-vm describe")   # no VM of that name yet
  assert tpu.main(_tpu_flags(tmp_path, "--", "--config.grid.seeds=(0,)")) == 0
  gcloud = [c["argv"] for c in fake.calls("gcloud")]
  assert [a[3] for a in gcloud] == ["describe", "create", "scp", "ssh", "ssh"]
  assert all(a[4] == "pod" and "--zone=us-central2-b" in a and "--project=proj" in a
             for a in gcloud[:2])
  assert "--accelerator-type=v4-64" in gcloud[1] and "--spot" in gcloud[1]
  assert all("--worker=all" in a for a in gcloud[2:])
  pack = fake.calls("tar")[0]["argv"]
  assert pack[:2] == ["czf", tpu.ARCHIVE] and pack[-3:] == ["-C", REPO, "."]
  assert "--exclude=.venv" in pack and "--exclude=.git" in pack
  assert tpu.ARCHIVE in gcloud[2] and "pod:~/bindjax.tar.gz" in gcloud[2]
  # On the worker: the bucket is mounted, then bindjax is installed with the TPU jax.
  names = [c["tool"] for c in fake.calls()]
  assert names.index("gcsfuse") < names.index("pip")
  assert fake.calls("gcsfuse")[0]["argv"] == ["--implicit-dirs", "--rename-dir-limit=100000",
                                              "my-bucket", str(tmp_path / "gcs")]
  install = [c["argv"] for c in fake.calls("pip") if "-e" in c["argv"]][0]
  assert install[-2:] == [".", "jax[tpu]>=0.10.2,<0.11"]
  (run,) = _detached_calls(fake)
  assert run["cwd"] == str(fake.home / "bindjax")
  workdir = run["argv"][2][len("--workdir="):]
  assert run["argv"] == ["sweep", f"--config={SWEEP_CONFIG}", f"--workdir={workdir}",
                         "--noprogress", "--config.grid.seeds=(0,)"]
  assert workdir.startswith(str(tmp_path / "gcs" / "runs")) and workdir.endswith(
      "coverage_sweep-paper")


def _detached_calls(fake, timeout=30):
  """The calls of the detached `bindjax sweep`, once its stand-in has logged them."""
  deadline = time.time() + timeout
  while not fake.calls("bindjax") and time.time() < deadline:
    time.sleep(0.1)
  return fake.calls("bindjax")


def test_tpu_pod_detaches_the_sweep_logs_per_worker_and_says_how_to_follow_and_resume(
    tmp_path, fake, monkeypatch, capsys):
  tpu = _load("tpu_pod")
  for name in ("gcloud", "tar", "mountpoint", "gcsfuse", "python3"):
    fake.tool(name)
  flags = _tpu_flags(tmp_path)
  assert tpu.main(flags + ["--", "--config.num_steps=9"]) == 0
  (run,) = _detached_calls(fake)
  workdir = run["argv"][2][len("--workdir="):]
  logs = os.path.join(workdir, "logs")
  host = socket.gethostname()
  # The sweep ran in a session of its own (not the ssh's), its output in the worker's log.
  pid = int(open(os.path.join(logs, f"{host}.pid")).read())
  assert os.path.exists(os.path.join(logs, f"{host}.log"))
  assert run["sid"] == pid != os.getsid(0)
  out = capsys.readouterr().out.splitlines()
  follow, stop, resume = (out[out.index(line) + 1] for line in out if line.startswith("# ")
                          and not line.startswith("# workdir"))
  assert "--worker=0" in follow and f"tail -f {logs}/*.log" in follow
  assert "--worker=all" in stop and f"kill -INT $(cat {logs}/$(hostname).pid)" in stop
  resumed = shlex.split(resume)
  assert resumed[:2] == ["python", "launch/tpu_pod.py"] and f"--workdir={workdir}" in resumed
  assert resumed[-2:] == ["--", "--config.num_steps=9"]
  assert not any(a.startswith("--workdir_root") for a in resumed)
  # Resuming with the printed flags runs the same sweep in the same workdir.
  os.remove(fake.log)
  assert tpu.main(resumed[2:]) == 0
  (again,) = _detached_calls(fake)
  assert again["argv"] == run["argv"]


def test_tpu_pod_logs_of_a_gs_workdir_stay_on_the_workers(tmp_path):
  tpu = _load("tpu_pod")
  args = tpu.parse(["--name=pod", "--zone=z", "--workdir=gs://bucket/run"])
  commands, workdir = tpu.build_commands(args, [])
  assert workdir == "gs://bucket/run"
  assert "mkdir -p ~/bindjax/logs" in commands[-1] and "> ~/bindjax/logs/$(hostname).log" in (
      commands[-1])


def test_tpu_pod_reuses_its_vm_and_stops_at_the_first_failure(tmp_path, fake, monkeypatch):
  tpu = _load("tpu_pod")
  for name in ("gcloud", "tar"):
    fake.tool(name)
  monkeypatch.setenv("FAKE_FAIL", "tpu-vm scp")
  assert tpu.main(_tpu_flags(tmp_path)) == 1
  assert [c["argv"][3] for c in fake.calls("gcloud")] == ["describe", "scp"]


def test_tpu_pod_requires_name():
  tpu = _load("tpu_pod")
  with pytest.raises(SystemExit):
    tpu.main(["--zone=z", "--dry-run"])


def _sbatch_directives(script):
  """{option: value} of the #SBATCH lines, as sbatch reads them."""
  lines = [l[len("#SBATCH --"):] for l in script.splitlines() if l.startswith("#SBATCH --")]
  return dict(l.split("=", 1) for l in lines)


def test_slurm_submits_a_job_that_runs_the_sweep_on_every_node(tmp_path, fake):
  slurm = _load("slurm")
  for name in ("sbatch", "srun"):
    fake.tool(name)
  venv, checkout, workdir = tmp_path / "venv", tmp_path / "checkout", tmp_path / "w"
  fake.tool("bindjax", venv / "bin")
  checkout.mkdir()
  flags = ["--nodes=4", "--gpus_per_node=8", "--partition=gpu", "--time=2:00:00",
           f"--workdir={workdir}", "--account=acct", f"--repo={checkout}", f"--venv={venv}"]
  assert slurm.main(flags + ["--dry-run"]) == 0
  assert not workdir.exists() and not fake.calls()   # a dry run writes and submits nothing
  assert slurm.main(flags) == 0
  script = workdir / "sweep.sbatch"
  directives = _sbatch_directives(script.read_text())
  assert {k: directives[k] for k in ("nodes", "ntasks-per-node", "gpus-per-node", "partition",
                                     "time", "account")} == {
      "nodes": "4", "ntasks-per-node": "1", "gpus-per-node": "8", "partition": "gpu",
      "time": "2:00:00", "account": "acct"}
  assert directives["output"].startswith(f"{workdir}/")
  assert [c["argv"] for c in fake.calls("sbatch")] == [[str(script)]]
  (run,) = fake.calls("bindjax")
  assert run["cwd"] == str(checkout)
  assert run["argv"] == ["sweep", f"--config={SWEEP_CONFIG}", f"--workdir={workdir}"]
  with pytest.raises(SystemExit):
    slurm.main(["--nodes=0", "--dry-run"])


def test_local_runs_the_sweep_then_its_report(tmp_path, fake):
  local = _load("local")
  bindjax = fake.tool("bindjax")
  assert local.main([f"--workdir_root={tmp_path}", f"--bindjax={bindjax}", "--dry-run"]) == 0
  assert not fake.calls()
  workdir = tmp_path / "w"
  assert local.main([f"--workdir={workdir}", f"--bindjax={bindjax}", "--", "--noprogress"]) == 0
  assert [c["argv"] for c in fake.calls()] == [
      ["sweep", "--config=experiments/coverage_sweep.py:smoke", f"--workdir={workdir}",
       "--noprogress"],
      ["report", f"--workdir={workdir}"]]


def test_local_processes_join_one_sweep_before_the_report(tmp_path, fake):
  local = _load("local")
  bindjax = fake.tool("bindjax")
  workdir = tmp_path / "w"
  assert local.main([f"--workdir={workdir}", f"--bindjax={bindjax}", "--num_processes=2",
                     "--port=4321", "--no-pin"]) == 0
  *sweeps, report = [c["argv"] for c in fake.calls()]
  assert report == ["report", f"--workdir={workdir}"]
  assert sorted(a for s in sweeps for a in s if a.startswith("--process_id=")) == [
      "--process_id=0", "--process_id=1"]
  for argv in sweeps:
    assert argv[:3] == ["sweep", "--config=experiments/coverage_sweep.py:smoke",
                        f"--workdir={workdir}"]
    assert "--coordinator_address=127.0.0.1:4321" in argv and "--num_processes=2" in argv
    assert "--noreport" in argv   # the report runs once, after every process
  with pytest.raises(SystemExit):
    local.main([f"--workdir={workdir}", "--num_processes=0"])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux CPU affinity and two cores")
def test_local_pins_each_process_to_its_cores(tmp_path, fake, monkeypatch):
  local = _load("local")
  bindjax = fake.tool("bindjax")
  everything = sorted(os.sched_getaffinity(0))
  monkeypatch.setattr(local.parallel, "available_cores", lambda: everything[:2])
  assert local.main([f"--workdir={tmp_path / 'pinned'}", f"--bindjax={bindjax}",
                     "--num_processes=2"]) == 0
  *sweeps, report = fake.calls()
  assert sorted(c["cores"] for c in sweeps) == [[everything[0]], [everything[1]]]
  assert report["cores"] == everything
  fake.log.unlink()
  # More processes than cores: none is pinned.
  assert local.main([f"--workdir={tmp_path / 'unpinned'}", f"--bindjax={bindjax}",
                     "--num_processes=3"]) == 0
  assert [c["cores"] for c in fake.calls()] == [everything] * 4
