"""`bindjax report --workdir=DIR [--step=best|final] [--metric=accuracy|binding] [--out=OUT]`.

The phase-transition figure and ρ* table of a sweep (docs/training.md#sweeps): one evaluation
per replica (best held-out object accuracy, or the last), averaged over seeds, with a logistic
fit of held-out accuracy against coverage per series. Writes OUT (default DIR/report):
phase_transition.png/.pdf, critical_coverage.md/.json, points.json; a non-empty OUT is refused
unless --overwrite.
"""
import os

from absl import flags

from bindjax import report
from bindjax import results
from bindjax.commands import flags as bj_flags


def main(argv):
  """Writes DIR/report/{phase_transition.png,.pdf, critical_coverage.md,.json}; returns 0."""
  fv = bj_flags.new_flag_values(with_config=False)
  flags.DEFINE_enum("step", "best", ["best", "final"],
                    "which evaluation per replica: best held-out object accuracy or the last",
                    flag_values=fv)
  flags.DEFINE_integer("bootstrap", 1000, "bootstrap resamples over seeds for the ρ* interval",
                       flag_values=fv)
  flags.DEFINE_enum("metric", "accuracy", sorted(report.RHO_METRICS),
                    "held-out figure ρ* is read from: set-separation accuracy on max-object "
                    "scenes, or the binding figure", flag_values=fv)
  flags.DEFINE_string("out", None, "output directory (default WORKDIR/report)", flag_values=fv)
  bj_flags.define_overwrite(fv)
  bj_flags.parse(fv, argv, required=("workdir",), description=__doc__)
  prog, workdir = argv[0], fv["workdir"].value
  out = fv["out"].value or os.path.join(workdir, results.REPORT_DIR)
  if fv["bootstrap"].value < 1:
    raise bj_flags.UsageError(f"{prog}: --bootstrap={fv['bootstrap'].value}: expected >= 1")
  bj_flags.check_output_dir(prog, "out", out, fv["overwrite"].value)
  with bj_flags.input_errors(prog):
    summary = report.make_report(workdir, step=fv["step"].value,
                                 num_bootstrap=fv["bootstrap"].value, out_dir=out,
                                 metric=fv["metric"].value)
  for row in summary["critical_coverage"]:
    rho = "–" if row["rho_star"] is None else f"{row['rho_star']:.3f}"
    print(f"{row['label']}: rho* = {rho} ({row['status']}, {row['num_seeds']} seeds)")
  if summary["scaling_law"]:
    law = summary["scaling_law"][summary["scaling_law"]["best"]]
    print(f"scaling law: {law['formula']}, a={law['a']:.4g}, b={law['b']:.4g}, R2={law['r2']:.3f}")
  unfinished = ("" if summary["finished"] else
                f" (the sweep is unfinished: no {results.DONE_FILE} yet, so this covers the "
                f"{summary['num_replicas']} replicas with rows so far)")
  print("wrote", ", ".join(summary["figures"]) + unfinished)
  return 0
