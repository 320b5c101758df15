"""`bindjax import --reference=DIR --out=DIR [--embeddings=FILE] [--overwrite] [--tfds]`.

Converts a folder written by the original PyTorch code (dataset.pkl, metadata.json, an
embeddings file) into bindjax's native embedding-set format, without torch
(docs/file_formats.md#reference-folders).
"""
from absl import flags

from bindjax.commands import flags as flags_lib


def main(argv):
  """Runs the command; returns 0 (errors exit with the statuses of bindjax.commands.flags)."""
  fv = flags_lib.new_flag_values(with_config=False, with_workdir=False)
  flags.DEFINE_string("reference", None, "folder of the original code (dataset.pkl, "
                      "metadata.json, *_embeddings.pkl ...)", flag_values=fv)
  flags.DEFINE_string("out", None, "output directory (native format: embeddings.npz + "
                      "metadata.json)", flag_values=fv)
  flags.DEFINE_string("embeddings", None, "embeddings file, relative to --reference or absolute "
                      "(default: the folder's only *_embeddings.pkl / embeddings.npy / "
                      "trained_embeddings_*.pt)", flag_values=fv)
  flags_lib.define_overwrite(fv)
  flags.DEFINE_bool("tfds", False, "write a TFDS array_record dataset instead of the native "
                    "format (for sets too large for memory)", flag_values=fv)
  flags_lib.parse(fv, argv, required=("reference", "out"), description=__doc__)
  prog, out = argv[0], fv["out"].value
  flags_lib.check_output_dir(prog, "out", out, fv["overwrite"].value)
  # Imported after flag parsing so `--help` stays fast.
  from bindjax.frozen.compat import reference  # pylint: disable=g-import-not-at-top
  with flags_lib.input_errors(prog):
    embedding_set = reference.read_reference_folder(fv["reference"].value,
                                                    fv["embeddings"].value)
  if fv["tfds"].value:
    from bindjax.frozen import tfds_builder  # pylint: disable=g-import-not-at-top
    out = tfds_builder.write_embedding_set(embedding_set, out, overwrite=True)
  else:
    out = embedding_set.save(out, overwrite=True)
  probes = ", ".join(f"{k} {list(v.shape)}" for k, v in sorted(embedding_set.probes.items()))
  print(f"{out}: {embedding_set.num_scenes} scenes x {embedding_set.dim} dims, "
        f"values_per_concept={list(embedding_set.values_per_concept)}, "
        f"max_objects={embedding_set.max_objects}"
        f"{', probes: ' + probes if probes else ''}")
  return 0
