"""Nothing lost, nothing silent: one owner per workdir, results rebuilt from the checkpoints,
checkpoints that verify themselves, --overwrite that spares a user's files, and a fault-injection
run that kills and damages a tiny sweep at random points.

Every sweep here is test_sweep's tiny one (12 replicas, half of them diverging at step 1; rows
at every step, checkpoints at steps 2, 4 and 6), resumed in-process so its programs compile once.
"""
import glob
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from bindjax.base import errors
from bindjax.base import files
from bindjax.commands import flags
from bindjax.commands import main as cli
from bindjax.reporting import report
from bindjax.runtime import parallel
from bindjax.training import bucket_programs
from bindjax.training import grid
from bindjax.training import sweep
from bindjax.workdir import checkpoint
from bindjax.workdir import layout
from bindjax.workdir import lock as workdir_lock
from bindjax.workdir import results

import test_sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "tests", "test_sweep.py")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted run of the tiny sweep: (workdir, results.jsonl text)."""
  workdir = str(tmp_path_factory.mktemp("reference") / "run")
  sweep.run_sweep(test_sweep.tiny_config(), workdir, progress=False, log=lambda *_: None)
  return workdir, _text(workdir, layout.RESULTS_FILE)


def _text(workdir, name):
  path = os.path.join(workdir, name)
  return open(path).read() if os.path.exists(path) else None


def _copy(reference, tmp_path, finished=True):
  workdir = str(tmp_path / "copy")
  shutil.copytree(reference[0], workdir)
  if not finished:
    os.remove(os.path.join(workdir, layout.DONE_FILE))
  return workdir


def _resume(workdir, **kwargs):
  messages = []
  sweep.run_sweep(test_sweep.tiny_config(), workdir, progress=False, log=messages.append,
                  **kwargs)
  return messages


def run_cli(argv, capsys, monkeypatch):
  """(exit status, stdout lines, stderr lines) of `bindjax ARGV` in-process."""
  monkeypatch.setattr(sys, "argv", ["bindjax"] + list(argv))
  try:
    code = cli.main(argv)
  except SystemExit as e:
    code = e.code
  captured = capsys.readouterr()
  return code, captured.out.splitlines(), captured.err.splitlines()


def _snapshot(directory):
  """{relative path: (bytes, mtime)} of every file under `directory`."""
  out = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, directory)] = (f.read(), os.stat(path).st_mtime_ns)
  return out


def _data_files(workdir, step):
  return sorted(glob.glob(os.path.join(layout.Workdir(workdir).bucket_dir(0), str(step),
                                       "state", "**", "d", "*"), recursive=True))


def _flip(path, offsets, mask=0xFF):
  data = bytearray(open(path, "rb").read())
  for offset in offsets:
    data[offset % len(data)] ^= mask
  open(path, "wb").write(bytes(data))


# --------------------------------------------------------------------------------------------
# Ctrl-C

# `bindjax sweep` on the tiny sweep that sends itself SIGINT (Ctrl-C) right after its first
# checkpoint save, mid-run. Python's own SIGINT handler is put back first, as a terminal's run
# has it: a suite started in the background by a non-interactive shell ignores SIGINT, and its
# children inherit that.
_INTERRUPT = textwrap.dedent("""
    import os, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from bindjax.commands import main as cli
    from bindjax.workdir import checkpoint
    save = checkpoint.Checkpoints.save
    def interrupted(self, step, state, metadata=None):
      save(self, step, state, metadata)
      os.kill(os.getpid(), signal.SIGINT)
    checkpoint.Checkpoints.save = interrupted
    sys.exit(cli.main(sys.argv[1:]))
    """)


def test_ctrl_c_says_one_line_exits_130_and_the_same_command_resumes(reference, tmp_path,
                                                                      capsys, monkeypatch):
  workdir = str(tmp_path / "interrupted")
  argv = ["sweep", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress"]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [REPO, os.path.join(REPO, "tests"), os.environ.get("PYTHONPATH", "")]))
  proc = subprocess.run([sys.executable, "-c", _INTERRUPT, *argv], env=env, cwd=REPO,
                        capture_output=True, text=True, timeout=900)
  err = proc.stderr.splitlines()
  assert proc.returncode == cli.INTERRUPTED == 130, proc.stderr[-3000:]
  replicas, _ = grid.expand_grid(test_sweep.tiny_config())
  # Stopped inside the save of step 2, before the bar counted it: step 1 of every replica done.
  assert err == [f"bindjax sweep: interrupted at replica-step {len(replicas)} of "
                 f"{len(replicas) * test_sweep.NUM_STEPS}; run the same command to resume"], err
  assert not os.path.exists(os.path.join(workdir, layout.DONE_FILE))
  code, _, err = run_cli(argv, capsys, monkeypatch)
  assert code == 0 and not err, err
  assert _text(workdir, layout.RESULTS_FILE) == reference[1]


# --------------------------------------------------------------------------------------------
# One owner per workdir


def _holder(workdir, then="sleep"):
  """A process holding the workdir's lock: it sleeps, or is SIGKILLed while holding it."""
  script = textwrap.dedent(f"""
      import os, signal, sys, time
      from bindjax.workdir import lock as workdir_lock
      lock = workdir_lock.acquire({workdir!r})
      print("held", flush=True)
      if {then!r} == "die":
        os.kill(os.getpid(), signal.SIGKILL)
      time.sleep(600)
      """)
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                          text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_a_second_run_on_a_live_workdir_is_refused_at_once(tmp_path, capsys, monkeypatch):
  workdir = tmp_path / "live"
  holder = _holder(str(workdir))
  try:
    before = _snapshot(workdir)
    start = time.time()
    code, _, err = run_cli(["sweep", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress"],
                        capsys, monkeypatch)
    assert code == flags.INPUT_ERROR and len(err) == 1, err
    assert time.time() - start < 60   # refused before anything compiled
    assert err[0].startswith("bindjax sweep: workdir ") and "in use by another run" in err[0]
    assert f"pid {holder.pid} on host {socket.gethostname()}, started 20" in err[0]
    assert _snapshot(workdir) == before
    with pytest.raises(workdir_lock.WorkdirLockedError, match=f"pid {holder.pid}"):
      workdir_lock.acquire(workdir)
  finally:
    holder.kill()
    holder.wait()


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path):
  workdir = tmp_path / "stale"
  dead = _holder(str(workdir), then="die")
  dead.wait()
  assert dead.returncode == -signal.SIGKILL
  assert json.loads((workdir / layout.LOCK_FILE).read_text())["pid"] == dead.pid
  with workdir_lock.acquire(workdir) as lock:
    assert lock.stale["pid"] == dead.pid
    assert json.loads((workdir / layout.LOCK_FILE).read_text())["pid"] == os.getpid()
  assert os.listdir(workdir) == []   # the lock file goes with the lock


