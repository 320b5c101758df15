"""`bindjax binding`: every replica of a sweep fitted by the complexity engine on its own split.

Semantics: docs/binding.md. The rows must equal `bindjax extract --replica=N` followed by
`bindjax complexity` with the set's own coverage split, fit for fit.
"""
import dataclasses
import json
import os
import shutil
import sys

import jax
import numpy as np
import pytest

from bindjax.base import files
from bindjax.commands import flags
from bindjax.commands import main as cli
from bindjax.complexity import data as data_lib
from bindjax.complexity import families
from bindjax.complexity import fit_settings
from bindjax.complexity import grid_fits
from bindjax.complexity import replicas
from bindjax.frozen import embeddings
from bindjax.frozen.probes import linear
from bindjax.runtime import engine
from bindjax.runtime import parallel
from bindjax.workdir import layout
from bindjax.workdir import results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINDING = os.path.join(REPO, "experiments", "binding.py")
# One bucket of the smoke preset's model: |O| = 16, coverages 0.5 and 0.75, 2 seeds, 4 steps.
SWEEP = [f"--config={REPO}/experiments/coverage_sweep.py:smoke", "--config.grid.spaces=((2,4),)",
         "--config.grid.coverages=0.5,0.75", "--config.num_steps=4", "--config.eval.every=2",
         "--config.eval.batches=1", "--config.log_every=2", "--config.checkpoint.every=2",
         "--noprogress", "--noreport"]
FAMILIES = "additive,sum_product,per_object_sum_product,mlp:16"
FIT = ["--config.fit.steps=20", "--config.fit.eval_every=10"]
COMPARED = ("final_train_loss", "best_test_r2", "best_test_object_acc",
            *[f"final_{m}_{k}" for k in ("r2", "object_acc", "concept_acc", "mse")
              for m in ("train_only", "test_only", "mixed")])


def run_cli(monkeypatch, argv):
  monkeypatch.setattr(sys, "argv", ["bindjax"] + argv)  # ml_collections reads overrides there
  return cli.main(argv)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("binding") / "sweep"
  with pytest.MonkeyPatch.context() as mp:
    assert run_cli(mp, ["sweep", *SWEEP, f"--workdir={workdir}"]) == 0
  return workdir


def binding_settings(*overrides):
  """The smoke preset's BindingConfig with FAMILIES, FIT and the `--config.FIELD=VALUE`
  overrides, read as the command reads its --config."""
  config = flags.load_config(f"{BINDING}:smoke")
  config.models = FAMILIES
  for item in FIT + list(overrides):
    key, value = item[len("--config."):].split("=")
    section, _, field = key.rpartition(".")
    target = config[section] if section else config
    target[field] = type(target[field])(value)
  return replicas.settings_from(config)


@pytest.mark.slow
def test_every_replica_and_family_equals_extract_then_complexity(sweep_dir, tmp_path,
                                                                 monkeypatch):
  # All 4 replicas of a family in one batch, vmapped 2 per device on 2 devices.
  mesh = parallel.make_mesh(devices=jax.devices()[:2])
  summary = replicas.run(binding_settings("--config.pad_ratio=inf", "--config.chunk_size=none"),
                         sweep_dir, tmp_path / "binding", "best", mesh=mesh, progress=False)
  rows = summary["rows"]
  names = ["additive", "sum_product", "per_object_sum_product", "mlp[16]"]
  assert sorted((r["replica"], r["name"]) for r in rows) == sorted(
      (i, n) for i in range(4) for n in names)
  assert all(r["status"] == "fitted" and r["checkpoint"] == "best" for r in rows)
  assert [b["num_models"] for b in summary["buckets"]] == [4] * 4
  sweep_rows = layout.Workdir(sweep_dir).read_rows()
  best = {r["replica"]: r for r in results.select_evaluations(sweep_rows)}
  for row in rows:   # the replica's own evaluation and split sit beside its fits
    assert row["step"] == best[row["replica"]]["step"]
    assert row["heldout/object_accuracy_maxobj"] == best[row["replica"]][
        "heldout/object_accuracy_2obj"]
    assert row["num_train_objects"] == best[row["replica"]]["num_train_objects"]
  csv_lines = (tmp_path / "binding" / "results.csv").read_text().splitlines()
  assert len(csv_lines) == 1 + 16 and csv_lines[0].startswith("replica,bucket,")
  json.loads((tmp_path / "binding" / "results.json").read_text())   # strict JSON
  assert {os.path.basename(f) for f in summary["figures"]} == {"binding_fits.png",
                                                               "binding_fits.pdf"}
  for replica in (1, 2):   # coverage 0.5 seed 1, coverage 0.75 seed 0
    sets = tmp_path / f"set{replica}"
    assert run_cli(monkeypatch, ["extract", f"--workdir={sweep_dir}", f"--replica={replica}",
                                 "--objects=all", f"--out={sets}"]) == 0
    out = tmp_path / f"complexity{replica}"
    assert run_cli(monkeypatch, [
        "complexity", f"--config={REPO}/experiments/complexity.py:smoke",
        f"--config.embeddings={sets}", f"--config.models={FAMILIES}", "--config.split=coverage",
        "--config.seeds=0", "--config.learning_rates=0.01", "--config.steps=20",
        "--config.eval_every=10", "--config.schedule=cosine", "--config.eval_cadence=end",
        "--noprogress", f"--workdir={out}"]) == 0
    alone = json.loads((out / "results.json").read_text())["rows"]
    assert [r["name"] for r in alone] == names
    for single in alone:
      (batched,) = [r for r in rows if r["replica"] == replica and r["name"] == single["name"]]
      assert batched["num_test_only_scenes"] == single["num_test_only_scenes"] > 0
      for key in COMPARED:
        # The coordinate solver's Levenberg–Marquardt steps, SVDs and choice among starts
        # carry float32 differences of batched and padded shapes a little further than Adam.
        np.testing.assert_allclose(batched[key], single[key], rtol=1e-3, atol=1e-4,
                                   err_msg=f"replica {replica} {single['name']} {key}")


