"""`bindjax report --workdir=DIR [--step=final|best|N] [--metric=accuracy|binding] [--out=OUT]`.

The phase-transition figure and ρ* table of a sweep (docs/training.md, "Critical coverage and
its interval"): one evaluation per replica (by default the last; "best", the step of highest
held-out accuracy, is chosen on the held-out objects and so optimistic; a number N, the last at
or before step N, reads the sweep as it stood then), a logistic fit of
held-out accuracy against coverage per seed and series, ρ* as the mean over seeds with a
Student t interval, and a scaling law over sizes. Writes OUT (default DIR/report):
phase_transition.png/.pdf, scaling_law.png/.pdf (two or more sizes), critical_coverage.md/.json,
points.json; a non-empty OUT is refused unless --overwrite. --workdir=A,B,... reports several
sweeps together (one per object-space size, say); --out is then required. --predict=N:C,...
adds each scaling law's ρ* at sizes not yet run (|O| = N with C concepts), with its range over
the same refits, to critical_coverage.md/.json. --pool makes one curve of sweeps that differ only
in their grids (coverages or seeds run later), refusing configs that differ elsewhere and a
coverage and seed held twice. --law_per_towers fits one scaling law per kind of towers (read-out,
width, learning rate, weight decay) and draws them in one figure.
"""
import os

from absl import flags

from bindjax.commands import flags as bj_flags
from bindjax.reporting import metrics
from bindjax.reporting import report
from bindjax.workdir import layout
from bindjax.workdir import results


def main(argv):
  """Writes DIR/report/{phase_transition.png,.pdf, critical_coverage.md,.json}; returns 0."""
  fv = bj_flags.new_flag_values(with_config=False, workdir_help="the `bindjax sweep` workdir to "
                                "report (A,B,... reports several together)")
  flags.DEFINE_string("step", results.DEFAULT_STEP,
                      "which evaluation per replica: final (the last), best (the best held-out "
                      "object accuracy, selected on held-out objects: optimistic), or a step "
                      "number N (the last at or before step N)", flag_values=fv)
  flags.DEFINE_integer("draws", 1000, "refits behind the scaling law's intervals",
                       flag_values=fv)
  flags.DEFINE_enum("metric", "accuracy", sorted(metrics.RHO_METRICS),
                    "held-out figure ρ* is read from: set-separation accuracy on max-object "
                    "scenes, or the binding figure", flag_values=fv)
  flags.DEFINE_string("out", None, "output directory (default WORKDIR/report)", flag_values=fv)
  flags.DEFINE_string("predict", "", "comma list of N:C, sizes |O| = N with C concepts at which "
                      "to predict ρ* from the scaling laws", flag_values=fv)
  flags.DEFINE_boolean("pool", False, "one curve per series across the listed sweeps, which "
                       "must differ only in their grids (default: a curve per sweep)",
                       flag_values=fv)
  flags.DEFINE_boolean("law_per_towers", False, "one scaling law per kind of towers (read-out, "
                       "width, learning rate, weight decay) instead of one over every series",
                       flag_values=fv)
  bj_flags.define_overwrite(fv)
  bj_flags.parse(fv, argv, required=("workdir",), description=__doc__)
  prog, workdirs = argv[0], fv["workdir"].value.split(",")
  if len(workdirs) > 1 and not fv["out"].value:
    raise bj_flags.UsageError(f"{prog}: --workdir lists {len(workdirs)} sweeps: --out is "
                              "required")
  out = fv["out"].value or os.fspath(layout.Workdir(workdirs[0]).report)
  if fv["draws"].value < 1:
    raise bj_flags.UsageError(f"{prog}: --draws={fv['draws'].value}: expected >= 1")
  predict_at = _sizes(prog, fv["predict"].value)
  try:
    step = results.parse_step(fv["step"].value)
  except ValueError:
    raise bj_flags.UsageError(f"{prog}: --step={fv['step'].value}: expected final, best or a step "
                              "number (an integer >= 0)") from None
  bj_flags.check_output_dir(prog, "out", out, fv["overwrite"].value)
  with bj_flags.input_errors(prog):
    summary = report.make_report(workdirs, step=step,
                                 num_draws=fv["draws"].value, out_dir=out,
                                 metric=fv["metric"].value, predict_at=predict_at,
                                 pool=fv["pool"].value,
                                 law_per_towers=fv["law_per_towers"].value)
  for row in summary["critical_coverage"]:
    rho = "–" if row["rho_star"] is None else f"{row['rho_star']:.3f}"
    interval = "" if not row["interval"] else " [{:.3f}, {:.3f}]".format(*row["interval"])
    print(f"{row['label']}: rho* = {rho}{interval} ({row['status']}, {row['num_seeds']} seeds, "
          f"{results.step_name(summary['step'])})")
  for group in summary["scaling_laws"] or [{"towers": None, "laws": summary["scaling_law"]}]:
    if group["laws"]:
      law = group["laws"][group["laws"]["best"]]
      print(f"scaling law{' of ' + group['towers'] if group['towers'] else ''}: "
            f"{law['formula']}, a={law['a']:.4g}, b={law['b']:.4g}, R2={law['r2']:.3f}")
  unfinished = ("" if summary["finished"] else
                f" (the sweep is unfinished: no {layout.DONE_FILE} yet, so this covers the "
                f"{summary['num_replicas']} replicas with rows so far)")
  print("wrote", ", ".join(summary["figures"]) + unfinished)
  return 0


def _sizes(prog, text):
  """[(N, C), ...] of --predict's comma list of N:C; a UsageError naming the bad entry."""
  sizes = []
  for entry in filter(None, text.split(",")):
    parts = entry.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
      raise bj_flags.UsageError(f"{prog}: --predict entry {entry!r}: expected N:C, two positive "
                                "integers (|O| and the number of concepts)")
    sizes.append((int(parts[0]), int(parts[1])))
  return sizes
