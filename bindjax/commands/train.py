"""`bindjax train --config=experiments/train.py:PRESET --workdir=DIR`: train one dual encoder.

The run is a sweep of one replica (docs/training.md): DIR has a sweep's layout and
`bindjax extract --workdir=DIR` reads it. Resumes from the latest checkpoint when DIR already
holds this run (same config); a DIR holding a different run, or files that are not a bindjax
run, is refused unless --overwrite. Prints the final evaluation as JSON; exits 1 when the run
diverged (non-finite loss or parameters). Examples:

  bindjax train --config=experiments/train.py:smoke --workdir=/tmp/bindjax_train_smoke
  bindjax train --config=experiments/train.py:cpu --workdir=runs/train_cpu
  bindjax train --config=experiments/train.py:paper --workdir=runs/train_paper \
      --config.coverage=0.5 --config.seed=1
"""
import json

from bindjax.commands import flags as bj_flags
from bindjax.commands import sweep as sweep_command
from bindjax.workdir import results

SHOWN = (results.STEP, results.LOSS, results.object_accuracy(results.HELDOUT),
         results.concept_accuracy(results.HELDOUT), results.object_accuracy(results.TRAIN),
         results.concept_accuracy(results.TRAIN), results.USES_TRAINING_OBJECTS)


def main(argv):
  """Runs (or resumes) the training run; prints the final metrics as JSON. Returns 0."""
  _, final, _ = sweep_command.run(argv, single=True, description=__doc__)
  if final.get(results.DIVERGED):
    raise bj_flags.InputError(f"{argv[0]}: the run diverged: the update of step "
                              f"{final[results.DIVERGED_STEP]} was non-finite; its last finite "
                              "state is checkpointed")
  print(json.dumps({k: final[k] for k in SHOWN if k in final}, sort_keys=True))
  return 0