@pytest.mark.slow
def test_a_diverged_replica_is_reported_and_not_fitted(sweep_dir, tmp_path):
  workdir = tmp_path / "sweep"
  shutil.copytree(sweep_dir, workdir)
  rows = layout.Workdir(workdir).read_rows()
  coordinates = layout.Workdir(workdir).read_replicas()[3]
  files.write_jsonl(workdir / layout.RESULTS_FILE, [r for r in rows if r["replica"] != 3 or
                                                      r["step"] < 4] + [
      dict(coordinates, kind="diverged", step=3, diverged=True, diverged_step=3)])
  settings = binding_settings("--config.models=additive,mlp:16", "--config.fit.steps=10",
                              "--config.fit.eval_every=10", "--config.save_embeddings=True")
  summary = replicas.run(settings, workdir, tmp_path / "out", "final", progress=False)
  out = summary["rows"]
  diverged = [r for r in out if r["replica"] == 3]
  assert [r["name"] for r in diverged] == ["additive", "mlp[16]"]
  assert all(r["status"] == "diverged" and r["diverged_step"] == 3 and r["step"] == 2
             and r["final_test_only_r2"] is None for r in diverged)
  assert all(r["status"] == "fitted" for r in out if r["replica"] != 3) and len(out) == 8
  assert sum(b["num_models"] for b in summary["buckets"]) == 3 * 2
  assert summary["replicas"] == {"fitted": 3, "diverged": 1, "not_evaluated": 0}
  assert all(c["test_only"]["num_points"] == 3 for c in summary["correlations"])
  saved = sorted(os.listdir(tmp_path / "out" / replicas.EMBEDDINGS_DIR))
  assert saved == ["replica_0000", "replica_0001", "replica_0002"]
  es = embeddings.read_embeddings(tmp_path / "out" / replicas.EMBEDDINGS_DIR / saved[1])
  assert es.num_scenes == 16 * 16 and es.provenance["replica"] == 1
  assert es.provenance["checkpoint"] == "latest" and es.provenance["step"] == 4


def test_fits_with_own_targets_and_splits_equal_separate_fits():
  """fit_grid with `own`: each fit trains on and is scored by its own set's targets and probes
  on its own split, as if each set were fitted alone (vmapped and sharded vs one at a time)."""
  objects, ids = data_lib.all_scenes((3, 3), 2)
  rng = np.random.default_rng(0)
  targets = rng.normal(size=(3, 81, 4)).astype(np.float32)
  probes = [linear.init_weights(jax.random.PRNGKey(k), (3, 3), 9, 4, linear.ProbeConfig())
            for k in range(3)]
  splits = [(rng.permutation(9), n) for n in (4, 6, 6)]
  model = families.make("sum_product", (3, 3), 2, out_dim=4, embed_dim=2)
  config = fit_settings.FitConfig(steps=20, eval_every=10, fast_compile=True)

  def data_of(t):
    return data_lib.prepare(t, objects, np.full(81, 2), (3, 3), ids, 9)[0]

  own = data_lib.own_targets(targets, jax.tree_util.tree_map(lambda *x: np.stack(x), *probes))
  entries = [grid_fits.GridEntry(model, n / 9, 0, 1e-2, split=(p, n), own_index=i)
             for i, (p, n) in enumerate(splits)]
  together, infos = grid_fits.fit_grid(entries, data_of(targets[0]), None, config,
                                       engine.auto_mesh(2, jax.devices()[:1]), None,
                                       own=own, pad_ratio=np.inf)
  assert [i["num_models"] for i in infos] == [3]
  for i, entry in enumerate(entries):
    (alone,), _ = grid_fits.fit_grid([dataclasses.replace(entry, own_index=None)],
                                     data_of(targets[i]), probes[i], config)
    assert alone["num_train_objects"] == splits[i][1]
    for key in ("final_train_loss", "best_test_r2", *[k for k in alone if k.startswith(
        "final_")]):
      np.testing.assert_allclose(together[i][key], alone[key], rtol=2e-4, atol=2e-5,
                                 err_msg=f"set {i} {key}")


