"""Reference speed: one eager PyTorch training step of the pre-LN dual encoder on CPU.

The yardstick for train_step.py (bindjax's step, data included, against eager PyTorch's model
step alone). Our own PyTorch code of docs/models.md, docs/objectives.md and docs/training.md: two
towers (token embedding + sinusoidal
positions, 6 x nn.TransformerEncoderLayer(norm_first=True, gelu, batch_first, no dropout),
EOS read-out, linear to d_out), cosine logits with the capped learnable temperature, soft
cross-entropy over active rows (concept + object loss), AdamW with warm-up/decay. float32,
torch.set_num_threads(2), fixed random batches built like docs/sampling.md (C=2, V=20, K=2: 512
scenes of length 9, queries of length 5); data generation is NOT timed.

It needs torch, which the project never depends on: run it from the repository root with the
CPU wheel in its own venv (python3 -m venv TORCH_VENV; TORCH_VENV/bin/pip install
torch==2.13.0 numpy):
  TORCH_VENV/bin/python experiments/benchmarks/torch_reference_step.py
  TORCH_VENV/bin/python experiments/benchmarks/torch_reference_step.py --repeats=7 --steps=3

Rows: the query-set sizes of the original code on this config (all 40 concept tokens: C=2, V=20
has no more, though the sampler caps them at 64; ~300 object queries = 64 positives + ~256 swap
negatives, deduplicated) and bindjax's static padded sizes (40 concept, 400 object slots).
Each row: `warmup` steps, then `repeats` runs of `steps` steps; a run's s/step is its wall time
over its steps; the table shows the median over runs with min/max. Also reports parameters per
tower (docs/models.md#parameter-count: 7,918,144), an analytic FLOP count per step (matmuls and
attention, backward = 2x forward) with the achieved GFLOP/s, process CPU seconds per step (less
sensitive to other processes than wall time, though 2 threads spinning on a busy machine inflate it
too), and the 1/5/15-minute load average before and after each row, because this machine is shared.
Writes JSON (atomically) to experiments/benchmarks/results/torch_reference_step.json; earlier runs
in that file move to its "history" list.
"""
import argparse
import json
import math
import os
import platform
import statistics
import time

import numpy as np
import torch
from torch import nn

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                       "torch_reference_step.json")

# Tokens (docs/world.md#tokens) for C=2 concepts of V=20 values, K=2 objects per scene.
NUM_CONCEPTS, NUM_VALUES, MAX_OBJECTS = 2, 20, 2
SOO = NUM_CONCEPTS * NUM_VALUES
EOO, EOS, PAD = SOO + 1, SOO + 2, SOO + 3
VOCAB = SOO + 4
SCENE_LENGTH = (NUM_CONCEPTS + 2) * MAX_OBJECTS + 1
QUERY_LENGTH = NUM_CONCEPTS + 3


def sinusoidal_positions(length, d_model):
  """pe[p, 2i] = sin(p 10000^(-2i/d)), pe[p, 2i+1] = cos(same), [length, d_model]."""
  position_L1 = torch.arange(length, dtype=torch.float32)[:, None]
  rate_H = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) *
                     (-math.log(10000.0) / d_model))
  pe_LxD = torch.zeros(length, d_model)
  pe_LxD[:, 0::2] = torch.sin(position_L1 * rate_H)
  pe_LxD[:, 1::2] = torch.cos(position_L1 * rate_H)
  return pe_LxD


class Tower(nn.Module):
  """Pre-LN transformer tower: tokens [B, L] -> z [B, d_out] read at the EOS position."""

  def __init__(self, d_model, num_heads, num_layers, d_ff, d_out, max_length):
    super().__init__()
    self.embed = nn.Embedding(VOCAB, d_model)
    self.register_buffer("pe_LxD", sinusoidal_positions(max_length, d_model))
    self.layers = nn.ModuleList(
        nn.TransformerEncoderLayer(d_model, num_heads, d_ff, dropout=0.0, activation="gelu",
                                   layer_norm_eps=1e-5, batch_first=True, norm_first=True)
        for _ in range(num_layers))
    self.out = nn.Linear(d_model, d_out)
    for name, param in self.named_parameters():
      if param.dim() == 2:
        nn.init.xavier_uniform_(param)  # in_proj_weight is one [3d, d] matrix (docs/models.md)
      elif name.endswith("in_proj_bias") or name.endswith("out_proj.bias"):
        nn.init.zeros_(param)

  def forward(self, tokens_BxL):
    pad_BxL = tokens_BxL == PAD
    x_BxLxD = self.embed(tokens_BxL) + self.pe_LxD[:tokens_BxL.shape[1]]
    for layer in self.layers:
      x_BxLxD = layer(x_BxLxD, src_key_padding_mask=pad_BxL)
    eos_B = (~pad_BxL).sum(1) - 1  # last non-PAD token
    return self.out(x_BxLxD[torch.arange(tokens_BxL.shape[0]), eos_B])


