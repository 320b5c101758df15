"""Can a 1-layer tiny model bind? Training-object accuracy split by the kind of 2-object scene.

The tiny config (experiments/train.py:tiny at warm-up 0.1: C=2, V=4, K=2, d_model 32, 1 layer,
coverage 1) is trained (bindjax.training.train.train_step, several seeds vmapped) and then evaluated
on fresh training-object batches of 512 with every object a query. Two-object scenes are split into:

  same       both slots hold the same object          (1/16 of 2-object scenes at V=4)
  share      the objects share exactly one value      (6/16): the bag of concept tokens
             determines the objects, no binding needed
  ambiguous  the objects differ in both concepts      (9/16): {a0 a1, b0 b1} has the same bag
             of tokens as {a0 b1, b0 a1}; only binding tells them apart

and for ambiguous scenes two partial criteria: "bag" (both positives beat every negative except
the two cross objects a0 b1, b0 a1) and "bind" (both positives beat the two cross objects). A
bag-of-tokens model gets "bag" right and, with the 2 positives and 2 cross objects tied, "bind"
1/6 of the time. "qR2": how additive the unit object-query embeddings are (R² of a_{v0} + b_{v1});
at 1.0 no scene embedding can separate an ambiguous pair from its cross pair
(q_a0a1 - q_a0b1 = -(q_b0b1 - q_b0a1)).

  python experiments/studies/tiny_binding_probe.py --grid=baseline
  python experiments/studies/tiny_binding_probe.py --grid=heads --seeds=0,1,2
  python experiments/studies/tiny_binding_probe.py --grid=last --set num_steps=1000 \
      --set optimizer.warmup_fraction=0.3
  python experiments/studies/tiny_binding_probe.py --tag=long_10000 --set num_steps=10000 \
      --set optimizer.warmup_fraction=0.3 --no_fast_compile

Grids (GRIDS below) vary one setting of the base config at a time; --set applies on top of every
entry. Writes experiments/studies/results/tiny_binding/tiny_binding_probe_<tag or grid>.json
(one row per config and seed: accuracies by kind, qR2, loss curve) and prints a table. See also
tiny_binding_readout.py: the same tower with a free per-object read-out binds. Findings:
docs/findings/tiny_model_binding.md.
"""
import argparse
import ast
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from bindjax.base import files
from bindjax.commands import flags as flags_lib
from bindjax.core import models
from bindjax.core import objectives
from bindjax.core import scenes
from bindjax.runtime import xla_options
from bindjax.training import run_spec
from bindjax.training import train

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tiny_binding")
CATEGORIES = ("1obj", "2obj", "same", "share", "ambiguous")


def base_config():
  """experiments/train.py:tiny with the original warm-up of 0.1 (the preset has 0.3)."""
  c = flags_lib.load_config(os.path.join(REPO, "experiments", "train.py") + ":tiny")
  c.optimizer.warmup_fraction = 0.1
  return c


def apply_overrides(c, overrides):
  c = c.copy_and_resolve_references()
  c.update_from_flattened_dict(overrides)
  return c


# Grids: lists of override dicts (applied on top of base_config()).
GRIDS = {
    "baseline": [{}],
    "heads": [{"model.num_heads": h} for h in (1, 2, 4, 8)],
    "lr": [{"optimizer.learning_rate": lr} for lr in (3e-3, 1e-2, 2e-2, 3e-2)],
    "batch": [{"sampler.batch_size": b} for b in (32, 128, 256)],
    "similarity": [{"model.similarity": "dot"}, {"model.tau_init": 2.3},
                   {"model.train_logit_cap": 30.0, "model.tau_init": 2.3}],
    "variant": [{"model.variant": "clip"}],
    "dff": [{"model.d_ff": f} for f in (64, 256, 512)],
    "wd": [{"optimizer.weight_decay": w} for w in (0.0, 0.01)],
    "warmup": [{"optimizer.warmup_fraction": w} for w in (0.0, 0.02, 0.3)],
    "steps": [{"num_steps": n} for n in (600, 1000)],
    "long": [{"num_steps": n} for n in (3000, 10000)] + [
        {"num_steps": 10000, "optimizer.learning_rate": 3e-3}],
    "stable": [{"optimizer.warmup_fraction": 0.3},
               {"optimizer.learning_rate": 3e-3},
               {"optimizer.learning_rate": 5e-3, "optimizer.warmup_fraction": 0.3}],
    # Last attempts (run with --set num_steps=1000 --set optimizer.warmup_fraction=0.3).
    "last": [{}, {"model.similarity": "dot"}, {"model.tau_init": 0.0}, {"model.num_heads": 8},
             {"sampler.max_positive_queries": 4}],
    "knobs": [{"optimizer.b2": 0.99}, {"model.d_out": 32}, {"sampler.max_concept_queries": 1},
              {"optimizer.b2": 0.99, "optimizer.learning_rate": 3e-3, "sampler.batch_size": 256}],
    # Beyond the tiny model's size (diagnostics): width and depth.
    "wide": [{"model.d_model": 128, "model.d_ff": 512, "num_steps": 1000},
             {"model.d_model": 128, "model.d_ff": 512, "model.num_heads": 8, "num_steps": 1000}],
    "cpu_1000": [{"model.d_model": 64, "model.num_layers": 2, "model.d_ff": 256, "model.d_out": 32,
                  "optimizer.learning_rate": lr, "optimizer.warmup_fraction": w, "num_steps": 1000}
                 for lr, w in ((3e-3, 0.1), (1e-2, 0.3))],
    "deep": [{"model.num_layers": 2, "num_steps": 3000}],
    "layers": [{"model.num_layers": 2}, {"model.num_layers": 2, "num_steps": 1000}],
    "swaps": [{"sampler.swap_concepts": "differing"}, {"sampler.swaps_per_scene": 4}],
}


