"""`bindjax train --config=experiments/train.py:PRESET --workdir=DIR`: train one dual encoder.

Resumes from the latest checkpoint when DIR already holds this run (same config); a DIR holding a
different run is refused. Examples:

  bindjax train --config=experiments/train.py:smoke --workdir=/tmp/bindjax_train_smoke
  bindjax train --config=experiments/train.py:cpu --workdir=runs/train_cpu
  bindjax train --config=experiments/train.py:paper --workdir=runs/train_paper \
      --config.coverage=0.5 --config.seed=1
"""
import json

from absl import flags

from bindjax.commands import flags as bj_flags


def main(argv):
  """Runs (or resumes) the training run; prints the final metrics as JSON. Returns 0."""
  fv = bj_flags.new_flag_values()
  flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
  bj_flags.parse(fv, argv, required=("config", "workdir"))
  from bindjax import train
  try:
    final = train.run_training(fv["config"].value, fv["workdir"].value,
                               progress=fv["progress"].value)
  except ValueError as e:
    raise bj_flags.UsageError(f"{argv[0]}: {e}") from None
  keys = ("step", "loss", "heldout/object_accuracy", "heldout/concept_accuracy",
          "train/object_accuracy", "train/concept_accuracy", "heldout/uses_training_objects")
  print(json.dumps({k: final[k] for k in keys if final and k in final}, sort_keys=True))
  return 0
