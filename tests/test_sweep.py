"""Coverage sweep: vmapped = separate runs, sharded = unsharded, multi-process, resume, NaN."""
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from bindjax.base import files
from bindjax.commands import flags
from bindjax.runtime import parallel
from bindjax.runtime import program_store
from bindjax.runtime import xla_options
from bindjax.training import bucket_programs
from bindjax.training import grid
from bindjax.training import sweep
from bindjax.training import train
from bindjax.workdir import checkpoint
from bindjax.workdir import layout
from bindjax.workdir import results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESETS = os.path.join(REPO, "experiments", "coverage_sweep.py")

NUM_STEPS = 6
HEALTHY_LR, HUGE_LR = 3e-3, 1e38
# Its replicas' parameter norm overflows at step 2: inside a dispatch of several steps.
MID_LR = 1e10


def tiny_config():
  """12 replicas (2 coverages × 3 seeds × 2 learning rates, one of them diverging), 1 bucket."""
  c = flags.load_config(f"{PRESETS}:smoke")
  c.grid.spaces = ((2, 3),)
  c.grid.coverages = (0.5, 0.8)
  c.grid.seeds = (0, 1, 2)
  c.grid.learning_rates = (HEALTHY_LR, HUGE_LR)
  c.model.update(d_model=16, num_heads=2, num_layers=1, d_ff=32, d_out=8)
  c.sampler.update(batch_size=8, max_concept_queries=8, max_positive_queries=8)
  c.num_steps = NUM_STEPS
  c.eval.update(every=3, batches=2, batch_size=8)
  c.log_every = 1
  c.checkpoint.update(every=2, keep=2)
  return c


def multi_step_config(log_every=NUM_STEPS):
  """tiny_config's bucket (the same programs) with half its replicas diverging at step 2; with
  the default log_every, rows only at steps 3 (evaluation), 4 (checkpoint) and 6, so the loop
  dispatches steps 1-3, 4 and 5-6."""
  c = tiny_config()
  c.grid.learning_rates = (HEALTHY_LR, MID_LR)
  c.log_every = log_every
  c.checkpoint.every = 4
  return c


def get_config(arg=None):
  """Lets subprocesses use this file as --config."""
  del arg
  return tiny_config()


def _rows(workdir):
  return files.read_jsonl(os.path.join(workdir, layout.RESULTS_FILE))


def _numbers(row):
  return {k: v for k, v in row.items() if isinstance(v, float)}