class DualEncoder(nn.Module):

  def __init__(self, **tower):
    super().__init__()
    self.scene_tower = Tower(max_length=SCENE_LENGTH, **tower)
    self.query_tower = Tower(max_length=QUERY_LENGTH, **tower)
    self.tau = nn.Parameter(torch.tensor(1.15))

  def logits(self, z_BxD, q_QxD, cap=10.0):
    z_BxD = z_BxD / (1e-6 + z_BxD.norm(dim=-1, keepdim=True))
    q_QxD = q_QxD / (1e-6 + q_QxD.norm(dim=-1, keepdim=True))
    return torch.clamp(self.tau.exp(), max=cap) * z_BxD @ q_QxD.T


def soft_cross_entropy(logits_BxQ, labels_BxQ):
  """Soft cross-entropy (docs/objectives.md): mean over rows with a positive of -sum_j t_j
  log_softmax_j, t = labels / sum."""
  active_B = labels_BxQ.sum(1) > 0
  targets_BxQ = labels_BxQ / (labels_BxQ.sum(1, keepdim=True) + 1e-10)
  loss_B = -(targets_BxQ * torch.log_softmax(logits_BxQ, dim=1)).sum(1)
  return (loss_B * active_B).sum() / active_B.sum().clamp(min=1)


def make_batch(rng, batch_size, num_concept_queries, num_object_queries):
  """Fixed random scenes and query sets shaped like docs/sampling.md (not timed)."""
  count_B = rng.integers(1, MAX_OBJECTS + 1, batch_size)
  values_BxKxC = rng.integers(0, NUM_VALUES, (batch_size, MAX_OBJECTS, NUM_CONCEPTS))
  offsets_C = np.arange(NUM_CONCEPTS) * NUM_VALUES
  scenes_BxL = np.full((batch_size, SCENE_LENGTH), PAD)
  for b in range(batch_size):
    tokens = []
    for k in range(count_B[b]):
      tokens += [SOO, *(values_BxKxC[b, k] + offsets_C), EOO]
    scenes_BxL[b, :len(tokens) + 1] = tokens + [EOS]
  present_BxK = np.arange(MAX_OBJECTS)[None] < count_B[:, None]
  ids_BxK = np.where(present_BxK, values_BxKxC[..., 0] + NUM_VALUES * values_BxKxC[..., 1], -1)

  concept_Qc = rng.permutation(NUM_CONCEPTS * NUM_VALUES)[:num_concept_queries]
  concept_tokens_QcxL = np.full((concept_Qc.size, QUERY_LENGTH), PAD)
  concept_tokens_QcxL[:, 0], concept_tokens_QcxL[:, 1] = concept_Qc, EOS
  scene_tokens_BxKxC = np.where(present_BxK[..., None], values_BxKxC + offsets_C, -1)
  concept_labels_BxQc = (scene_tokens_BxKxC.reshape(batch_size, -1)[:, :, None] ==
                         concept_Qc[None, None]).any(1)

  present_ids = rng.permutation(np.unique(ids_BxK[ids_BxK >= 0]))[:64]
  others = np.setdiff1d(np.arange(NUM_VALUES**NUM_CONCEPTS), present_ids)
  object_Qo = np.concatenate(
      [present_ids, rng.permutation(others)[:num_object_queries - present_ids.size]])
  object_tokens_QoxL = np.stack(
      [np.full(object_Qo.size, SOO), object_Qo % NUM_VALUES, NUM_VALUES + object_Qo // NUM_VALUES,
       np.full(object_Qo.size, EOO), np.full(object_Qo.size, EOS)], 1)
  object_labels_BxQo = (ids_BxK[:, :, None] == object_Qo[None, None]).any(1)
  as_long, as_float = (lambda x: torch.as_tensor(x, dtype=torch.long),
                       lambda x: torch.as_tensor(x, dtype=torch.float32))
  return (as_long(scenes_BxL), as_long(concept_tokens_QcxL), as_float(concept_labels_BxQc),
          as_long(object_tokens_QoxL), as_float(object_labels_BxQo))


def train_step(model, optimizer, schedule, batch):
  scenes_BxL, concepts_QcxL, concept_labels, objects_QoxL, object_labels = batch
  optimizer.zero_grad(set_to_none=True)
  z_BxD = model.scene_tower(scenes_BxL)
  # One query-tower call for both query sets, as the original code batches its queries.
  q_QxD = model.query_tower(torch.cat([concepts_QcxL, objects_QoxL]))
  logits_BxQ = model.logits(z_BxD, q_QxD)
  num_concepts = concepts_QcxL.shape[0]
  loss = (soft_cross_entropy(logits_BxQ[:, :num_concepts], concept_labels) +
          soft_cross_entropy(logits_BxQ[:, num_concepts:], object_labels))
  loss.backward()
  optimizer.step()
  schedule.step()
  return loss.detach()


def step_flops(d_model, num_layers, d_ff, d_out, batch_size, num_queries):
  """Matmul + attention FLOPs of one training step (forward x 3 for forward + backward)."""

  def tower(sequences, length):
    tokens = sequences * length
    per_layer = 2 * tokens * (4 * d_model * d_model + 2 * d_model * d_ff)
    per_layer += 2 * 2 * sequences * length * length * d_model  # scores and weighted sum
    return num_layers * per_layer + 2 * sequences * d_model * d_out

  forward = (tower(batch_size, SCENE_LENGTH) + tower(num_queries, QUERY_LENGTH) +
             2 * batch_size * num_queries * d_out)
  return 3 * forward


