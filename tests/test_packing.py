"""Packing buckets onto lanes: the planner's slot use, and packed sweeps against sweeps in turn."""
import json
import os
import shutil
import sys

import jax
import numpy as np
import pytest

from bindjax.base import errors
from bindjax.base import files
from bindjax.commands import flags
from bindjax.training import grid
from bindjax.training import packing
from bindjax.training import sweep
from bindjax.training import train
from bindjax.workdir import layout
from bindjax.workdir import results

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_sweep  # pylint: disable=wrong-import-position

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sizes_and_costs(config):
  _, buckets = grid.expand_grid(config)
  return ([len(b.replicas) for b in buckets],
          [train.train_step_flops(b.spec) * b.spec.num_steps for b in buckets])


def _check_plan(plan, sizes, device_processes):
  """Every replica in exactly one part; lanes of equal size on disjoint devices, each holding an
  equal share of every process's devices."""
  covered = sorted((p.bucket, i) for p in plan.parts for i in range(p.start, p.stop))
  assert covered == [(b, i) for b, n in enumerate(sizes) for i in range(n)]
  devices = [d for lane in plan.lanes for d in lane.devices]
  assert len(devices) == len(set(devices))
  assert len({len(lane.devices) for lane in plan.lanes}) == 1
  processes = sorted(set(device_processes))
  for lane in plan.lanes:
    shares = [sum(device_processes[d] == p for d in lane.devices) for p in processes]
    assert len(set(shares)) == 1, shares
    assert len(lane.devices) % plan.num_data == 0


# (devices, processes, devices per replica): a host of 8 accelerators, and pods of 4-chip hosts.
PAPER_LAYOUTS = [(8, 1, 1), (64, 16, 8), (256, 64, 32)]