def assert_rows_close(got, expected, rtol=1e-4, atol=1e-5):
  assert [(r["replica"], r["step"], r["kind"]) for r in got] == [
      (r["replica"], r["step"], r["kind"]) for r in expected]
  for a, b in zip(got, expected):
    assert set(a) == set(b)
    for key, value in _numbers(b).items():
      np.testing.assert_allclose(a[key], value, rtol=rtol, atol=atol,
                                 err_msg=f"replica {b['replica']} step {b['step']} {key}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The tiny sweep on all 8 fake devices (16 padded replicas, 2 per device)."""
  workdir = str(tmp_path_factory.mktemp("reference"))
  done = sweep.run_sweep(tiny_config(), workdir, progress=False)
  return workdir, done, _rows(workdir)


def test_expand_grid_buckets_and_validation():
  replicas, buckets = grid.expand_grid(tiny_config())
  assert len(replicas) == 12 and len(buckets) == 1
  assert [r.coverage for r in replicas[:6]] == [0.5, 0.5, 0.5, 0.8, 0.8, 0.8]
  assert [r.num_train for r in replicas[:6:3]] == [4, 7]
  c = tiny_config()
  c.grid.spaces = ((2, 3), (2, 4, 3))
  c.grid.models = ({"name": "a"}, {"d_model": 8, "num_heads": 2})
  replicas, buckets = grid.expand_grid(c)
  assert len(replicas) == 48 and len(buckets) == 4
  assert {r.model for r in replicas} == {"a", "d_model=8,num_heads=2"}
  assert buckets[2].spec.space.max_objects == 3
  c.grid.coverages = (0.5, 1.5)
  with pytest.raises(ValueError, match=r"grid.coverages\[1\]=1.5"):
    grid.expand_grid(c)
  c = tiny_config()
  c.grid.models = ({"width": 3},)
  with pytest.raises(ValueError, match="unknown model field 'width'"):
    grid.expand_grid(c)


def test_sweep_rows_and_nan_replicas(reference):
  workdir, done, rows = reference
  assert done["num_replicas"] == 12 and done["num_diverged"] == 6
  by_replica = {}
  for row in rows:
    by_replica.setdefault(row["replica"], []).append(row)
  for replica, mine in by_replica.items():
    if mine[0]["learning_rate"] == HUGE_LR:
      # Flagged once, then left out; nothing else of the sweep is affected.
      assert [r["kind"] for r in mine] == ["diverged"] and mine[0]["diverged_step"] == 1
    else:
      assert [r["step"] for r in mine] == list(range(1, NUM_STEPS + 1))
      assert [r["kind"] for r in mine] == ["train", "train", "eval"] * 2
      assert all(np.isfinite(r["loss"]) for r in mine)
      evaluation = mine[-1]
      for key in ("heldout/object_accuracy", "heldout/object_accuracy_2obj",
                  "heldout/concept_accuracy", "train/object_accuracy", "tau", "coverage"):
        assert evaluation[key] is not None
  assert len(by_replica) == 12
  summary = open(os.path.join(workdir, layout.SUMMARY_FILE)).read().splitlines()
  assert len(summary) == 1 + 12  # one line per replica, diverged ones included
  assert json.load(open(os.path.join(workdir, layout.CONFIG_FILE)))["grid"]["seeds"] == [0, 1, 2]


def test_vmapped_sweep_equals_separate_runs(reference):
  """The central invariant: replicas of the vmapped, sharded sweep = single unbatched runs."""
  _, _, rows = reference
  replicas, buckets = grid.expand_grid(tiny_config())
  spec = buckets[0].spec
  options = xla_options.compiler_options(jax.default_backend(), fast_compile=True)
  inputs = jax.device_put(buckets[0].members[0].inputs)
  init = jax.jit(lambda h: train.init(h.key, spec, h)).lower(inputs).compile(options)
  state = init(inputs)
  step = jax.jit(lambda s, h: train.train_step(s, h, spec)).lower(state, inputs).compile(options)
  evaluate = jax.jit(lambda p, k, h: train.eval_step(p, k, h, spec)).lower(
      state.params, train.eval_key(inputs.key, 0), inputs).compile(options)
  for index in (0, 4):  # coverage 0.5 seed 0, coverage 0.8 seed 1
    inputs = jax.device_put(buckets[0].members[index].inputs)
    state = init(inputs)
    expected = []
    for done in range(1, NUM_STEPS + 1):
      state, metrics = step(state, inputs)
      row = {results.RENAMED.get(k, k): float(metrics[k]) for k in results.TRAIN_METRICS}
      if done % 3 == 0:
        row.update({k: float(v) for k, v in
                    evaluate(state.params, train.eval_key(inputs.key, done), inputs).items()})
      expected.append(row)
    got = [r for r in rows if r["replica"] == index]
    assert len(got) == NUM_STEPS
    for a, b in zip(got, expected):
      for key, value in b.items():
        np.testing.assert_allclose(a[key], value, rtol=1e-4, atol=1e-5,
                                   err_msg=f"replica {index} step {a['step']} {key}")


def test_unsharded_chunked_equals_sharded(reference, tmp_path):
  _, _, rows = reference
  c = tiny_config()
  c.sweep.chunk_size = "4"  # 3 chunks of 4 replicas on one device
  sweep.run_sweep(c, str(tmp_path), progress=False, devices=jax.devices()[:1])
  assert_rows_close(_rows(str(tmp_path)), rows)


def test_rerun_into_finished_workdir_does_nothing(reference):
  workdir, done, _ = reference
  path = os.path.join(workdir, layout.RESULTS_FILE)
  before = (open(path).read(), os.stat(path).st_mtime_ns)
  messages = []
  again = sweep.run_sweep(tiny_config(), workdir, progress=False, log=messages.append)
  assert again == done and "is finished" in messages[0]
  assert (open(path).read(), os.stat(path).st_mtime_ns) == before
  other = tiny_config()
  other.grid.seeds = (5,)
  os.rename(os.path.join(workdir, layout.DONE_FILE), os.path.join(workdir, "done.bak"))
  try:
    with pytest.raises(ValueError, match="different config"):
      sweep.run_sweep(other, workdir, progress=False)
  finally:
    os.rename(os.path.join(workdir, "done.bak"), os.path.join(workdir, layout.DONE_FILE))


def test_extract_reads_any_replica_with_its_best_parameters(reference, tmp_path, capsys):
  """A sweep replica becomes a model: its best parameters are those of the evaluation that
  results.select_evaluations calls best, and --replica picks it on the command line."""
  from bindjax.commands import main as cli
  from bindjax.frozen import extract
  workdir, _, rows = reference
  best = {r["replica"]: r["step"] for r in results.select_evaluations(rows, "best")}
  for index in (0, 4):
    trained = extract.load_workdir(workdir, "best", replica=index)
    latest = extract.load_workdir(workdir, "latest", replica=index)
    assert trained.step == best[index] and latest.step == NUM_STEPS
    assert trained.source["coordinates"]["replica"] == index
    assert trained.split.num_train == [r for r in rows if r["replica"] == index][0][
        "num_train_objects"]
    if trained.step != latest.step:
      assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(trained.params),
                                                          jax.tree.leaves(latest.params)))
  # A diverged replica (huge learning rate) has no best; its state is its last finite one.
  diverged = extract.load_workdir(workdir, "best", replica=7)
  assert diverged.step == 0 and diverged.source["checkpoint"] == "latest"
  with pytest.raises(ValueError, match="holds 12 replicas: pass --replica=N"):
    extract.load_workdir(workdir)
  with pytest.raises(ValueError, match="replica=12: expected 0..11"):
    extract.load_workdir(workdir, replica=12)
  out = tmp_path / "embeddings"
  capsys.readouterr()
  assert cli.main(["extract", f"--workdir={workdir}", "--replica=4", f"--out={out}"]) == 0
  assert os.path.isdir(out)
  assert f"step {best[4]} (its best held-out object accuracy)" in capsys.readouterr().out
  with pytest.raises(SystemExit) as e:   # which replica is the user's to say: a usage error
    cli.main(["extract", f"--workdir={workdir}", f"--out={tmp_path / 'other'}"])
  assert e.value.code == 2 and "pass --replica=N" in capsys.readouterr().err


