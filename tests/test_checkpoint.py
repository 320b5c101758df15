"""bindjax.workdir.checkpoint (orbax) and exact resume of `bindjax train` after SIGKILL."""
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts

from bindjax.frozen import extract
from bindjax.training import train
from bindjax.workdir import checkpoint
from bindjax.workdir import layout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_sweep  # pylint: disable=wrong-import-position

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state(value):
  params = {"w": jnp.full((2, 3), value, jnp.float32), "tau": jnp.float32(value)}
  tx = optax.adamw(1e-3)
  opt_state = tx.init(params)
  grads = jax.tree.map(jnp.ones_like, params)
  _, opt_state = tx.update(grads, opt_state, params)
  return train.TrainState(step=jnp.int32(value), params=params, opt_state=opt_state,
                          key=jax.random.key_data(jax.random.key(int(value))))


def test_latest_keep_last_n_and_abstract_restore(tmp_path):
  with checkpoint.Checkpoints(tmp_path / "ckpt", keep=2) as ckpt:
    assert ckpt.restore(_state(0)) is None
    for step in (1, 2, 3):
      ckpt.save(step, _state(step), {"step": step, "note": "x"})
    ckpt.wait()
    assert ckpt.all_steps() == [2, 3]
  with checkpoint.Checkpoints(tmp_path / "ckpt", keep=2) as ckpt:   # reopened
    step, state, meta = ckpt.restore(checkpoint.abstract_target(_state(0)))
    assert step == 3 and meta == {"step": 3, "note": "x"}
    expected = _state(3)
    assert jax.tree.structure(state) == jax.tree.structure(expected)   # optax types come back
    assert isinstance(state.opt_state[0], optax.ScaleByAdamState)
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(expected)):
      np.testing.assert_array_equal(a, b)
    step, state, _ = ckpt.restore(_state(0), step=2)
    assert step == 2 and float(state.params["tau"]) == 2.0
    with pytest.raises(ValueError, match="no checkpoint at step 1"):
      ckpt.restore(_state(0), step=1)


def test_metadata_and_prune_after(tmp_path):
  with checkpoint.Checkpoints(tmp_path, keep=3) as ckpt:
    assert ckpt.metadata() is None
    for step in (2, 4, 6):
      ckpt.save(step, _state(step), {"step": step})
    ckpt.wait()
    assert ckpt.metadata() == {"step": 6} and ckpt.metadata(4) == {"step": 4}
    ckpt.prune_after(5)
    assert ckpt.all_steps() == [2, 4] and ckpt.latest_step() == 4
    ckpt.prune_after(None)
    assert ckpt.all_steps() == [] and ckpt.restore(_state(0)) is None
  with pytest.raises(ValueError, match="keep=0"):
    checkpoint.Checkpoints(tmp_path / "x", keep=0)


def _data_files(directory, step):
  return [os.path.join(root, name) for root, _, names in os.walk(os.path.join(directory, str(step)))
          for name in names if os.sep + "d" + os.sep in os.path.join(root, name)]


