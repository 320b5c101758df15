"""`bindjax probe --embeddings=DIR --workdir=OUT [--steps=10000] [--similarity=dot|cosine]`.

Fits linear probes on frozen embeddings (docs/probes.md): one bias-free linear map per concept
and one for the object identity, trained together (summed soft cross-entropy, Adam with a cosine
decay, full batch) on a random split of the scenes (--train_fraction, torch-compatible randperm
from --seed, as the original code splits): every scene, or with --scenes=two-object the 2-object
scenes alone, as the original code does (on a set that also holds single-object scenes the two
differ; the output says which scenes were used). DIR is a native embedding set, a TFDS-built one or
a folder written by the original code. Writes OUT/probes.npz (arrays concept_0, concept_1, …,
object; rows are classes) and OUT/probe_metrics.json (train and test concept and object
accuracy, losses); a non-empty OUT is refused unless --overwrite. `bindjax complexity` and
`bindjax interventions` take the probes.npz as `probes_file`, so the probes are fitted once.
"""
from absl import flags

from bindjax.commands import flags as flags_lib


def main(argv):
  """Runs the command; returns 0 (errors exit with the statuses of bindjax.commands.flags)."""
  from bindjax.frozen.probes import linear  # pylint: disable=g-import-not-at-top
  from bindjax.frozen.probes import probe_analysis  # pylint: disable=g-import-not-at-top
  defaults = linear.ProbeConfig()
  fv = flags_lib.new_flag_values(
      with_config=False, workdir_help="output directory: probes.npz and probe_metrics.json")
  flags.DEFINE_string("embeddings", None, "embedding set directory (native or original layout)",
                      flag_values=fv)
  flags.DEFINE_integer("steps", defaults.steps, "Adam steps (full batch)", flag_values=fv)
  flags.DEFINE_float("learning_rate", defaults.learning_rate,
                     "Adam learning rate (cosine decay to 0)", flag_values=fv)
  flags.DEFINE_enum("similarity", defaults.similarity, list(linear.SIMILARITIES),
                    "probe logits", flag_values=fv)
  flags.DEFINE_float("train_fraction", defaults.train_fraction,
                     "fraction of scenes for training", flag_values=fv)
  flags.DEFINE_integer("seed", defaults.seed, "split (torch-compatible randperm) and init seed",
                       flag_values=fv)
  flags.DEFINE_enum("scenes", defaults.scenes, list(linear.SCENES),
                    "scenes the probes are split and fitted on: all, or the 2-object scenes "
                    "alone (as the original code does)", flag_values=fv)
  flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
  flags_lib.define_overwrite(fv)
  flags_lib.parse(fv, argv, required=("embeddings", "workdir"), description=__doc__)
  prog, workdir, directory = argv[0], fv["workdir"].value, fv["embeddings"].value
  flags_lib.check_output_dir(prog, "workdir", workdir, fv["overwrite"].value)
  config = linear.ProbeConfig(steps=fv["steps"].value, learning_rate=fv["learning_rate"].value,
                              similarity=fv["similarity"].value,
                              train_fraction=fv["train_fraction"].value, seed=fv["seed"].value,
                              scenes=fv["scenes"].value)
  with flags_lib.run_errors(prog):
    metrics, probes_path, metrics_path = probe_analysis.run(config, directory, workdir,
                                                            progress=fv["progress"].value)
  print(f"probes split and fitted on {metrics['num_scenes']} scenes (--scenes="
        f"{metrics['scenes']}): {metrics['num_train_scenes']} train, "
        f"{metrics['num_test_scenes']} test")
  for split in ("train", "test"):
    m = metrics[split]
    print(f"{split}: concept acc {m['concept_acc']:.3f}  object acc {m['object_acc']:.3f}  "
          f"loss {m['loss']:.4f}")
  print(f"wrote {probes_path} and {metrics_path}")
  return 0