def test_overwrite_reruns_a_finished_workdir(reference, tmp_path):
  workdir, _, rows = reference
  copy = str(tmp_path / "copy")
  shutil.copytree(workdir, copy)
  with open(os.path.join(copy, layout.RESULTS_FILE), "a") as f:
    f.write('{"stale": true}\n')
  messages = []
  sweep.run_sweep(tiny_config(), copy, progress=False, overwrite=True, log=messages.append)
  assert not any("is finished" in m for m in messages)
  assert _rows(copy) == rows  # same compiled program, same numbers


def test_dispatches_end_where_rows_are_written():
  _, (bucket,) = grid.expand_grid(multi_step_config())
  assert sweep.dispatch_ends(bucket.spec, NUM_STEPS, 4) == [3, 4, 6]
  # The step after rows that wait for the next dispatch ends one too (a stop may follow them).
  assert sweep.dispatch_ends(bucket.spec, 2, 6) == [2, 3, 4, 5, 6]
  assert sweep.dispatch_ends(bucket.spec, NUM_STEPS, 4, start=4) == [6]
  spec = dataclasses.replace(bucket.spec, num_steps=1000, eval_every=500)
  ends = sweep.dispatch_ends(spec, 100, 1000)
  assert len(ends) == 19 and ends[:4] == [100, 101, 200, 201] and ends[-2:] == [901, 1000]