def test_the_lock_of_a_workdir_in_memory_is_its_record(memory_fs):
  """No flock off the local disk: a live holder's record refuses, a dead one's is taken over,
  one from another host is refused with the file to remove, and release removes only its own."""
  from etils import epath
  workdir = epath.Path(memory_fs) / "run"
  path = workdir / layout.LOCK_FILE
  with workdir_lock.acquire(str(workdir)) as lock:
    assert lock.stale is None and json.loads(path.read_text())["pid"] == os.getpid()
    with pytest.raises(workdir_lock.WorkdirLockedError, match=f"in use by another run: pid "
                                                              f"{os.getpid()}"):
      workdir_lock.acquire(str(workdir))
  assert not path.exists()
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  record = {"host": socket.gethostname(), "pid": int(dead.stdout), "started": "earlier"}
  path.write_text(json.dumps(record))
  with workdir_lock.acquire(str(workdir)) as lock:
    assert lock.stale == record
    path.write_text(json.dumps(dict(record, host="elsewhere")))   # taken by hand meanwhile
  assert json.loads(path.read_text())["host"] == "elsewhere"   # not this run's: left alone
  with pytest.raises(workdir_lock.WorkdirLockedError, match=f"{path}: held by .* on host "
                                                            "elsewhere.*remove the file"):
    workdir_lock.acquire(str(workdir))


