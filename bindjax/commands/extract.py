"""`bindjax extract --workdir=RUN [--replica=N] --objects=all|train|held-out [--out=DIR]`.

Turns a trained dual encoder (docs/extraction.md) into an embedding set (native format) with concept
and object probe vectors, readable by `bindjax probe`, `complexity`, `decompose`, `interventions`,
`mds`. RUN is a `bindjax train` workdir or a `bindjax sweep` workdir, whose replica N (its index in
RUN/replicas.json) is extracted. Default output: RUN/embeddings_<objects> (of a sweep:
RUN/embeddings_<objects>_replica<N>). An original PyTorch checkpoint works too:
`bindjax extract --checkpoint=FILE.pt --out=DIR [--split=object_split_seed0_frac0.8000.npz]`.
"""
import os

from absl import flags
from etils import epath

from bindjax.commands import flags as flags_lib


def main(argv):
  """Runs the command; returns 0 (errors exit with the statuses of bindjax.commands.flags)."""
  fv = flags_lib.new_flag_values(
      with_config=False, workdir_help="the `bindjax train` or `bindjax sweep` workdir to read "
      "(instead of --checkpoint)")
  flags.DEFINE_enum("objects", "all", ["all", "train", "held-out"], "objects whose ordered pairs "
                    "are embedded", flag_values=fv)
  flags.DEFINE_enum("which", "best", ["best", "latest"], "parameters of a bindjax workdir: "
                    "at the best held-out object accuracy, or the latest", flag_values=fv)
  flags.DEFINE_integer("replica", None, "replica of a sweep workdir (index in replicas.json); "
                       "not needed for a single run", lower_bound=0, flag_values=fv)
  flags.DEFINE_string("checkpoint", None, "original PyTorch checkpoint file (instead of "
                      "--workdir)", flag_values=fv)
  flags.DEFINE_list("values_per_concept", None, "V_c per concept for --checkpoint (default: "
                    "equal split of the vocabulary)", flag_values=fv)
  flags.DEFINE_string("split", None, "split file (object_split_seed{S}_frac{F}.npz) for "
                      "--checkpoint with --objects=train/held-out", flag_values=fv)
  flags.DEFINE_string("out", None, "output directory (default: WORKDIR/embeddings_<objects>)",
                      flag_values=fv)
  flags.DEFINE_bool("single_objects", False, "also embed each object alone (first rows), e.g. "
                    "for the single-object intervention bank", flag_values=fv)
  flags.DEFINE_integer("batch_size", 4096, "scenes per tower call", lower_bound=1,
                       flag_values=fv)
  flags_lib.define_overwrite(fv)
  flags_lib.parse(fv, argv, description=__doc__)
  prog = argv[0]
  workdir, checkpoint = fv["workdir"].value, fv["checkpoint"].value
  if (workdir is None) == (checkpoint is None):
    raise flags_lib.UsageError(f"{prog}: pass exactly one of --workdir (bindjax run) or "
                               "--checkpoint (PyTorch file)")
  out = fv["out"].value
  if out is None:
    if workdir is None:
      raise flags_lib.UsageError(f"{prog}: --out is required with --checkpoint")
    replica = fv["replica"].value
    out = os.fspath(epath.Path(workdir) / (f"embeddings_{fv['objects'].value}"
                                              + ("" if replica is None else f"_replica{replica}")))
  flags_lib.check_output_dir(prog, "out", out, fv["overwrite"].value)
  values = fv["values_per_concept"].value
  with flags_lib.usage_errors(prog):
    try:
      values = values and [int(v) for v in values]
    except ValueError:
      raise ValueError(f"--values_per_concept={','.join(values)}: expected integers") from None
  from bindjax.frozen import extract  # pylint: disable=g-import-not-at-top
  with flags_lib.run_errors(prog):   # a missing or out-of-range --replica is a usage error
    if workdir is not None:
      trained = extract.load_workdir(workdir, fv["which"].value, fv["replica"].value)
    else:
      trained = extract.load_reference(checkpoint, values, fv["split"].value)
  with flags_lib.usage_errors(prog):   # e.g. --objects=train without a split
    extract.object_ids_for(trained, fv["objects"].value)
  with flags_lib.input_errors(prog):
    embedding_set = extract.extract(trained, fv["objects"].value, fv["single_objects"].value,
                                    fv["batch_size"].value)
  embedding_set.save(out, overwrite=True)
  print(f"{out}: {embedding_set.num_scenes} scenes x {embedding_set.dim} dims from "
        f"{len(embedding_set.provenance['object_ids'])} objects ({fv['objects'].value}), "
        f"{_parameters(trained)}; probes {sorted(embedding_set.probes)}")
  return 0


def _parameters(trained):
  """Which parameters were extracted, e.g. "step 20 (best held-out object accuracy)"."""
  which = trained.source.get("checkpoint")
  said = {"best": " (its best held-out object accuracy)", "latest": " (the latest)"}
  return f"step {trained.step}{said.get(which, '')}"