def test_loop_settings_share_one_program():
  """Runs that differ only in steps, warm-up, evaluation or logging cadence use the same
  compiled programs; the schedule's length they run with is the one their inputs carries."""
  longer = multi_step_config()
  longer.num_steps, longer.eval.every, longer.log_every = 40, 7, 5
  longer.optimizer.warmup_fraction = 0.25
  (mesh, inputs_a, init_a, run_a), (_, inputs_b, init_b, run_b) = (
      _compiled_bucket(c) for c in (multi_step_config(), longer))
  assert init_a is init_b and run_a is run_b
  two = bucket_programs.global_scalar(2, mesh)
  lr_a = np.asarray(run_a(init_a(inputs_a), inputs_a, two)[1]["learning_rate"])
  lr_b = np.asarray(run_b(init_b(inputs_b), inputs_b, two)[1]["learning_rate"])
  # The metrics are those of the update at step 1, under each run's own schedule.
  peak = np.asarray(inputs_a.learning_rate)
  warmup = int(multi_step_config().optimizer.warmup_fraction * NUM_STEPS)
  expected_a = peak * float(train.learning_rate_multiplier(1, NUM_STEPS, warmup))
  np.testing.assert_allclose(lr_a, expected_a, rtol=1e-6)
  np.testing.assert_allclose(lr_b, peak * float(train.learning_rate_multiplier(1, 40, 10)),
                             rtol=1e-6)
  assert not np.allclose(lr_a, lr_b)


def _compiled_bucket(config):
  _, (bucket,) = grid.expand_grid(config)
  mesh = parallel.make_mesh()
  inputs_np, _ = parallel.pad_to_multiple(bucket.stacked_inputs(), 8)
  inputs = parallel.shard_replicas(inputs_np, mesh)
  # As run_sweep compiles it, so the reference's programs are reused.
  init_fn, run_fn, _, _ = bucket_programs.compile_bucket(
      bucket.spec, mesh, inputs, log=lambda *_: None, fast_compile=True, keep_best=True)
  return mesh, inputs, init_fn, run_fn


def test_k_steps_in_one_dispatch_equal_k_dispatches_of_one_step():
  """Bit for bit, states and metrics, with replicas diverging at step 2 of 3 (kept at their
  state after step 1) and at step 1 (kept at their initial state)."""
  c = multi_step_config()
  c.grid.learning_rates = (HUGE_LR, MID_LR)
  mesh, inputs, init_fn, run_fn = _compiled_bucket(c)
  state = init_fn(inputs)
  for _ in range(3):
    state, metrics = run_fn(state, inputs, bucket_programs.global_scalar(1, mesh))
  one_by_one = parallel.to_host((state, metrics))
  state, metrics = run_fn(init_fn(inputs), inputs, bucket_programs.global_scalar(3, mesh))
  at_once = parallel.to_host((state, metrics))
  assert jax.tree.structure(at_once) == jax.tree.structure(one_by_one)
  for a, b in zip(jax.tree.leaves(at_once), jax.tree.leaves(one_by_one)):
    assert a.tobytes() == b.tobytes()
  diverged_R = at_once[1]["diverged_step"][:12]
  np.testing.assert_array_equal(diverged_R, [1] * 6 + [2] * 6)
  np.testing.assert_array_equal(at_once[0]["train"].step[:12], diverged_R - 1)


@pytest.fixture(scope="module")
def multi_step(tmp_path_factory):
  """multi_step_config's sweep: (workdir, results.jsonl text)."""
  workdir = str(tmp_path_factory.mktemp("multi_step") / "run")
  sweep.run_sweep(multi_step_config(), workdir, progress=False, log=lambda *_: None)
  return workdir, open(os.path.join(workdir, layout.RESULTS_FILE)).read()


