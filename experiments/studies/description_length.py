r"""Prequential description length of the real embedding sets in tests/data (docs/complexity.md,
"Description length"; findings: docs/findings/description_length.md).

For each approximator family: the code length, in bits per scene, of the set's two-object scene
embeddings given the concepts, over the seeded object ordering, beside the family's parameter
count and the baseline (the code without concepts). One process per seed keeps each run short:

  nice -n 10 python experiments/studies/description_length.py --seed=0
  nice -n 10 python experiments/studies/description_length.py --seed=1
  nice -n 10 python experiments/studies/description_length.py --seed=0 --embed_dim=16
  nice -n 10 python experiments/studies/description_length.py --seed=0 --models=mlp:256 \
      --learning_rate=1e-3 --tag=_mlp_lr1e-3

Writes experiments/studies/results/description_length/<set>_seed<seed>[_E<embed_dim>]<tag>.json
(every row of `description_length.measure`, with per-block bits, and the settings) after each
family, and prints a table.
"""
import argparse
import os
import time

from bindjax.base import files
from bindjax.complexity import data as data_lib
from bindjax.complexity import description_length
from bindjax.complexity import families
from bindjax.complexity import fit_settings
from bindjax.frozen import embeddings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(REPO, "experiments", "studies", "results", "description_length")
SETS = {"clevr_text": os.path.join(REPO, "tests", "data", "clevr_text")}
MODELS = "additive,product,sum_product,per_object_product,per_object_sum_product,mlp:256"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--set", default="clevr_text", choices=sorted(SETS))
  p.add_argument("--models", default=MODELS)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--embed_dim", type=int, default=0, help="slot embedding width E; 0: D")
  p.add_argument("--steps", type=int, default=1000)
  p.add_argument("--learning_rate", type=float, default=1e-2)
  p.add_argument("--restarts", type=int, default=2)
  p.add_argument("--block_fractions", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9")
  p.add_argument("--precision", type=float, default=1e-3)
  p.add_argument("--tag", default="", help="suffix of the results file name")
  args = p.parse_args(argv)
  embedding_set = embeddings.read_embeddings(SETS[args.set])
  data, _ = data_lib.from_set(embedding_set)
  models = families.parse_models(args.models, tuple(embedding_set.values_per_concept),
                                 embedding_set.objects.shape[1], data.targets_NxD.shape[-1],
                                 args.embed_dim)
  code = description_length.CodeConfig(
      block_fractions=tuple(float(f) for f in args.block_fractions.split(",")),
      restarts=args.restarts, precision=args.precision).validate()
  fit = fit_settings.FitConfig(steps=args.steps, eval_every=args.steps, schedule="cosine")
  width = f"_E{args.embed_dim}" if args.embed_dim else ""
  path = os.path.join(RESULTS, f"{args.set}_seed{args.seed}{width}{args.tag}.json")
  out = {"set": args.set, "num_scenes": data.num_scenes, "num_objects": data.num_unique,
         "dim": int(data.targets_NxD.shape[-1]), "settings": vars(args), "rows": []}
  for model in models:
    start = time.perf_counter()
    (row,) = description_length.measure([model], data, [args.seed], [args.learning_rate], code,
                                        fit)
    row["seconds"] = time.perf_counter() - start
    out["rows"].append(row)
    files.write_json(path, files.to_jsonable(out), indent=1)
    print(f"{row['name']:>24} {row['bits_per_scene']:8.1f} bits/scene  "
          f"(baseline {row['baseline_bits_per_scene']:.1f})  {row['num_parameters']:>9} "
          f"parameters  {row['seconds']:.0f}s", flush=True)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