def test_checksums_catch_any_flipped_bit_and_a_restore_refuses(tmp_path):
  state = _state(3)
  sums = checkpoint.tree_checksums(state)
  assert sums == checkpoint.tree_checksums(jax.tree.map(np.asarray, state))
  for path, leaf in (("w", state.params["w"]), ("tau", state.params["tau"])):
    bits = np.asarray(leaf).view(np.uint32).copy()
    bits.reshape(-1)[0] ^= 1 << 17
    changed = checkpoint.tree_checksums(dict(state.params, **{path: bits.view(np.float32)}))
    assert changed[f"['{path}']"] != checkpoint.tree_checksums(state.params)[f"['{path}']"]
  swapped = np.asarray(state.params["w"]).copy()
  swapped.reshape(-1)[[0, 1]] = [1.0, 2.0]
  other = swapped.copy()
  other.reshape(-1)[[0, 1]] = [2.0, 1.0]
  assert checkpoint.tree_checksums(swapped) != checkpoint.tree_checksums(other)
  directory = tmp_path / "ckpt"
  with checkpoint.Checkpoints(directory, keep=2) as ckpt:
    for step in (1, 2):
      ckpt.save(step, _state(step), {"step": step})
  for data in _data_files(directory, 2):
    raw = bytearray(open(data, "rb").read())
    raw[len(raw) // 2] ^= 0x10
    open(data, "wb").write(bytes(raw))
  messages = []
  with checkpoint.Checkpoints(directory, keep=2) as ckpt:
    with pytest.raises(checkpoint.CorruptCheckpointError, match=f"checkpoint {directory}/2"):
      ckpt.restore(_state(0))
    step, state, meta = ckpt.restore_verified(_state(0), log=messages.append)
    assert step == 1 and meta == {"step": 1} and float(state.params["tau"]) == 1.0
    assert len(messages) == 1 and messages[0].endswith("falling back to the previous checkpoint")
  (directory / "1" / "metadata" / "metadata").write_text("")
  with checkpoint.Checkpoints(directory, keep=2) as ckpt:
    with pytest.raises(checkpoint.CorruptCheckpointError, match=r"no checkpoint of .* verifies "
                                                                r"\(damaged: steps 1, 2\)"):
      ckpt.restore_verified(_state(0), log=messages.append)


# ------------------------------------------------------------------------------------------------
# One row at a time. The files are changed through tensorstore's own specs (not bindjax's), as a
# damaged or partly deleted checkpoint would read.


def ocdbt_store(state_dir):
  """The OCDBT key-value store orbax writes a checkpoint's arrays into."""
  return ts.KvStore.open({"driver": "ocdbt", "base": f"file://{state_dir}/"}).result()


def delete_chunks(state_dir, doomed):
  """Deletes every stored chunk for which doomed(array name, chunk index) holds; their number."""
  store = ocdbt_store(state_dir)
  count = 0
  for key in store.list().result():
    name, _, chunk = key.decode().rpartition("/")
    if not chunk.startswith(".") and doomed(name, tuple(int(i) for i in chunk.split("."))):
      store.write(key, None).result()
      count += 1
  return count


def flip_bit(state_dir, name, row):
  """Flips one bit of row `row` of the stored array `name`."""
  array = ts.open({"driver": "zarr", "kvstore": {"driver": "ocdbt", "base": f"file://{state_dir}/",
                                                 "path": f"{name}/"}}).result()
  values = np.array(array[row].read().result())
  values.reshape(-1).view(np.uint8)[0] ^= 0x04
  array[row].write(values).result()


def _chunks(state_dir, wanted):
  return [tuple(int(i) for i in key.decode().rpartition("/")[2].split("."))
          for key in ocdbt_store(state_dir).list().result()
          if not key.decode().endswith("/.zarray") and wanted(key.decode())]


def _stacked_state(rows=3):
  """A TrainState of `rows` replicas stacked on axis 0, each row different, dtypes mixed."""
  states = [_state(r + 1) for r in range(rows)]
  state = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  return {"train": state, "alive": jnp.array([True, False, True][:rows]),
          "scale": jnp.arange(rows * 4, dtype=jnp.bfloat16).reshape(rows, 2, 2)}


def _only_params(tree):
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x if jax.tree_util.keystr(path).startswith("['train'].params")
      else checkpoint.SKIP, tree)


def test_row_checksums_are_the_checksums_of_each_row():
  state = _stacked_state()
  rows = checkpoint.row_checksums(state)
  assert set(rows) == set(checkpoint.tree_checksums(state))   # every leaf has a leading axis
  for r in range(3):
    row = jax.tree.map(lambda x, r=r: x[r], state)
    assert {path: pairs[r] for path, pairs in rows.items()} == checkpoint.tree_checksums(row)
  # A scalar has no rows; a SKIP leaf has no checksum at all.
  assert checkpoint.row_checksums({"s": jnp.float32(1)}) == {}
  assert checkpoint.tree_checksums({"s": checkpoint.SKIP, "t": jnp.zeros(2)}).keys() == {"['t']"}