def test_rows_and_checkpoints_do_not_depend_on_the_steps_per_dispatch(multi_step, tmp_path):
  """Dispatches of 3, 1 and 2 steps write exactly the rows and checkpoints that one step per
  dispatch (rows at every step) writes at those steps, divergence step included."""
  workdir, _ = multi_step
  single = str(tmp_path / "single")
  sweep.run_sweep(multi_step_config(log_every=1), single, progress=False, log=lambda *_: None)
  rows, per_step = _rows(workdir), _rows(single)
  assert results.diverged_steps(rows) == results.diverged_steps(per_step) == {
      i: 2 for i in range(6, 12)}
  healthy = [r for r in per_step if r["kind"] != "diverged" and r["step"] in (3, 4, 6)]
  assert [r for r in rows if r["kind"] != "diverged"] == healthy
  assert [r["step"] for r in rows if r["kind"] == "diverged"] == [3] * 6
  with checkpoint.Checkpoints(layout.Workdir(workdir).bucket_dir(0)) as ckpt:
    assert ckpt.all_steps() == [4, 6]
  for step in (4, 6):
    assert _checkpointed_state(workdir, step) == _checkpointed_state(single, step)


def test_a_resume_into_a_multi_step_dispatch_equals_an_uninterrupted_run(multi_step, tmp_path):
  workdir = str(tmp_path / "resumed")
  shutil.copytree(multi_step[0], workdir)
  os.remove(os.path.join(workdir, layout.DONE_FILE))
  shutil.rmtree(os.path.join(layout.Workdir(workdir).bucket_dir(0), "6"))
  messages = []
  sweep.run_sweep(multi_step_config(), workdir, progress=False, log=messages.append)
  assert "bucket 0: resumed from the checkpoint at step 4" in messages
  assert open(os.path.join(workdir, layout.RESULTS_FILE)).read() == multi_step[1]
  assert _checkpointed_state(workdir, 6) == _checkpointed_state(multi_step[0], 6)


def test_a_bucket_stops_the_step_after_rows_show_every_replica_diverged(tmp_path):
  """Rows at steps 3 and 6 only: step 3's rows are written while step 4 runs in a dispatch of
  its own, and the bucket stops there, as it did with one step per dispatch."""
  c = multi_step_config()
  c.grid.learning_rates = (HUGE_LR, MID_LR)
  c.checkpoint.every = NUM_STEPS
  messages = []
  sweep.run_sweep(c, str(tmp_path), progress=False, log=messages.append)
  assert "bucket 0: every replica diverged; stopped at step 4" in messages
  rows = _rows(str(tmp_path))
  assert [(r["kind"], r["step"]) for r in rows] == [("diverged", 3)] * 12
  assert results.diverged_steps(rows) == {i: 1 if i < 6 else 2 for i in range(12)}
  with checkpoint.Checkpoints(layout.Workdir(str(tmp_path)).bucket_dir(0)) as ckpt:
    assert ckpt.all_steps() == [4]


def _checkpointed_state(workdir, step):
  """The bytes of every array of the bucket's checkpoint at `step`."""
  _, (bucket,) = grid.expand_grid(tiny_config())
  inputs, _ = parallel.pad_to_multiple(bucket.stacked_inputs(), 8)
  target = bucket_programs.abstract_bucket_state(bucket.spec, parallel.make_mesh(), inputs, True)
  with checkpoint.Checkpoints(layout.Workdir(workdir).bucket_dir(0)) as ckpt:
    _, state, _ = bucket_programs.restore_state(ckpt.restore, target, parallel.replica_sharding(
        parallel.make_mesh()), step=step)
  return [x.tobytes() for x in jax.tree.leaves(parallel.to_host(state))]


