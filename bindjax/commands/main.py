"""`bindjax <command> [flags]`: dispatches to bindjax.commands.<command>.main(argv)."""
import importlib
import sys
import warnings

# Command name -> module under bindjax.commands; imported lazily so `bindjax --help` is instant.
COMMANDS = {
    "train": "train",
    "sweep": "sweep",
    "report": "report",
    "import": "import_embeddings",
    "probe": "probe",
    "complexity": "complexity",
    "decompose": "decompose",
    "interventions": "interventions",
    "interventions-table": "interventions_table",
    "mds": "mds",
    "extract": "extract",
    "binding": "binding",
}

# Commands that resume where a killed run stopped; the others start again.
RESUMABLE = ("train", "sweep")
# The exit status of a command stopped by Ctrl-C (SIGINT), as shells report it: 128 + 2.
INTERRUPTED = 130

_USAGE = """usage: bindjax <command> [--flags]

commands:
  train               train one dual encoder   (--config=experiments/train.py:smoke --workdir=DIR)
  sweep               coverage sweep, replicas vmapped and sharded \
(--config=experiments/coverage_sweep.py:smoke --workdir=DIR)
  report              phase-transition figure and table from a sweep workdir (--workdir=DIR)
  import              convert a folder written by the original PyTorch code to bindjax's format
  probe               linear concept/object probes on an embedding set (--embeddings=DIR)
  complexity          binding-function approximators (--config=experiments/complexity.py:ARG)
  decompose           additive decomposition and subtraction suite
  interventions       object-replacement interventions
  interventions-table collect intervention summaries into Markdown and LaTeX tables
  mds                 MDS geometry of quadruples
  extract             trained dual encoder -> embedding set \
(--workdir=RUN [--replica=N] --objects=all|train|held-out)
  binding             approximators fitted to every replica of a sweep vs its held-out accuracy \
(--workdir=SWEEP --config=experiments/binding.py:ARG)

`bindjax <command> --help` lists a command's flags."""


def main(argv=None):
  """Entry point of the `bindjax` console command."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ("-h", "--help", "help"):
    print(_USAGE)
    return 0
  name = argv[0]
  if name not in COMMANDS:
    print(f"bindjax: unknown command {name!r}; expected one of {', '.join(COMMANDS)}",
          file=sys.stderr)
    return 2
  from bindjax.base import progress  # pylint: disable=g-import-not-at-top
  from bindjax.frozen.compat import safe_pickle  # pylint: disable=g-import-not-at-top
  progress.forget()
  try:
    module = importlib.import_module(f"bindjax.commands.{COMMANDS[name]}")
    with warnings.catch_warnings():
      warnings.showwarning = _one_line_warning(f"bindjax {name}", warnings.showwarning)
      return module.main([f"bindjax {name}"] + argv[1:]) or 0
  except safe_pickle.RefusedGlobalError as e:
    # Bad input like any other: refused before anything from the file ran or was written.
    print(f"bindjax {name}: {e}", file=sys.stderr)
    return 1
  except KeyboardInterrupt:
    # The run's own cleanup (rows flushed, checkpoints closed) has run on the way out.
    print(f"bindjax {name}: {interrupted_line(name)}", file=sys.stderr)
    return INTERRUPTED


def interrupted_line(name):
  """What `bindjax NAME` stopped by Ctrl-C says: how far it got and how to go on."""
  from bindjax.base import progress  # pylint: disable=g-import-not-at-top
  where = progress.position()
  at = "interrupted" if where is None else "interrupted at {2} {0:,} of {1:,}".format(*where)
  if name in RESUMABLE:
    return f"{at}; run the same command to resume"
  return f"{at}; run the same command with --overwrite to start again"


def _one_line_warning(prog, show_others):
  """A warnings.showwarning that prints bindjax's own warnings (a torn results line) as
  "PROG: warning: MESSAGE" on one line to stderr and passes others to `show_others`."""
  from bindjax.base import files  # pylint: disable=g-import-not-at-top

  def show(message, category, filename, lineno, file=None, line=None):
    if issubclass(category, files.TornLineWarning):
      print(f"{prog}: warning: {message}", file=file or sys.stderr)
    else:
      show_others(message, category, filename, lineno, file, line)
  return show


if __name__ == "__main__":
  sys.exit(main())
