"""Is the 1-layer scene tower able to bind? Same tower, simpler read-outs than the dual encoder.

Diagnostic for tiny_binding_probe.py. One bindjax scene `Tower` (C=2, V=4, K=2,
d_model 32, 1 layer by default) is trained on training-object scenes (coverage 1) to name the
objects of each scene, with one of these read-outs of its 16-d output z:

  bce     16 logits z (a free linear read-out per object), sigmoid binary cross-entropy
  ce      the same logits, the soft cross-entropy of docs/objectives.md#soft-cross-entropy
  cos     10·cos(z, q_o) with q_o free parameters per object, soft cross-entropy
  tower   10·cos(z, q_o) with q_o from a second 1-layer Tower on the object-query tokens (the
          dual encoder without concept queries), soft cross-entropy

Adam(W) with warm-up + cosine decay, batch 256, several seeds vmapped. Reports set-separation
accuracy (docs/objectives.md#set-separation-accuracy, every object a query) overall and on
"ambiguous" 2-object scenes (objects that differ in both concepts, which only binding tells apart
from the cross pair).

  python experiments/studies/tiny_binding_readout.py --modes=bce,ce,cos,tower --steps=1000

Writes experiments/studies/results/tiny_binding/tiny_binding_readout.json.
"""
import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bindjax.base import files
from bindjax.core import model_config
from bindjax.core import models
from bindjax.core import scenes
from bindjax.core import world
from bindjax.runtime import xla_options

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "tiny_binding")
MODES = ("bce", "ce", "cos", "tower")


def run_mode(mode, *, layers, d_model, heads, d_ff, steps, lr, batch_size, seeds):
  space = world.ObjectSpace.create(4, 2, num_concepts=2)
  num_objects = space.num_objects
  cfg = model_config.ModelConfig.for_space(space, d_model=d_model, num_heads=heads,
                                           num_layers=layers, d_ff=d_ff, d_out=16)
  sampler = scenes.SamplerConfig(batch_size=batch_size)
  permutation = jnp.arange(num_objects, dtype=jnp.int32)
  tower = models.Tower(cfg, 16, space.scene_length)
  query_tower = models.Tower(cfg, 16, space.query_length)
  query_tokens = jnp.asarray(space.object_query_tokens(np.arange(num_objects)))

  def batch(key):
    b = scenes.sample_batch(key, permutation, jnp.int32(num_objects), space=space,
                            sampler=sampler, split="train")
    ids = space.object_ids(jnp.maximum(b.objects_BxKxC, 0))
    labels = jnp.zeros((batch_size, num_objects)).at[jnp.arange(batch_size)[:, None], ids].max(
        b.object_mask_BxK.astype(jnp.float32))
    o = b.objects_BxKxC
    ambiguous = (b.num_objects_B == 2) & jnp.all(o[:, 0] != o[:, 1], axis=-1)
    return b.scene_tokens_BxL, labels, ambiguous

  def logits_fn(p, tokens):
    z = tower.apply(p["scene"], tokens)
    if mode in ("bce", "ce"):
      return z
    q = p["queries"] if mode == "cos" else query_tower.apply(p["query_tower"], query_tokens)
    z = z / (1e-6 + jnp.linalg.norm(z, axis=-1, keepdims=True))
    q = q / (1e-6 + jnp.linalg.norm(q, axis=-1, keepdims=True))
    return 10.0 * z @ q.T

  def loss_fn(p, tokens, labels):
    logits = logits_fn(p, tokens)
    if mode == "bce":
      return optax.sigmoid_binary_cross_entropy(logits, labels).mean()
    targets = labels / labels.sum(-1, keepdims=True)
    return -(targets * jax.nn.log_softmax(logits)).sum(-1).mean()

  def one(seed):
    key = jax.random.key(seed)
    params = {"scene": tower.init(jax.random.fold_in(key, 0),
                                  jnp.zeros((1, space.scene_length), jnp.int32)),
              "queries": jax.random.normal(jax.random.fold_in(key, 1), (num_objects, 16)),
              "query_tower": query_tower.init(jax.random.fold_in(key, 2), query_tokens)}
    tx = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, lr, steps // 10, steps),
                     weight_decay=0.0)

    def step(carry, t):
      p, opt = carry
      tokens, labels, _ = batch(jax.random.fold_in(jax.random.fold_in(key, 3), t))
      loss, grads = jax.value_and_grad(loss_fn)(p, tokens, labels)
      updates, opt = tx.update(grads, opt, p)
      return (optax.apply_updates(p, updates), opt), loss

    (params, _), losses = jax.lax.scan(step, (params, tx.init(params)), jnp.arange(steps))
    tokens, labels, ambiguous = batch(jax.random.fold_in(key, 4))
    logits = logits_fn(params, tokens)
    min_pos = jnp.min(jnp.where(labels > 0, logits, jnp.inf), -1)
    max_neg = jnp.max(jnp.where(labels > 0, -jnp.inf, logits), -1)
    correct = min_pos > max_neg
    return losses, correct.mean(), (correct & ambiguous).sum() / ambiguous.sum()

  seeds_R = jnp.asarray(seeds)
  t0 = time.perf_counter()
  fn = jax.jit(jax.vmap(one)).lower(seeds_R).compile(
      xla_options.compiler_options(jax.default_backend(), fast_compile=True))
  losses, acc, amb = jax.device_get(fn(seeds_R))
  seconds = time.perf_counter() - t0
  every = max(1, steps // 10)
  return [{"mode": mode, "seed": int(s), "layers": layers, "d_model": d_model, "heads": heads,
           "d_ff": d_ff, "steps": steps, "lr": lr, "batch_size": batch_size,
           "set_accuracy": float(acc[r]), "ambiguous_accuracy": float(amb[r]),
           "loss_curve": [float(x) for x in losses[r, every - 1::every]],
           "seconds_all_seeds": round(seconds, 1)} for r, s in enumerate(seeds)]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--modes", default="bce,ce,cos,tower")
  p.add_argument("--layers", type=int, default=1)
  p.add_argument("--d_model", type=int, default=32)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--d_ff", type=int, default=128)
  p.add_argument("--steps", type=int, default=1000)
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--batch_size", type=int, default=256)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--tag", default=None)
  args = p.parse_args(argv)
  rows = []
  for mode in args.modes.split(","):
    if mode not in MODES:
      raise SystemExit(f"--modes: unknown mode {mode!r}; expected {', '.join(MODES)}")
    for row in run_mode(mode, layers=args.layers, d_model=args.d_model, heads=args.heads,
                        d_ff=args.d_ff, steps=args.steps, lr=args.lr,
                        batch_size=args.batch_size,
                        seeds=[int(s) for s in args.seeds.split(",")]):
      rows.append(row)
      print(f"{mode:6s} seed {row['seed']}  set accuracy {row['set_accuracy']:.3f}  "
            f"ambiguous {row['ambiguous_accuracy']:.3f}  final loss {row['loss_curve'][-1]:.3f}",
            flush=True)
  os.makedirs(RESULTS, exist_ok=True)
  name = "tiny_binding_readout" + (f"_{args.tag}" if args.tag else "")
  path = os.path.join(RESULTS, name + ".json")
  files.write_json(path, {"command": " ".join(sys.argv), "rows": rows}, sort_keys=True)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