def env_with_devices(devices):
  """This environment for a subprocess with `devices` CPU devices that imports bindjax and the
  tests from this checkout."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "tests")] +
                                      env.get("PYTHONPATH", "").split(os.pathsep))
  return env


@pytest.mark.slow
def test_sigkill_and_resume_gives_identical_results(reference, tmp_path):
  """Killed right after writing step 5's rows (a torn line too), resumed from step 4."""
  _, _, rows = reference
  workdir = str(tmp_path / "killed")
  script = textwrap.dedent(f"""
      import os, signal
      from bindjax.training import sweep
      from bindjax.workdir import results_writer
      import test_sweep
      add = results_writer.ResultsWriter.add
      def add_then_die(self, bucket, step, *args):
        add(self, bucket, step, *args)
        if step == 5:
          self.file.write('{{"kind": "train", "replica": 0, "st')
          self.file.flush()
          os.kill(os.getpid(), signal.SIGKILL)
      results_writer.ResultsWriter.add = add_then_die
      sweep.run_sweep(test_sweep.tiny_config(), {workdir!r}, progress=False)
      """)
  proc = subprocess.run([sys.executable, "-c", script], env=env_with_devices(8), cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
  assert not os.path.exists(os.path.join(workdir, layout.DONE_FILE))
  assert max(r["step"] for r in _rows(workdir)) == 5
  messages = []
  sweep.run_sweep(tiny_config(), workdir, progress=False, log=messages.append)
  # Step 4's asynchronous checkpoint may not have been finalised before the kill.
  assert any(f"resumed from the checkpoint at step {s}" in m for m in messages for s in (2, 4)), (
      messages)
  assert _rows(workdir) == rows


def free_port():
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_two_processes(config_path, workdir, timeout=300):
  """`bindjax sweep --config=config_path` in 2 processes × 2 devices joined by jax.distributed on
  127.0.0.1; returns (exit codes, outputs)."""
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, "-m", "bindjax.commands.main", "sweep", f"--config={config_path}",
       f"--workdir={workdir}", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
       f"--process_id={i}", "--noprogress", "--noreport"],
      env=env_with_devices(2), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outputs = []
  try:
    for proc in procs:
      outputs.append(proc.communicate(timeout=timeout)[0])
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  return [p.returncode for p in procs], outputs


@pytest.mark.slow
def test_two_processes_equal_one(reference, tmp_path):
  """Two processes × 2 devices joined by jax.distributed on 127.0.0.1, via `bindjax sweep`."""
  _, _, rows = reference
  workdir = str(tmp_path / "two")
  codes, outputs = run_two_processes(os.path.join(REPO, "tests", "test_sweep.py"), workdir)
  assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
  assert "on 4 devices (2 processes)" in outputs[0]
  assert_rows_close(_rows(workdir), rows)


def test_data_axis_splits_each_replicas_batch_and_matches():
  """num_data=2 (4 replica groups × 2 data devices) trains to the same parameters and metrics as
  num_data=1, and the compiled programs really split the scenes (sums across data devices)."""
  _, (bucket,) = grid.expand_grid(tiny_config())
  outcomes = {}
  for num_data in (1, 2):
    mesh = parallel.make_mesh(num_data)
    inputs_np, _ = parallel.pad_to_multiple(bucket.stacked_inputs(),
                                            parallel.num_replica_shards(mesh))
    inputs = parallel.shard_replicas(inputs_np, mesh)
    # fast_compile as the smoke preset runs it, so num_data=1 reuses the reference's program.
    init_fn, run_fn, eval_fn, _ = bucket_programs.compile_bucket(
        bucket.spec, mesh, inputs, "none", log=lambda *_: None, fast_compile=True)
    state, history = init_fn(inputs), []
    for _ in range(3):
      state, metrics = run_fn(state, inputs, bucket_programs.global_scalar(1, mesh))
      history.append(parallel.to_host(metrics))
    step = bucket_programs.global_scalar(3, mesh)
    state, metrics = eval_fn(state, inputs, step)
    history.append(parallel.to_host(metrics))
    outcomes[num_data] = (run_fn.as_text() + eval_fn.as_text(),
                         (history, parallel.to_host(state["train"].params)))
  (hlo_1, history_1), (hlo_2, history_2) = outcomes[1], outcomes[2]
  assert "all-reduce" not in hlo_1
  assert "all-reduce" in hlo_2
  size = len(bucket.replicas)  # padding differs: 16 rows on 8 replica shards, 12 on 4
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a[:size], b[:size], rtol=1e-4, atol=1e-5),
      history_2, history_1)


