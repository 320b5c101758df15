"""`bindjax interventions-table --summaries=RUN1,RUN2,... --workdir=OUT [--strength=1]`.

Collects interventions summaries (run directories or summary JSON files) into one Markdown and
one LaTeX table, rows dataset × model, columns bank: OUT/interventions_table.{md,tex}
(docs/geometry.md#interventions).
"""
import os

from absl import flags

from bindjax.commands import flags as flags_lib


def main(argv):
  """Runs the command; returns 0 (errors exit with the statuses of bindjax.commands.flags)."""
  fv = flags_lib.new_flag_values(with_config=False, workdir_help="output directory for the tables")
  flags.DEFINE_list("summaries", None, "interventions run directories or summary JSON files",
                    flag_values=fv)
  flags.DEFINE_float("strength", None, "edit strength k to tabulate (default: each run's first)",
                     flag_values=fv)
  flags.DEFINE_enum("metric", "retrieval", ["retrieval", "retrieval_order_insensitive", "probe"],
                    "value in each cell", flag_values=fv)
  flags.DEFINE_enum("group", "all", ["all", "shared_attribute", "different_attribute"],
                    "cases tabulated", flag_values=fv)
  flags_lib.define_overwrite(fv)
  flags_lib.parse(fv, argv, required=("summaries", "workdir"), description=__doc__)
  prog, workdir = argv[0], fv["workdir"].value
  flags_lib.check_output_dir(prog, "workdir", workdir, fv["overwrite"].value)
  from bindjax.base import files  # pylint: disable=g-import-not-at-top
  from bindjax.frozen.geometry import interventions  # pylint: disable=g-import-not-at-top
  with flags_lib.input_errors(prog):
    summaries = [interventions.load_summary(p) for p in fv["summaries"].value]
  with flags_lib.usage_errors(prog):   # --strength that a run does not have
    markdown, latex = interventions.summary_table(summaries, fv["strength"].value,
                                                  fv["metric"].value, fv["group"].value)
  paths = [os.path.join(workdir, "interventions_table.md"),
           os.path.join(workdir, "interventions_table.tex")]
  files.write_atomic(paths[0], markdown)
  files.write_atomic(paths[1], latex)
  print(markdown, end="")
  print(f"wrote {paths[0]} and {paths[1]}")
  return 0