def test_rank_correlation_and_its_interval():
  x = np.arange(10.0)
  c = replicas.rank_correlation(x, x ** 3, num_bootstrap=200)
  assert c["rho"] == pytest.approx(1.0) and c["interval"] == pytest.approx([1.0, 1.0])
  c = replicas.rank_correlation([1, 2, np.nan, 4], [4, 3, 0, 1], num_bootstrap=200)
  assert c["num_points"] == 3 and c["rho"] == pytest.approx(-1.0)
  assert replicas.rank_correlation([1, 2], [1, 2], num_bootstrap=200)["rho"] is None
  assert replicas.rank_correlation([1, 1, 1], [1, 2, 3], num_bootstrap=200)["rho"] is None


@pytest.mark.slow
def test_cli_errors_and_output_policy(sweep_dir, tmp_path, monkeypatch, capsys):
  def run(argv):
    monkeypatch.setattr(sys, "argv", ["bindjax"] + argv)
    with pytest.raises(SystemExit) as e:
      cli.main(argv)
    return e.value.code, capsys.readouterr().err.splitlines()

  out = tmp_path / "out"
  base = ["binding", f"--workdir={sweep_dir}", f"--config={BINDING}:smoke", f"--out={out}"]
  for argv, code, named in (
      (["binding", f"--config={BINDING}:smoke"], 2, "--workdir is required"),
      (base + ["--step=last"], 2, "--step"),
      (base + ["--config.pad_ratio=0.5"], 2, "pad_ratio=0.5"),
      (base + ["--config.fit.schedule=linear"], 2, "schedule='linear'"),
      (["binding", f"--workdir={tmp_path}", f"--config={BINDING}:smoke", f"--out={out}"], 1,
       "no config.json")):
    status, err = run(argv)
    assert status == code and len(err) == 1 and named in err[0], (argv, err)
  assert not out.exists()
  # Parameters that do not belong to the chosen evaluation: bad data, nothing written.
  stale = tmp_path / "stale"
  shutil.copytree(sweep_dir, stale)
  rows = layout.Workdir(stale).read_rows()
  files.write_jsonl(stale / layout.RESULTS_FILE, rows + [
      dict(r, step=6) for r in rows if r["kind"] == "eval" and r["step"] == 4])
  status, err = run(["binding", f"--workdir={stale}", f"--config={BINDING}:smoke",
                     f"--out={out}", "--step=final", "--noprogress"])
  assert status == 1 and len(err) == 1 and "from step 4" in err[0] and "step 6" in err[0], err
  assert not out.exists()


def test_within_coverage_correlation_removes_what_coverage_drives():
  """Two scores that both rise with coverage and are otherwise independent correlate across
  coverages and not within them; a within-coverage association survives the centring."""
  rng = np.random.default_rng(5)
  coverage = np.repeat([0.3, 0.5, 0.7, 0.9], 15)
  accuracy = coverage + 0.01 * rng.normal(size=coverage.size)
  unrelated = coverage + 0.01 * rng.normal(size=coverage.size)
  pooled = replicas.rank_correlation(unrelated, accuracy, num_bootstrap=200)["rho"]
  within = replicas.rank_correlation(replicas.centred_ranks(unrelated, coverage),
                                     replicas.centred_ranks(accuracy, coverage), 200)
  assert pooled > 0.7 and abs(within["rho"]) < 0.35, (pooled, within)
  tracking = accuracy + 0.002 * rng.normal(size=coverage.size)
  within = replicas.rank_correlation(replicas.centred_ranks(tracking, coverage),
                                     replicas.centred_ranks(accuracy, coverage), 200)
  assert within["rho"] > 0.8, within
  ranks = replicas.centred_ranks([3.0, 1.0, np.nan, 5.0], [0, 0, 1, 1])
  assert ranks[:2].tolist() == [0.5, -0.5] and np.isnan(ranks[2]) and ranks[3] == 0.0


def test_within_coverage_correlation_takes_out_the_object_space_size():
  """Sweeps of two sizes at the same coverages: a fit quality and an accuracy that both differ by
  size and are otherwise independent do not correlate within coverage."""
  rng = np.random.default_rng(6)
  rows = []
  for size, level in ((25, 0.0), (64, 1.0)):
    for coverage in (0.3, 0.5, 0.7, 0.9):
      for _ in range(8):
        rows.append({"name": "additive", "family": "additive", "status": "fitted",
                     "space_size": size, "coverage": coverage,
                     replicas.QUALITY_COLUMN: level + 0.01 * rng.normal(),
                     replicas.ACCURACY_COLUMN: level + 0.01 * rng.normal(),
                     "final_train_only_r2": 1.0})
  (table,) = replicas.correlations(rows, num_bootstrap=200)
  assert table["test_only"]["rho"] > 0.7, table
  assert abs(table["within_coverage"]["rho"]) < 0.35, table