def test_readers_read_a_live_workdir_without_the_lock(reference, tmp_path, capsys, monkeypatch):
  from bindjax.frozen import extract
  workdir = _copy(reference, tmp_path, finished=False)
  holder = _holder(workdir)
  try:
    code, out, _ = run_cli(["report", f"--workdir={workdir}", f"--out={tmp_path / 'report'}",
                         "--draws=5"], capsys, monkeypatch)
    assert code == 0
    # The report of an unfinished sweep says so.
    assert "the sweep is unfinished" in out[-1]
    assert extract.load_workdir(workdir, "latest", replica=0).step == test_sweep.NUM_STEPS
  finally:
    holder.kill()
    holder.wait()


# --------------------------------------------------------------------------------------------
# Results that cannot be silently lost


@pytest.mark.parametrize("damage", ["cut inside line 5", "deleted", "garbled line 10"])
def test_rows_lost_or_damaged_before_the_checkpoint_are_rebuilt(reference, tmp_path, damage):
  workdir = _copy(reference, tmp_path, finished=False)
  path = os.path.join(workdir, layout.RESULTS_FILE)
  lines = reference[1].splitlines(True)
  if damage == "deleted":
    os.remove(path)
  elif damage.startswith("cut"):
    open(path, "w").write("".join(lines[:4]) + lines[4][:30])
  else:
    open(path, "w").write("".join(lines[:9] + ["{garbage\n"] + lines[10:]))
  messages = _resume(workdir)
  assert any("were missing or damaged; rebuilt them from the checkpoints" in m
             for m in messages), messages
  assert _text(workdir, layout.RESULTS_FILE) == reference[1]
  assert _text(workdir, layout.SUMMARY_FILE) == _text(reference[0], layout.SUMMARY_FILE)


def test_a_finished_run_with_a_damaged_results_file_is_rebuilt(reference, tmp_path):
  workdir = _copy(reference, tmp_path)
  os.remove(os.path.join(workdir, layout.RESULTS_FILE))
  messages = _resume(workdir)
  assert "rebuilt it from the checkpoints" in messages[0] and "is finished" in messages[1]
  assert _text(workdir, layout.RESULTS_FILE) == reference[1]


def test_rows_missing_behind_a_checkpoint_without_rows_are_refused(reference, tmp_path):
  """Checkpoints written before they held rows: results.jsonl is the only copy, and a resume
  that finds rows missing from it refuses, naming them, and leaves everything as it was."""
  workdir = _copy(reference, tmp_path, finished=False)
  with checkpoint.Checkpoints(layout.Workdir(workdir).bucket_dir(0)) as ckpt:
    for step in ckpt.all_steps():
      metadata = os.path.join(ckpt.path(step), "metadata", "metadata")
      saved = json.load(open(metadata))
      del saved["rows"], saved[checkpoint.CHECKSUM_KEY]
      json.dump(saved, open(metadata, "w"))
  path = os.path.join(workdir, layout.RESULTS_FILE)
  lines = reference[1].splitlines(True)
  open(path, "w").write("".join(lines[:3] + lines[4:]))   # replica 3's row of step 1 is gone
  before = _snapshot(workdir)
  with pytest.raises(ValueError, match=r"lacks 1 rows of bucket 0 up to its checkpoint at step "
                                       r"6 \(first: replica \d+, step \d\)"):
    _resume(workdir)
  assert _snapshot(workdir) == before


def test_a_bad_line_before_the_last_stops_every_reader(reference, tmp_path, capsys,
                                                       monkeypatch):
  workdir = _copy(reference, tmp_path)
  path = os.path.join(workdir, layout.RESULTS_FILE)
  lines = reference[1].splitlines(True)
  open(path, "w").write("".join(lines[:9] + ['{"kind": "eval", "repl\n'] + lines[10:]))
  with pytest.raises(ValueError, match=f"{path}:10: not a JSON object"):
    layout.Workdir(workdir).read_rows()
  code, _, err = run_cli(["report", f"--workdir={workdir}", f"--out={tmp_path / 'r'}"], capsys,
                      monkeypatch)
  assert code == flags.INPUT_ERROR and len(err) == 1 and f"{path}:10: " in err[0], err
  assert not os.path.exists(tmp_path / "r")
  # A torn last line (a writer killed mid-append) is skipped, with a one-line warning.
  open(path, "w").write(reference[1] + '{"kind": "eval", "repl')
  code, _, err = run_cli(["report", f"--workdir={workdir}", f"--out={tmp_path / 'r'}",
                       "--draws=5"], capsys, monkeypatch)
  assert code == 0
  assert err == [f"bindjax report: warning: {path}:{len(lines) + 1}: skipped a torn last line "
                 "(a writer was killed while appending it)"]