def test_restore_row_reads_one_verified_row_and_skipped_arrays_not_at_all(tmp_path):
  state = _stacked_state()
  with checkpoint.Checkpoints(tmp_path / "ckpt") as ckpt:
    ckpt.save(5, state, {"step": 5})
  state_dir = tmp_path / "ckpt" / "5" / "state"
  # Every array is stored in chunks of one row.
  assert all(chunk[0] < 3 and not any(chunk[1:])
             for chunk in _chunks(state_dir, lambda name: True))
  target = checkpoint.abstract_target(state)
  with checkpoint.Checkpoints(tmp_path / "ckpt") as ckpt:
    for r in range(3):
      step, rows, meta = ckpt.restore_row(target, r)
      assert step == 5 and meta == {"step": 5}
      jax.tree.map(lambda got, x, r=r: np.testing.assert_array_equal(got, np.asarray(x[r])),
                   rows, state)
    _, rows, _ = ckpt.restore_row(_only_params(target), 1)
    assert rows["train"].step is checkpoint.SKIP and rows["alive"] is checkpoint.SKIP
    with pytest.raises(ValueError, match=r"row 3 of array \['alive'\] of shape \[3\] does not"):
      ckpt.restore_row(target, 3)
    with pytest.raises(ValueError, match=r"array \['alive'\] expected as int32\[3\]; it holds "
                                         r"bool\[3\]"):
      ckpt.restore_row(dict(target, alive=jax.ShapeDtypeStruct((3,), jnp.int32)), 0)
  # Without the optimiser state and without rows 0 and 2: row 1 of the parameters still reads,
  # and a restore of the parameters alone as well as of the whole state refuse.
  assert delete_chunks(state_dir, lambda name, chunk: not name.startswith("train.params")
                       or chunk[0] != 1) > 0
  with checkpoint.Checkpoints(tmp_path / "ckpt") as ckpt:
    _, rows, _ = ckpt.restore_row(_only_params(target), 1)
    np.testing.assert_array_equal(rows["train"].params["w"], state["train"].params["w"][1])
    for whole in (target, _only_params(target)):
      with pytest.raises(checkpoint.CorruptCheckpointError, match="cannot be read"):
        ckpt.restore(whole)
    with pytest.raises(checkpoint.CorruptCheckpointError,
                       match=r"checkpoint .*/5: array \['train'\].params\['\w+'\] cannot be read"):
      ckpt.restore_row(_only_params(target), 0)
  # A flipped bit in the row read is caught by its own checksum.
  flip_bit(state_dir, "train.params.w", 1)
  with checkpoint.Checkpoints(tmp_path / "ckpt") as ckpt:
    with pytest.raises(checkpoint.CorruptCheckpointError,
                       match=r"^checkpoint .*/5: row 1 of array \['train'\].params\['w'\] does "
                             r"not match the checksum recorded when it was saved "
                             r"\(corrupt data\)$"):
      ckpt.restore_row(_only_params(target), 1)


def save_without_row_checksums(directory, step, state, metadata):
  """A checkpoint as saves wrote them before row checksums: whole-array chunks, and the array
  and metadata checksums alone."""
  # The metadata digest is the one a current save records: it covers the metadata alone.
  current = f"{directory}_current"
  with checkpoint.Checkpoints(current, async_save=False) as ckpt:
    ckpt.save(step, state, metadata)
  manager = ocp.CheckpointManager(current, item_names=("metadata",))
  recorded = manager.restore(step, args=ocp.args.Composite(
      metadata=ocp.args.JsonRestore()))["metadata"][checkpoint.CHECKSUM_KEY]
  manager.close()
  shutil.rmtree(current)
  metadata = dict(metadata)
  metadata[checkpoint.CHECKSUM_KEY] = {"arrays": checkpoint.tree_checksums(state),
                                       "metadata": recorded["metadata"]}
  manager = ocp.CheckpointManager(directory, item_names=("state", "metadata"))
  manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                             metadata=ocp.args.JsonSave(metadata)))
  manager.wait_until_finished()
  manager.close()


def test_checkpoints_without_row_checksums_restore_whole_and_verified(tmp_path):
  state = _stacked_state()
  save_without_row_checksums(tmp_path / "old", 4, state, {"step": 4})
  target = checkpoint.abstract_target(state)
  with checkpoint.Checkpoints(tmp_path / "old") as ckpt:
    assert ckpt.restore_row(target, 0) is None
    step, restored, meta = ckpt.restore(_only_params(target))
    assert step == 4 and meta == {"step": 4} and restored["alive"] is checkpoint.SKIP
    np.testing.assert_array_equal(restored["train"].params["w"], state["train"].params["w"])
  flip_bit(tmp_path / "old" / "4" / "state", "train.params.w", 2)
  with checkpoint.Checkpoints(tmp_path / "old") as ckpt:
    with pytest.raises(checkpoint.CorruptCheckpointError,
                       match=r"array \['train'\].params\['w'\] does not match the checksum"):
      ckpt.restore(_only_params(target))