def make_eval(spec, num_batches, batch_size):
  """eval(params, key, inputs) -> per-category [correct, rows] sums and bag/bind counts."""
  space = spec.space
  sampler = scenes.SamplerConfig(batch_size=batch_size, max_positive_queries=space.num_objects,
                                 max_concept_queries=space.num_concept_tokens)

  def one_batch(params, key, inputs):
    batch = scenes.sample_batch(key, inputs.permutation_O, inputs.num_train, space=space,
                                sampler=sampler, split="train")
    out = train.forward(params, batch, spec.model, spec.model.eval_logit_cap)
    kinds = objectives.two_object_binding(
        out["object_logits_BxQ"], batch.object_labels_BxQo, batch.object_query_mask_Qo,
        batch.object_query_ids_Qo, batch.objects_BxKxC, batch.num_objects_B, space)
    active_B = out["object_active_B"]
    masks = {"1obj": batch.num_objects_B == 1, "2obj": batch.num_objects_B == 2,
             "same": kinds["same"], "share": kinds["share"], "ambiguous": kinds["ambiguous"]}
    res = {}
    for name, m in masks.items():
      m = m & active_B
      res[f"{name}_correct"] = (out["object_correct_B"] & m).sum()
      res[f"{name}_rows"] = m.sum()
    for name in ("bag", "bind", "cross_queried"):
      res[f"ambiguous_{name}_correct"] = (kinds[name] & active_B).sum()
    return res

  def evaluate(params, key, inputs):
    keys = jax.random.split(key, num_batches)
    per = jax.lax.map(lambda k: one_batch(params, k, inputs), keys)
    return jax.tree.map(lambda x: x.sum(0), per)
  return evaluate


def additive_r2(queries_OxD, spec):
  """R² of the unit object-query embeddings fit by a_{v0} + b_{v1} (+ const), least squares.

  1.0 means purely additive object embeddings, for which no scene embedding can put both objects
  of an ambiguous pair above the cross pair: q_a0a1 - q_a0b1 = -(q_b0b1 - q_b0a1).
  """
  q = np.asarray(queries_OxD, np.float64)[:, :spec.model.d_out]
  q = q / np.linalg.norm(q, axis=-1, keepdims=True)
  values = np.asarray(spec.space.object_values(np.arange(spec.space.num_objects)))
  design = np.concatenate([np.ones((len(q), 1))] + [
      np.eye(v)[values[:, c]] for c, v in enumerate(spec.space.values_per_concept)], axis=1)
  fit = design @ np.linalg.lstsq(design, q, rcond=None)[0]
  return float(1.0 - ((q - fit) ** 2).sum() / ((q - q.mean(0)) ** 2).sum())