# --------------------------------------------------------------------------------------------
# Checkpoints that verify themselves


@pytest.mark.parametrize("damage", ["64 bytes flipped", "3 low bits flipped", "truncated",
                                    "empty metadata"])
def test_a_damaged_checkpoint_is_detected_and_the_run_falls_back(reference, tmp_path, damage):
  workdir = _copy(reference, tmp_path, finished=False)
  target = os.path.join(layout.Workdir(workdir).bucket_dir(0), "6")
  if damage == "empty metadata":
    open(os.path.join(target, "metadata", "metadata"), "w").close()
  else:
    # Every data file: a file can hold bytes a restore never reads (OCDBT's layout varies with
    # the order of its writes), so damage to one chosen file is not always damage to the state.
    for data in _data_files(workdir, 6):
      size = os.path.getsize(data)
      if damage == "truncated":
        os.truncate(data, size // 2)
      elif damage.startswith("64"):
        _flip(data, range(size // 2, size // 2 + 64))
      else:
        _flip(data, (size // 3, size // 2, 2 * size // 3), mask=0x01)
  messages = _resume(workdir)
  falls_back = [m for m in messages if m.endswith("; falling back to the previous checkpoint")]
  assert len(falls_back) == 1 and falls_back[0].startswith(f"checkpoint {target}"), messages
  assert "bucket 0: resumed from the checkpoint at step 4" in messages
  # No false divergence: the rows and the final checkpoint equal the uninterrupted run's.
  assert _text(workdir, layout.RESULTS_FILE) == reference[1]
  _assert_same_final_state(workdir, reference[0])


def test_a_run_whose_checkpoints_are_all_damaged_refuses_and_rewrites_nothing(
    reference, tmp_path, capsys, monkeypatch):
  workdir = _copy(reference, tmp_path, finished=False)
  path = os.path.join(workdir, layout.RESULTS_FILE)
  open(path, "w").write(reference[1][:len(reference[1]) // 2])
  for step in (4, 6):
    for data in _data_files(workdir, step):
      _flip(data, [os.path.getsize(data) // 2], mask=0x01)
  before = _snapshot(workdir)
  code, _, err = run_cli(["sweep", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress",
                       "--noreport"], capsys, monkeypatch)
  assert code == flags.INPUT_ERROR, err
  assert len(err) == 1 and err[0].startswith("bindjax sweep: checkpoint ")
  assert "no checkpoint of " in err[0] and "(damaged: steps 4, 6)" in err[0]
  assert _snapshot(workdir) == before


def test_checkpoint_restore_names_the_damaged_array(reference, tmp_path):
  """A flipped bit in the stored arrays is refused, never restored as other numbers: where the
  damaged bytes still decode, the checksum names the array. Where a flip lands in compressed
  framing the store itself fails to decode it (also refused, with another message), and which
  bytes are framing depends on the trained values, so several places of the file are tried; and
  a file can hold bytes a restore never reads, so the largest files are tried in turn."""
  _, original = _final_state(_copy(reference, tmp_path / "intact"))
  sizes = [os.path.getsize(f) for f in _data_files(reference[0], 6)]
  largest = sorted(range(len(sizes)), key=lambda i: -sizes[i])[:3]
  named = []
  for i, (file, fraction) in enumerate(itertools.product(largest,
                                                         (0.5, 0.3, 0.7, 0.4, 0.6, 0.2))):
    workdir = _copy(reference, tmp_path / str(i))
    data = _data_files(workdir, 6)[file]
    _flip(data, [int(os.path.getsize(data) * fraction)], mask=0x04)
    try:
      _, restored = _final_state(workdir)
    except checkpoint.CorruptCheckpointError as e:
      assert "/bucket_000/6" in str(e), e
      named.append(re.search(r"array \[.*\] does not match the checksum recorded when it was "
                             r"saved", str(e)) is not None)
      if named[-1]:
        break
      continue
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(restored),
                                                    jax.tree.leaves(original))), fraction
  assert any(named), named


def _final_state(workdir):
  _, (bucket,) = grid.expand_grid(test_sweep.tiny_config())
  inputs, _ = parallel.pad_to_multiple(bucket.stacked_inputs(), 16)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.eval_shape(lambda h: bucket_programs.init_bucket_state(h, bucket.spec, True), inputs)
  with checkpoint.Checkpoints(layout.Workdir(workdir).bucket_dir(0)) as ckpt:
    return ckpt.all_steps(), bucket_programs.restore_state(ckpt.restore, target, device)


def _assert_same_final_state(workdir, reference_workdir):
  (steps, (step, state, _)), (ref_steps, (ref_step, ref_state, _)) = (
      _final_state(workdir), _final_state(reference_workdir))
  assert (steps, step) == (ref_steps, ref_step)
  jax.tree.map(np.testing.assert_array_equal, state, ref_state)


# --------------------------------------------------------------------------------------------
# What a rerun and --overwrite may touch


def test_a_rerun_into_a_finished_workdir_changes_nothing(reference, tmp_path, capsys,
                                                         monkeypatch):
  workdir = _copy(reference, tmp_path)
  report.make_report(workdir, num_draws=5, formats=("png",))
  before = _snapshot(workdir)
  code, out, _ = run_cli(["sweep", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress"],
                      capsys, monkeypatch)
  assert code == 0 and out[-1].startswith("report: left as it is"), out
  assert _snapshot(workdir) == before


def _shift_seed_of_replica_3(replicas):
  replicas[3]["seed"] += 10
  return replicas, r"from replica 3 on: seed \d+ there, \d+ in the grid;"


def _drop_the_last_replica(replicas):
  return replicas[:-1], (rf"from replica {len(replicas) - 1} on: the file ends before it, "
                         r"the grid has ")


@pytest.mark.parametrize("finished", [False, True], ids=["resume", "finished"])
@pytest.mark.parametrize("edit", [_shift_seed_of_replica_3, _drop_the_last_replica])
def test_a_run_whose_replicas_file_differs_from_the_grid_is_refused(reference, tmp_path, edit,
                                                                     finished):
  workdir = _copy(reference, tmp_path, finished=finished)
  path = os.path.join(workdir, layout.REPLICAS_FILE)
  replicas, message = edit(files.read_json(path))
  files.write_json(path, replicas)
  before = _snapshot(workdir)
  with pytest.raises(errors.ConfigError, match=message):
    _resume(workdir)
  assert _snapshot(workdir) == before


def test_overwrite_removes_only_what_bindjax_recorded(reference, tmp_path, capsys, monkeypatch):
  workdir = _copy(reference, tmp_path)
  report.make_report(workdir, num_draws=5, formats=("png",))
  mine = {os.path.join(workdir, "report", "my_figure.png"): b"a user's figure",
          os.path.join(workdir, "notes.txt"): b"a user's notes"}
  for path, data in mine.items():
    open(path, "wb").write(data)
  code, _, err = run_cli(["sweep", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress",
                       "--overwrite"], capsys, monkeypatch)
  assert code == 0, err
  for path, data in mine.items():
    assert open(path, "rb").read() == data
  assert _text(workdir, layout.RESULTS_FILE) == reference[1]
  assert os.path.exists(os.path.join(workdir, "report", "phase_transition.png"))


def test_overwrite_into_a_foreign_directory_refuses_names_like_outputs(tmp_path, capsys,
                                                                       monkeypatch):
  workdir = tmp_path / "foreign"
  workdir.mkdir()
  (workdir / layout.SUMMARY_FILE).write_text("a user's table")
  before = _snapshot(workdir)
  code, _, err = run_cli(["sweep", f"--config={CONFIG}", f"--workdir={workdir}", "--overwrite"],
                      capsys, monkeypatch)
  assert code == flags.USAGE_ERROR and len(err) == 1, err
  assert f"holds {layout.SUMMARY_FILE}, which bindjax did not record as its outputs" in err[0]
  assert _snapshot(workdir) == before


def test_summary_has_one_line_per_replica_diverged_ones_included(reference):
  workdir, _ = reference
  import csv
  with open(os.path.join(workdir, layout.SUMMARY_FILE)) as f:
    table = list(csv.DictReader(f))
  assert [int(r["replica"]) for r in table] == list(range(12))
  diverged = [r for r in table if float(r["learning_rate"]) == test_sweep.HUGE_LR]
  assert len(diverged) == 6 and all(r["diverged_step"] == "1" for r in diverged)
  assert all(r["final heldout/object_accuracy"] == "" for r in diverged)
  # The report counts them too, as diverged points of their own series.
  sweep_rows = layout.Workdir(workdir).read_rows()
  series = report.aggregate(results.select_evaluations(sweep_rows, "final"))
  counts = [p["diverged"] for s in series for p in s["points"]
            if s["key"]["learning_rate"] == test_sweep.HUGE_LR]
  assert counts == [3, 3]


# --------------------------------------------------------------------------------------------
# A full disk


def test_a_full_disk_ends_the_run_with_one_line_and_the_rerun_is_exact(
    reference, tmp_path, capsys, monkeypatch):
  """The disk fills once the first checkpoint is written: the next checkpoint's data cannot be
  written (a real write error: RLIMIT_FSIZE caps every file below a checkpoint data file)."""
  import resource
  workdir = str(tmp_path / "full")
  save = checkpoint.Checkpoints.save
  limits = resource.getrlimit(resource.RLIMIT_FSIZE)

  def fill_the_disk_after_the_first_save(self, step, state, metadata=None):
    save(self, step, state, metadata)
    self.wait()
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, limits[1]))

  monkeypatch.setattr(checkpoint.Checkpoints, "save", fill_the_disk_after_the_first_save)
  try:
    code, _, err = run_cli(["sweep", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress",
                         "--noreport"], capsys, monkeypatch)
  finally:
    resource.setrlimit(resource.RLIMIT_FSIZE, limits)
  assert code == flags.INPUT_ERROR and len(err) == 1, err
  assert err[0].startswith(f"bindjax sweep: cannot write checkpoint {workdir}/checkpoints/")
  assert not os.path.exists(os.path.join(workdir, layout.DONE_FILE))
  monkeypatch.setattr(checkpoint.Checkpoints, "save", save)   # space freed
  messages = _resume(workdir)
  assert "bucket 0: resumed from the checkpoint at step 2" in messages
  assert _text(workdir, layout.RESULTS_FILE) == reference[1]
  _assert_same_final_state(workdir, reference[0])


def test_a_full_disk_while_appending_rows(reference, tmp_path, capsys, monkeypatch):
  """ENOSPC from the results writer (injected at files.append_jsonl, after half a batch of rows
  reached the file): one line, exit 1; the rerun rebuilds the rows exactly."""
  import errno
  workdir = str(tmp_path / "full_rows")
  append = files.append_jsonl
  calls = []

  def append_until_full(f, rows):
    calls.append(len(rows))
    if len(calls) == 4:
      f.write(files.dumps(rows[0])[:50])
      raise OSError(errno.ENOSPC, "No space left on device")
    append(f, rows)

  monkeypatch.setattr(files, "append_jsonl", append_until_full)
  code, _, err = run_cli(["sweep", f"--config={CONFIG}", f"--workdir={workdir}", "--noprogress",
                       "--noreport"], capsys, monkeypatch)
  assert code == flags.INPUT_ERROR and err == [
      f"bindjax sweep: [Errno 28] cannot write {workdir}/{layout.RESULTS_FILE}: No space left "
      "on device"], err
  monkeypatch.setattr(files, "append_jsonl", append)
  _resume(workdir)
  assert _text(workdir, layout.RESULTS_FILE) == reference[1]


# --------------------------------------------------------------------------------------------
# Fault injection

# Killing a run at one of these points (public seams only), then damaging what it left.
_KILL = textwrap.dedent("""
    import os, signal, sys
    from bindjax.base import files
    from bindjax.training import sweep
    from bindjax.workdir import checkpoint
    import test_sweep
    workdir, where, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    calls = []
    def die():
      os.kill(os.getpid(), signal.SIGKILL)
    if where == "append":      # in the middle of writing a batch of rows
      append = files.append_jsonl
      def torn(f, rows):
        calls.append(1)
        if len(calls) == n:
          text = "".join(files.dumps(row) + "\\n" for row in rows)
          f.write(text[:len(text) // 2])
          f.flush()
          die()
        append(f, rows)
      files.append_jsonl = torn
    elif where in ("before save", "during save"):
      save = checkpoint.Checkpoints.save
      def killing(self, step, state, metadata=None):
        calls.append(1)
        if len(calls) == n and where == "before save":
          die()
        save(self, step, state, metadata)
        if len(calls) == n:
          die()   # the asynchronous write is still going
      checkpoint.Checkpoints.save = killing
    elif where == "before done":
      write_json = files.write_json
      def before_done(path, value, **kwargs):
        if str(path).endswith("sweep_done.json"):
          die()
        write_json(path, value, **kwargs)
      files.write_json = before_done
    def log(message):
      if where == "compile" and "compiled" in message:
        die()
    sweep.run_sweep(test_sweep.tiny_config(), workdir, progress=False, log=log)
    """)
_KILL_POINTS = ([("compile", 0), ("before done", 0)] + [("append", n) for n in range(1, 7)]
                + [(w, n) for w in ("before save", "during save") for n in (1, 2, 3)])
_DAMAGE = ("none", "cut the results", "delete the results", "garble a line", "flip checkpoint "
           "bytes", "empty checkpoint metadata", "delete the summary")


def _damage(workdir, what, rng):
  path = os.path.join(workdir, layout.RESULTS_FILE)
  text = open(path).read() if os.path.exists(path) else ""
  lines = text.splitlines(True)
  steps = [int(s) for s in os.listdir(layout.Workdir(workdir).bucket_dir(0)) if s.isdigit()]
  if what == "cut the results" and text:
    open(path, "w").write(text[:rng.randrange(len(text))])
  elif what == "delete the results" and text:
    os.remove(path)
  elif what == "garble a line" and len(lines) > 2:
    lines[rng.randrange(len(lines) - 1)] = "{not json\n"
    open(path, "w").write("".join(lines))
  elif what == "flip checkpoint bytes" and steps:
    data = _data_files(workdir, rng.choice(steps))
    chosen = rng.choice(data)
    _flip(chosen, [rng.randrange(os.path.getsize(chosen)) for _ in range(rng.randint(1, 64))])
  elif what == "empty checkpoint metadata" and steps:
    open(os.path.join(layout.Workdir(workdir).bucket_dir(0), str(rng.choice(steps)),
                      "metadata", "metadata"), "w").close()
  elif what == "delete the summary" and os.path.exists(os.path.join(workdir,
                                                                    layout.SUMMARY_FILE)):
    os.remove(os.path.join(workdir, layout.SUMMARY_FILE))
  else:
    return "none"
  return what


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_fault_injection_kill_and_damage_then_resume_equals_an_uninterrupted_run(
    reference, tmp_path, seed):
  rng = random.Random(seed)
  where, n = rng.choice(_KILL_POINTS)
  damage = rng.choice(_DAMAGE)
  workdir = str(tmp_path / "faulty")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
                 [REPO, os.path.join(REPO, "tests"), os.environ.get("PYTHONPATH", "")]))
  env.update(JAX_COMPILATION_CACHE_DIR=str(tmp_path.parent / "fault_injection_jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  proc = subprocess.run([sys.executable, "-c", _KILL, workdir, where, str(n)], env=env,
                        cwd=REPO, capture_output=True, text=True, timeout=900)
  assert proc.returncode == -signal.SIGKILL, (where, n, proc.stderr[-3000:])
  done = _damage(workdir, damage, rng) if os.path.isdir(
      layout.Workdir(workdir).bucket_dir(0)) else "none"
  with checkpoint.Checkpoints(layout.Workdir(workdir).bucket_dir(0)) as ckpt:
    saved = ckpt.all_steps()
  try:
    _resume(workdir)
  except checkpoint.CorruptCheckpointError as e:
    # Only when the damage left no checkpoint that verifies; then nothing was rewritten.
    assert done in ("flip checkpoint bytes", "empty checkpoint metadata") and len(saved) == 1, e
    _resume(workdir, overwrite=True)
  assert _text(workdir, layout.RESULTS_FILE) == reference[1], (where, n, done)
  assert _text(workdir, layout.SUMMARY_FILE) == _text(reference[0], layout.SUMMARY_FILE)
  assert os.path.exists(os.path.join(workdir, layout.DONE_FILE))
  _assert_same_final_state(workdir, reference[0])
  assert not os.path.exists(os.path.join(workdir, layout.LOCK_FILE))