def test_checkpoints_hold_the_per_layer_layout(tmp_path):
  """A bucket state of scanned towers is saved with every tower (parameters, Adam moments, best
  parameters) in the per-layer layout, which a target built for per-layer towers reads as it
  is, and restores to the scanned state it was."""
  config = tiny_config()
  config.model.num_layers = 3
  _, (bucket,) = grid.expand_grid(config)
  mesh = parallel.make_mesh()
  inputs_np, _ = parallel.pad_to_multiple(bucket.stacked_inputs(), 8)
  inputs = parallel.shard_replicas(inputs_np, mesh)
  sharding = parallel.replica_sharding(mesh)
  state = jax.jit(lambda h: bucket_programs.init_bucket_state(h, bucket.spec, True),
                  compiler_options=xla_options.compiler_options("cpu", fast_compile=True))(inputs)
  with checkpoint.Checkpoints(tmp_path / "ckpt") as ckpt:
    ckpt.save(2, bucket_programs.checkpoint_state(state, sharding))
  per_layer_spec = dataclasses.replace(
      bucket.spec, model=dataclasses.replace(bucket.spec.model, scan_layers=False))
  target = bucket_programs.abstract_bucket_state(bucket.spec, mesh, inputs, True)
  with checkpoint.Checkpoints(tmp_path / "ckpt") as ckpt:
    _, per_layer, _ = ckpt.restore(
        bucket_programs.abstract_bucket_state(per_layer_spec, mesh, inputs, True))
    step, restored, _ = bucket_programs.restore_state(ckpt.restore, target, sharding)
  assert step == 2
  assert sorted(per_layer["best"]["params"]["scene_tower"]) == [
      "block_0", "block_1", "block_2", "embed", "proj"]
  jax.tree.map(np.testing.assert_array_equal, parallel.to_host(restored),
               parallel.to_host(state))
  assert jax.tree.map(lambda x: x.sharding, restored) == jax.tree.map(lambda x: x.sharding,
                                                                       target)


def test_auto_chunk_keeps_each_cores_replicas_within_its_cache_share(monkeypatch):
  _, (bucket,) = grid.expand_grid(tiny_config())
  mesh = parallel.make_mesh()
  inputs_np, _ = parallel.pad_to_multiple(bucket.stacked_inputs(), 8)
  inputs = parallel.shard_replicas(inputs_np, mesh)  # 16 replicas, 2 per device

  def auto_chunk(cache_bytes):
    monkeypatch.setattr(parallel, "cpu_cache_bytes_per_core", lambda: cache_bytes)
    logged = []
    chunk = bucket_programs.compile_bucket(bucket.spec, mesh, inputs, log=logged.append,
                                           fast_compile=True)[-1]
    return chunk, logged

  assert auto_chunk(1 << 30) == (None, [])
  assert auto_chunk(None) == (None, [])
  chunk, logged = auto_chunk(1)  # nothing fits: one replica per device at a time
  assert chunk == 8 and "cache share per core" in logged[0]


def test_an_automatically_chunked_bucket_stores_one_set_of_programs(monkeypatch):
  # One process may load one stored set of a bucket's programs (on XLA:CPU a second set loaded
  # beside it fails when it runs), so only the unchunked set, built to measure, goes through
  # the store.
  _, (bucket,) = grid.expand_grid(tiny_config())
  mesh = parallel.make_mesh()
  inputs_np, _ = parallel.pad_to_multiple(bucket.stacked_inputs(), 24)
  inputs = parallel.shard_replicas(inputs_np, mesh)  # 24 replicas, 3 per device
  monkeypatch.setattr(parallel, "cpu_cache_bytes_per_core", lambda: 1)
  stored = []

  def load_or_build(key, devices, build, log=None):
    del devices, log
    stored.append(key)
    return build()

  monkeypatch.setattr(program_store, "load_or_build", load_or_build)
  chunk = bucket_programs.compile_bucket(bucket.spec, mesh, inputs, fast_compile=True)[-1]
  assert chunk == 8 and len(stored) == 1