def run_config(overrides, seeds, eval_batches, eval_batch_size, log_every, fast_compile=True):
  config = apply_overrides(base_config(), overrides)
  spec = run_spec.RunSpec.from_config(config)
  replica_inputs = []
  for s in seeds:
    config.seed = s
    replica_inputs.append(run_spec.inputs_from_config(config, spec)[0])
  inputs_R = jax.tree.map(lambda *x: np.stack(x), *replica_inputs)
  evaluate = make_eval(spec, eval_batches, eval_batch_size)

  all_queries = jnp.asarray(spec.space.object_query_tokens(np.arange(spec.space.num_objects)))

  def one(inputs):
    state = train.init(inputs.key, spec, inputs)

    def body(state, _):
      state, m = train.train_step(state, inputs, spec)
      return state, (m["loss"], m["batch_object_accuracy"])
    state, (loss_T, acc_T) = jax.lax.scan(body, state, None, length=spec.num_steps)
    # Evaluation key stream of the run loop (eval after num_steps).
    result = evaluate(state.params, train.eval_key(inputs.key, spec.num_steps), inputs)
    result["queries_OxD"] = models.DualEncoder(spec.model).apply(
        {"params": state.params}, all_queries, method=models.DualEncoder.encode_queries)
    return loss_T, acc_T, result

  t0 = time.perf_counter()
  fn = jax.jit(jax.vmap(one)).lower(inputs_R).compile(
      xla_options.compiler_options(jax.default_backend(), fast_compile))
  t1 = time.perf_counter()
  loss_RxT, acc_RxT, result = jax.device_get(fn(inputs_R))
  t2 = time.perf_counter()
  rows = []
  for r, s in enumerate(seeds):
    row = {"overrides": overrides, "seed": s, "num_steps": spec.num_steps,
           "compile_s": round(t1 - t0, 2), "run_s_all_seeds": round(t2 - t1, 2)}
    total_c = total_n = 0
    for name in CATEGORIES:
      c, n = int(result[f"{name}_correct"][r]), int(result[f"{name}_rows"][r])
      row[f"acc_{name}"] = c / max(n, 1)
      row[f"rows_{name}"] = n
      if name in ("1obj", "2obj"):
        total_c, total_n = total_c + c, total_n + n
    row["acc_object"] = total_c / max(total_n, 1)
    n_amb = max(int(result["ambiguous_rows"][r]), 1)
    row["ambiguous_bag"] = int(result["ambiguous_bag_correct"][r]) / n_amb
    row["ambiguous_bind"] = int(result["ambiguous_bind_correct"][r]) / n_amb
    row["ambiguous_cross_present"] = int(result["ambiguous_cross_queried_correct"][r]) / n_amb
    row["query_additive_r2"] = additive_r2(result["queries_OxD"][r], spec)
    row["loss_curve"] = [float(loss_RxT[r, t]) for t in range(log_every - 1, spec.num_steps,
                                                              log_every)]
    row["batch_object_accuracy_curve"] = [float(acc_RxT[r, t]) for t in
                                          range(log_every - 1, spec.num_steps, log_every)]
    rows.append(row)
  return rows


def _parse_set(items):
  out = {}
  for item in items:
    path, value = item.split("=", 1)
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      pass
    out[path] = value
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--grid", default=None, help=f"one of {', '.join(GRIDS)}")
  p.add_argument("--set", action="append", default=[],
                 help="path=value override on top of the base (and of every grid entry)")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--eval_batches", type=int, default=8)
  p.add_argument("--eval_batch_size", type=int, default=512)
  p.add_argument("--log_every", type=int, default=100)
  p.add_argument("--tag", default=None)
  p.add_argument("--no_fast_compile", action="store_true",
                 help="full XLA optimisation (slower compile, faster steps)")
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  common = _parse_set(args.set)
  grid = GRIDS[args.grid] if args.grid else [{}]
  tag = args.tag or args.grid or "custom"
  rows = []
  print(f"{'overrides':60s} seed  obj   1obj  2obj  same  share amb   bag   bind  qR2   s")
  for entry in grid:
    overrides = {**entry, **common}
    for row in run_config(overrides, seeds, args.eval_batches, args.eval_batch_size,
                          args.log_every, not args.no_fast_compile):
      rows.append(row)
      print(f"{json.dumps(overrides)[:60]:60s} {row['seed']:4d}  {row['acc_object']:.3f} "
            f"{row['acc_1obj']:.3f} {row['acc_2obj']:.3f} {row['acc_same']:.3f} "
            f"{row['acc_share']:.3f} {row['acc_ambiguous']:.3f} {row['ambiguous_bag']:.3f} "
            f"{row['ambiguous_bind']:.3f} {row['query_additive_r2']:.3f} "
            f"{row['run_s_all_seeds']:.0f}", flush=True)
  os.makedirs(RESULTS, exist_ok=True)
  path = os.path.join(RESULTS, f"tiny_binding_probe_{tag}.json")
  files.write_json(path, {"command": " ".join(sys.argv), "base": base_config().to_dict(),
                          "rows": rows}, sort_keys=True)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