def time_row(args, num_concept_queries, num_object_queries):
  torch.manual_seed(0)
  model = DualEncoder(d_model=args.d_model, num_heads=args.num_heads,
                      num_layers=args.num_layers, d_ff=args.d_ff, d_out=args.d_out)
  model.train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.1)
  warmup = max(1, args.total_steps // 10)
  schedule = torch.optim.lr_scheduler.LambdaLR(
      optimizer, lambda s: s / warmup if s < warmup else
      max(0.0, (args.total_steps - s) / (args.total_steps - warmup)))
  rng = np.random.default_rng(0)
  batches = [make_batch(rng, args.batch_size, num_concept_queries, num_object_queries)
             for _ in range(2)]
  load_before = os.getloadavg()
  for i in range(args.warmup):
    train_step(model, optimizer, schedule, batches[i % 2])
  per_step, cpu_per_step = [], []
  for r in range(args.repeats):
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(args.steps):
      loss = train_step(model, optimizer, schedule, batches[(r + i) % 2])
    per_step.append((time.perf_counter() - start) / args.steps)
    cpu_per_step.append((time.process_time() - cpu_start) / args.steps)
  if not torch.isfinite(loss):
    raise RuntimeError(f"non-finite loss {loss.item()}")
  median = statistics.median(per_step)
  flops = step_flops(args.d_model, args.num_layers, args.d_ff, args.d_out, args.batch_size,
                     num_concept_queries + num_object_queries)
  return {
      "threads": torch.get_num_threads(), "concept_queries": num_concept_queries,
      "object_queries": num_object_queries,
      "median_s_per_step": median, "min_s_per_step": min(per_step),
      "max_s_per_step": max(per_step), "runs_s_per_step": per_step,
      "median_cpu_s_per_step": statistics.median(cpu_per_step),
      "flops_per_step": flops, "median_gflops_per_s": flops / median / 1e9,
      "params_per_tower": sum(p.numel() for p in model.scene_tower.parameters()),
      "load_average_before": load_before, "load_average_after": os.getloadavg(),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_size", type=int, default=512)
  parser.add_argument("--d_model", type=int, default=256)
  parser.add_argument("--num_heads", type=int, default=4)
  parser.add_argument("--num_layers", type=int, default=6)
  parser.add_argument("--d_ff", type=int, default=2048)
  parser.add_argument("--d_out", type=int, default=64)
  parser.add_argument("--threads", type=int, default=2)
  parser.add_argument("--warmup", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=5, help="timed runs per row")
  parser.add_argument("--steps", type=int, default=2, help="steps per timed run")
  parser.add_argument("--total_steps", type=int, default=50_000, help="for the lr schedule")
  parser.add_argument("--queries", default="40x300,40x400",
                      help="rows as CONCEPTxOBJECT query counts, comma separated")
  parser.add_argument("--output", default=RESULTS)
  args = parser.parse_args()
  torch.set_num_threads(args.threads)
  rows = []
  print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch "
        f"{args.batch_size}, d_model {args.d_model}, {args.num_layers} layers, d_ff {args.d_ff}, "
        f"float32; load average {os.getloadavg()}")
  print(f"{'Qc':>4} {'Qo':>4} {'median s/step':>14} {'min':>7} {'max':>7} {'CPU s/step':>10} "
        f"{'GFLOP/s':>8}  load")
  for spec in args.queries.split(","):
    concept, obj = (int(x) for x in spec.split("x"))
    row = time_row(args, concept, obj)
    rows.append(row)
    print(f"{concept:>4} {obj:>4} {row['median_s_per_step']:>14.3f} "
          f"{row['min_s_per_step']:>7.3f} {row['max_s_per_step']:>7.3f} "
          f"{row['median_cpu_s_per_step']:>10.3f} {row['median_gflops_per_s']:>8.1f}  "
          f"{row['load_average_after'][0]:.1f}", flush=True)
  print(f"parameters per tower: {rows[0]['params_per_tower']:,} (expected 7,918,144)")
  result = {
      "benchmark": "torch_reference_step", "torch_version": torch.__version__,
      "threads": torch.get_num_threads(), "platform": platform.platform(),
      "cpu_count": os.cpu_count(), "processor": platform.processor(),
      "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
      "config": {k: v for k, v in vars(args).items() if k != "output"}, "rows": rows,
  }
  # Earlier measurements stay in "history": on a shared machine one run says little.
  history = []
  if os.path.exists(args.output):
    with open(args.output) as f:
      previous = json.load(f)
    history = previous.pop("history", []) + [previous]
  result["history"] = history
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  tmp = f"{args.output}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(result, f, indent=1)
  os.replace(tmp, args.output)
  print(f"wrote {args.output}")


if __name__ == "__main__":
  main()
