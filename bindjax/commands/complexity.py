"""`bindjax complexity --config=experiments/complexity.py:ARG --embeddings=SET --workdir=DIR`.

Binding-function complexity (docs/complexity.md): which function families of a scene's concept
values reproduce its embedding on objects never seen in training. For every approximator, train
fraction of objects, seed and learning rate, a model is fitted by full-batch MSE on the scenes
whose objects are all training objects and scored on train-only, test-only and mixed scenes by
frozen linear probes. Writes DIR/results.csv (one row per fit), DIR/summary.csv (median and
spread over seeds per model and fraction), DIR/results.json (everything, with histories) and
DIR/complexity.png. With description_length=True, also the prequential code length of every
model and seed (bits per scene, docs/complexity.md "Description length") in
DIR/description_length.json and .csv.

--embeddings=SET names the embedding set as in `probe`, `decompose` and `mds`; without it the
config's `embeddings` field does (a preset's default set).

Config fields (--config.FIELD=VALUE): embeddings (set directory); models (comma list:
mlp:W1xW2.., additive, product, product:W, sum_product, sum_product:W, per_object_product,
per_object_sum_product, per_object_sum_product:W); train_fractions, seeds, learning_rates
(tuples: the grid); split (random: one random object split per fraction and seed; coverage: the
set's own coverage split, recorded by `bindjax extract --objects=all`); steps, eval_every,
schedule (constant as the original, or cosine), eval_cadence (original: after steps 1, 101, …;
end: after 100, 200, …); embed_dim (slot embedding width, 0 = D); probes (auto | stored | fit),
probes_file (a probes.npz of `bindjax probe`), probe_steps, probe_similarity; chunk_size (auto |
none | n models at once), memory_bytes; restarts (initialisations tried inside each fit, the
best kept; 1 = a single start as the original), restart_steps (steps of each candidate),
restart_holdout (0: keep the lowest training loss; h: the lowest error on a held-out share h of
the training objects); trees, tree_models, tree_estimators; description_length (on/off),
dl_block_fractions (block boundaries as fractions of the objects), dl_restarts (fits per block
and learning rate), dl_precision (coding precision relative to the embeddings' scale). A
non-empty DIR is refused unless --overwrite.

In the original code: "sum+product" is sum_product; it reports one run and the final
evaluation, which results.csv has as final_* beside the best over evaluations (best_*).
"""
import dataclasses

from absl import flags

from bindjax.commands import flags as flags_lib
from bindjax.runtime import compilation_cache


def _default_config():
  from bindjax.complexity import analysis  # pylint: disable=g-import-not-at-top
  return analysis.default_config()


def main(argv):
  """Runs the command; returns 0 (errors exit with the statuses of bindjax.commands.flags)."""
  fv = flags_lib.new_flag_values(config_help="complexity config (experiments/complexity.py:ARG)",
                                 workdir_help="output directory (results, summary, figure)")
  flags.DEFINE_string("embeddings", None, "embedding set directory (native, original layout or "
                      "TFDS); default: the config's embeddings field", flag_values=fv)
  flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
  flags_lib.define_overwrite(fv)
  flags_lib.parse(fv, argv, required=("config", "workdir"), description=__doc__,
                  default_config=_default_config)
  prog, workdir = argv[0], fv["workdir"].value
  flags_lib.check_output_dir(prog, "workdir", workdir, fv["overwrite"].value)
  from bindjax.complexity import analysis  # pylint: disable=g-import-not-at-top
  with flags_lib.usage_errors(prog):
    settings = analysis.settings_from(fv["config"].value)
    if fv["embeddings"].value is not None:
      if any(a.startswith("--config.embeddings=") for a in argv):
        raise ValueError("--embeddings and --config.embeddings both name the embedding set; "
                         "expected one of them")
      settings = dataclasses.replace(settings, embeddings=fv["embeddings"].value)
  compilation_cache.enable()
  with flags_lib.run_errors(prog):
    analysis.run(settings, workdir, progress=fv["progress"].value)
  print(f"wrote {workdir}/results.csv, summary.csv, results.json and complexity.png")
  return 0