@pytest.mark.parametrize("num_devices,num_processes,num_data", PAPER_LAYOUTS)
def test_the_paper_grid_keeps_nine_in_ten_replica_slots_busy(num_devices, num_processes,
                                                            num_data):
  """3 buckets of 27 replicas: in turn they fill 84% of the slots; packed at least 90%."""
  config = flags.load_config(os.path.join(REPO, "experiments", "coverage_sweep.py") + ":paper")
  sizes, costs = _sizes_and_costs(config)
  assert sizes == [27, 27, 27]
  processes = [d // (num_devices // num_processes) for d in range(num_devices)]
  turn = packing.in_turn(sizes, costs, num_devices, num_data, num_processes)
  plan = packing.choose(sizes, costs, num_devices, num_data, processes)
  assert turn.slot_use == pytest.approx(0.844, abs=0.001)
  assert plan.slot_use >= 0.9
  assert len(plan.lanes) > 1
  _check_plan(plan, sizes, processes)


def test_slot_use_is_work_over_devices_times_makespan():
  """Two buckets of 3 replicas on 4 single-device lanes at equal cost: 6 replicas take 2 rounds
  on 3 lanes, so 6 of 8 device-rounds are busy; in turn, each bucket pads to 4 slots."""
  plan = packing.packed([3, 3], [1.0, 1.0], 4)
  assert plan.makespan == 2.0 and plan.slot_use == 0.75
  assert packing.in_turn([3, 3], [1.0, 1.0], 4).slot_use == 0.75
  # The tie goes to the buckets in turn: fewer parts, fewer programs to compile.
  assert packing.choose([3, 3], [1.0, 1.0], 4).lanes == packing.in_turn(
      [3, 3], [1.0, 1.0], 4).lanes


def test_a_bucket_is_split_where_whole_buckets_would_leave_a_lane_idle():
  plan = packing.packed([3, 3, 3], [1.0, 1.0, 1.0], 2)
  assert [[(p.bucket, p.start, p.stop) for p in lane.parts] for lane in plan.lanes] == [
      [(0, 0, 3), (1, 0, 2)], [(1, 2, 3), (2, 0, 3)]]
  assert plan.slot_use == 0.9


def test_unequal_processes_are_not_packed():
  plan = packing.packed([27, 27], [1.0, 1.0], 6, device_processes=[0, 0, 0, 0, 1, 1])
  assert len(plan.lanes) == 1


def test_a_bad_packing_setting_is_named():
  c = test_sweep.tiny_config()
  c.sweep.packing = "tight"
  with pytest.raises(errors.ConfigError, match="config.sweep.packing='tight'"):
    sweep.run_sweep(c, "/nonexistent/never_written", progress=False)


def _three_buckets(packing_setting="auto"):
  """tiny_config's model at |O| = 9, 16 and 25, 3 seeds each: 3 buckets of 3 replicas, which
  on 2 devices pack as bucket 0 and 2 replicas of bucket 1 on one, the rest on the other."""
  c = test_sweep.tiny_config()
  c.grid.spaces = ((2, 3), (2, 4), (2, 5))
  c.grid.learning_rates = (test_sweep.HEALTHY_LR,)
  c.grid.coverages = (0.8,)
  c.sweep.packing = packing_setting
  return c


@pytest.fixture(scope="module")
def in_turn_and_packed(tmp_path_factory):
  out = {}
  for setting in ("none", "auto"):
    workdir = str(tmp_path_factory.mktemp(setting) / "run")
    messages = []
    sweep.run_sweep(_three_buckets(setting), workdir, progress=False, log=messages.append,
                    devices=jax.devices()[:2])
    out[setting] = (workdir, files.read_jsonl(os.path.join(workdir, layout.RESULTS_FILE)),
                    messages)
  return out


def test_a_packed_sweep_gives_the_rows_of_the_sweep_in_turn(in_turn_and_packed):
  (_, turn_rows, turn_log), (workdir, rows, log) = (in_turn_and_packed["none"],
                                                    in_turn_and_packed["auto"])
  assert "1 lane of 2 devices (1 per replica), 3 parts, 75% of replica slots busy" in turn_log[0]
  assert "2 lanes of 1 device (1 per replica), 4 parts, 98% of replica slots busy" in log[0]
  assert sorted(os.listdir(os.path.join(workdir, layout.CHECKPOINT_DIR))) == [
      "bucket_000", "bucket_001_replicas_000_to_001", "bucket_001_replicas_002_to_002",
      "bucket_002"]
  assert "bucket 1 (replicas 2-2): 1 replicas (padded to 1), |O| = 16, d_model 16" in " ".join(log)
  # A replica's program differs in how many replicas it runs beside, so floats may differ in
  # their last bits; the rows' order, steps and kinds may not.
  test_sweep.assert_rows_close(rows, turn_rows)
  done = files.read_json(os.path.join(workdir, layout.DONE_FILE))
  assert done["results_sha256"] == results.rows_digest(rows)


def test_a_packed_sweep_resumes_each_part_from_its_checkpoints(in_turn_and_packed, tmp_path):
  source, rows, _ = in_turn_and_packed["auto"]
  workdir = str(tmp_path / "resumed")
  shutil.copytree(source, workdir)
  os.remove(os.path.join(workdir, layout.DONE_FILE))
  for part in ("bucket_001_replicas_000_to_001", "bucket_002"):
    shutil.rmtree(os.path.join(workdir, layout.CHECKPOINT_DIR, part, str(test_sweep.NUM_STEPS)))
  with open(os.path.join(workdir, layout.RESULTS_FILE), "w") as f:
    f.write("")
  messages = []
  sweep.run_sweep(_three_buckets(), workdir, progress=False, log=messages.append,
                  devices=jax.devices()[:2])
  assert "bucket 1 (replicas 0-1): resumed from the checkpoint at step 4" in messages
  assert "bucket 2: resumed from the checkpoint at step 4" in messages
  assert files.read_jsonl(os.path.join(workdir, layout.RESULTS_FILE)) == rows


def test_a_packed_workdir_on_other_devices_is_refused_by_its_checkpoints(in_turn_and_packed,
                                                                         tmp_path):
  workdir = str(tmp_path / "moved")
  shutil.copytree(in_turn_and_packed["auto"][0], workdir)
  os.remove(os.path.join(workdir, layout.DONE_FILE))
  with pytest.raises(errors.ConfigError, match="checkpoints of a run laid out on other devices"):
    sweep.run_sweep(_three_buckets(), workdir, progress=False, devices=jax.devices()[:1])


def test_a_workdir_from_before_packing_resumes_its_whole_buckets(in_turn_and_packed, tmp_path):
  """A config saved without sweep.packing ran its buckets in turn: it resumes so, by default."""
  source, rows, _ = in_turn_and_packed["none"]
  workdir = str(tmp_path / "old")
  shutil.copytree(source, workdir)
  os.remove(os.path.join(workdir, layout.DONE_FILE))
  shutil.rmtree(os.path.join(workdir, layout.CHECKPOINT_DIR, "bucket_002",
                             str(test_sweep.NUM_STEPS)))
  path = os.path.join(workdir, layout.CONFIG_FILE)
  saved = files.read_json(path)
  del saved["sweep"]["packing"]
  with open(path, "w") as f:
    json.dump(saved, f, sort_keys=True)
  messages = []
  sweep.run_sweep(_three_buckets(), workdir, progress=False, log=messages.append,
                  devices=jax.devices()[:2])
  assert "1 lane of 2 devices" in messages[0]
  assert "bucket 2: resumed from the checkpoint at step 4" in messages
  assert files.read_jsonl(os.path.join(workdir, layout.RESULTS_FILE)) == rows


def test_extract_reads_a_replica_from_the_part_that_trained_it(in_turn_and_packed):
  """Bucket 1 trained as parts [0, 2) and [2, 3): each replica, and the bucket whole, read from
  the packed workdir as from the sweep in turn."""
  from bindjax.frozen import extract  # pylint: disable=g-import-not-at-top
  turn, packed = in_turn_and_packed["none"][0], in_turn_and_packed["auto"][0]
  for replica in (3, 4, 5):
    a = extract.load_workdir(packed, replica=replica)
    b = extract.load_workdir(turn, replica=replica)
    assert a.step == b.step
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
      np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
  whole = extract.load_bucket(packed, 1)
  assert [r.index for r in whole.replicas] == [3, 4, 5]
  for i, replica in enumerate((3, 4, 5)):
    one = extract.load_workdir(packed, replica=replica)
    for x, y in zip(jax.tree.leaves(whole.trained(i).params), jax.tree.leaves(one.params)):
      np.testing.assert_array_equal(x, y)


def _two_spaces():
  """tiny_config's model at |O| = 9 and 16, one replica each: on 2 processes × 2 devices, in
  turn one device in four trains; packed, two lanes (one device of each process)."""
  c = _three_buckets()
  c.grid.spaces = ((2, 3), (2, 4))
  c.grid.seeds = (0,)
  return c


def get_config(arg=None):
  """Lets subprocesses use this file as --config."""
  del arg
  return _two_spaces()


def _seed_0_of(rows, space_sizes):
  """The rows of seed 0 at `space_sizes`, each replica numbered by its place there: a replica's
  rows depend on its seed and space, not on the grid around it (its key comes from its seed)."""
  kept = [r for r in rows if r["seed"] == 0 and r["space_size"] in space_sizes]
  kept.sort(key=lambda r: (r["space_size"], r["step"], r["kind"]))
  return [dict(r, replica=space_sizes.index(r["space_size"]),
               bucket=space_sizes.index(r["space_size"])) for r in kept]


@pytest.mark.slow
def test_two_processes_run_lanes_that_span_both(tmp_path, in_turn_and_packed):
  """Both processes issue every lane's programs in the same order; each replica's rows as the
  sweep in turn on one process gave them."""
  workdir = str(tmp_path / "two")
  codes, outputs = test_sweep.run_two_processes(os.path.abspath(__file__), workdir, timeout=600)
  assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
  assert "2 lanes of 2 devices (1 per replica), 2 parts," in outputs[0]
  rows = files.read_jsonl(os.path.join(workdir, layout.RESULTS_FILE))
  got = _seed_0_of(rows, [9, 16])
  assert len(got) == len(rows) > 0
  test_sweep.assert_rows_close(got, _seed_0_of(in_turn_and_packed["none"][1], [9, 16]))