def test_the_orbax_names_the_row_read_builds_on_are_there():
  """`Checkpoints.restore_row` opens each array with the tensorstore spec and context orbax's
  own restore uses, through these public names of orbax.checkpoint.type_handlers, which that
  module lists among its deprecated functions. If a new orbax drops or moves one, this fails
  first, naming it."""
  for name in ("get_json_tspec_read", "get_ts_context", "ParamInfo", "is_ocdbt_checkpoint"):
    assert hasattr(ocp.type_handlers, name), f"orbax.checkpoint.type_handlers.{name} is gone"
  assert ocp.PLACEHOLDER is checkpoint.SKIP and hasattr(ocp, "PyTreeCheckpointer")


def _train_command(workdir, num_steps):
  return [sys.executable, "-m", "bindjax.commands.main", "train",
          f"--config={os.path.join(REPO, 'experiments', 'train.py')}:smoke",
          f"--workdir={workdir}", f"--config.num_steps={num_steps}",
          "--config.checkpoint.every=20", "--config.eval.every=20", "--config.log_every=10",
          "--progress=false"]


def _env(cache_dir):
  env = dict(os.environ)
  # Share compiled programs between the three processes (same programs, same numbers).
  env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
             PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""))
  return env


def _rows(workdir):
  return layout.Workdir(workdir).read_rows()


def _finalized_steps(workdir):
  directory = layout.Workdir(workdir).bucket_dir(0)
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def test_sigkill_and_resume_gives_identical_metrics(tmp_path):
  # Checkpoints (and evaluations) at steps 20, 40, 60: the kill lands after the first one, so
  # the resumed run replays at least 40 steps, two evaluations and the final one.
  num_steps = 60
  env = _env(tmp_path / "jax_cache")
  reference, killed = tmp_path / "reference", tmp_path / "killed"
  done = subprocess.run(_train_command(reference, num_steps), env=env, capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]

  process = subprocess.Popen(_train_command(killed, num_steps), env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.time() + 300
  while not _finalized_steps(killed) and process.poll() is None and time.time() < deadline:
    time.sleep(0.02)
  still_running = process.poll() is None
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert still_running, "the run finished before a checkpoint appeared: make it longer"
  rows_at_kill = _rows(killed)
  assert not rows_at_kill or rows_at_kill[-1]["step"] < num_steps

  resumed = subprocess.run(_train_command(killed, num_steps), env=env, capture_output=True,
                           text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resumed from the checkpoint at step" in resumed.stdout + resumed.stderr

  expected, got = _rows(reference), _rows(killed)
  assert [r["step"] for r in got] == [r["step"] for r in expected]
  assert got == expected          # bit-identical metrics, final evaluation included
  assert json.loads(resumed.stdout.strip().splitlines()[-1]) == json.loads(
      done.stdout.strip().splitlines()[-1])
  assert _finalized_steps(killed) == _finalized_steps(reference)
  # The best parameters ride in the state: the resumed run kept the same ones.
  for which in ("best", "latest"):
    a, b = (extract.load_workdir(w, which) for w in (reference, killed))
    assert a.step == b.step
    jax.tree.map(np.testing.assert_array_equal, a.params, b.params)


def test_two_processes_save_the_same_steps_in_two_directories(tmp_path):
  """Two processes joined by jax.distributed, each saving steps 1-6 into two checkpoint
  directories in turn, asynchronously (as a packed sweep's buckets on lanes that span both):
  every save of both completes, with no barrier of one directory's saves met by the other's."""
  script = tmp_path / "save_twice.py"
  script.write_text(textwrap.dedent("""
      import os, sys
      import jax, numpy as np
      process, port, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
      jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
      from bindjax.workdir import checkpoint
      mesh = jax.sharding.Mesh(np.array(jax.devices()), ("r",))
      sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("r"))
      x = jax.make_array_from_callback((4, 3), sharding,
                                       lambda index: np.ones((4, 3), np.float32)[index])
      both = [checkpoint.Checkpoints(os.path.join(root, name), keep=2) for name in "ab"]
      for step in range(1, 7):
        for checkpoints in both:
          checkpoints.save(step, {"x": x})
      for checkpoints in both:
        checkpoints.close()
      print("saved", [c.all_steps() for c in both])
      """))
  port = test_sweep.free_port()
  procs = [subprocess.Popen([sys.executable, str(script), str(i), str(port), str(tmp_path / "ck")],
                            env=test_sweep.env_with_devices(2), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  try:
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  assert [p.returncode for p in procs] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
  assert all("saved [[5, 6], [5, 6]]" in out for out in outputs), outputs