@pytest.mark.parametrize("metric", ["accuracy", "binding"])
def test_sweep_results_feed_the_report(reference, tmp_path, metric):
  """The sweep's own results.jsonl -> `bindjax report`: figure, ρ* table, binding figures."""
  from bindjax.commands import main as cli
  workdir, _, rows = reference
  evals = [r for r in rows if r["kind"] == "eval"]
  assert evals
  for prefix in ("heldout", "train"):
    assert all(0.0 <= r[f"{prefix}/binding"] <= 1.0 for r in evals)
    assert all(r[f"{prefix}/binding_scenes"] >= 0 for r in evals)
  out = str(tmp_path / "report")
  assert cli.main(["report", f"--workdir={workdir}", f"--out={out}", "--step=final",
                   "--draws=20", f"--metric={metric}"]) == 0
  assert os.path.getsize(os.path.join(out, "phase_transition.png")) > 0
  summary = json.load(open(os.path.join(out, "critical_coverage.json")))
  assert summary["metric"] == {"accuracy": "heldout/object_accuracy_{K}obj",
                               "binding": "heldout/binding"}[metric]
  assert summary["metric"].replace("{K}", "2") in open(
      os.path.join(out, "critical_coverage.md")).read()
  points = [p for s in json.load(open(os.path.join(out, "points.json"))) for p in s["points"]]
  assert {p["coverage"] for p in points} == {0.5, 0.8}
  for p in points:
    # The final rows of the healthy replicas: their binding figures, per seed.
    healthy = len(p["seeds"]) - p["diverged"]
    assert len([v for v in p["heldout/binding"]["values"] if v is not None]) == healthy
    assert healthy == 0 or p["train/binding"]["mean"] is not None


def test_a_workdir_in_memory_round_trips_through_epath(reference, memory_fs, tmp_path, monkeypatch):
  """The tiny sweep with its workdir on a non-local (in-memory) file system: the same rows bit
  for bit, then a rerun, a rebuild of a damaged results.jsonl, a resume and a report, all read
  back through epath.

  Checkpoints are the exception: orbax writes gs:// arrays through tensorstore's own GCS driver
  and asks Google Cloud Storage about the bucket, neither of which sees an fsspec file system, so
  they go to a local folder here (layout.Workdir.bucket_dir redirected).
  """
  from etils import epath
  from bindjax.reporting import report
  local = tmp_path / "checkpoints"
  monkeypatch.setattr(layout.Workdir, "bucket_dir",
                      lambda self, bucket, members=None: local / f"bucket_{bucket:03d}")
  workdir = epath.Path(memory_fs) / "sweep"
  _, done, rows = reference
  messages = []

  def run():
    messages.clear()
    return sweep.run_sweep(tiny_config(), workdir, progress=False, log=messages.append)

  assert run()["results_sha256"] == done["results_sha256"]
  assert files.read_jsonl(workdir / layout.RESULTS_FILE) == rows
  assert sorted(p.name for p in workdir.iterdir()) == sorted(
      [files.OUTPUTS_FILE, layout.CONFIG_FILE, layout.REPLICAS_FILE, layout.RESULTS_FILE,
       layout.SUMMARY_FILE, layout.DONE_FILE])   # no lock left behind, checkpoints local
  assert run() == files.read_json(workdir / layout.DONE_FILE)
  assert "nothing to do" in messages[-1]

  (workdir / layout.RESULTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows[:-3]))
  run()
  assert any("rebuilt it from the checkpoints" in m for m in messages)
  assert files.read_jsonl(workdir / layout.RESULTS_FILE) == rows

  (workdir / layout.DONE_FILE).unlink()   # as if killed after its last checkpoint
  (workdir / layout.RESULTS_FILE).unlink()
  assert run()["results_sha256"] == done["results_sha256"]
  assert any("resuming at" in m for m in messages)
  assert files.read_jsonl(workdir / layout.RESULTS_FILE) == rows

  summary = report.make_report(str(workdir), num_draws=20, formats=("png",))
  out = workdir / layout.REPORT_DIR
  assert summary["workdirs"] == [str(workdir)] and summary["finished"]
  assert files.read_json(out / "critical_coverage.json")["critical_coverage"] == files.to_jsonable(
      summary["critical_coverage"])
  assert (out / "phase_transition.png").read_bytes().startswith(b"\x89PNG")
