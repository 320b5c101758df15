"""`bindjax complexity --config=experiments/complexity.py:ARG --workdir=DIR`.

Fits the binding-function approximators of SPEC §11 over a grid of train fractions, seeds and
learning rates (one jit(vmap) per approximator shape, sharded over all devices) and writes
DIR/results.csv, DIR/results.json and DIR/complexity.png.
"""
import sys

from absl import flags

from bindjax.commands import flags as flags_lib


def main(argv):
  """Runs the command; returns the exit code."""
  fv = flags_lib.new_flag_values(config_help="complexity config (experiments/complexity.py:ARG)")
  flags.DEFINE_bool("progress", True, "show a progress bar", flag_values=fv)
  flags_lib.parse(fv, argv, required=("config", "workdir"))
  from bindjax.complexity import analysis  # pylint: disable=g-import-not-at-top
  try:
    analysis.run(fv["config"].value, fv["workdir"].value, progress=fv["progress"].value)
  except (ValueError, FileExistsError) as e:
    print(f"{argv[0]}: {e}", file=sys.stderr)
    return 1
  print(f"wrote {fv['workdir'].value}/results.csv, results.json and complexity.png")
  return 0
