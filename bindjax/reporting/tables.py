"""The report's ρ* table, scaling laws and per-coverage curves as Markdown
(critical_coverage.md)."""
from bindjax.reporting import metrics
from bindjax.reporting import statistics
from bindjax.workdir import results

STEP_WORDS = {"final": "final step, no selection on held-out objects",
              "best": "best step, chosen on held-out objects themselves (optimistic)"}
STATUS_WORDS = {"fit": "fit", "above": "above 0.5 at every coverage",
                "below": "never reaches 0.5", "too_few": "fewer than 2 coverages"}
# Per-coverage columns of the Markdown table: (metric, header).
TABLE_METRICS = ((metrics.BINDING_METRIC, "held-out {K}-object accuracy"),
                 (results.binding(results.HELDOUT), "held-out binding"),
                 (results.object_accuracy(results.TRAIN, results.ROW_K),
                  "training {K}-object accuracy"))


def _number(x, digits=3):
  return "–" if x is None else f"{x:.{digits}f}"


def _escape(text):
  return text.replace("|", "\\|")  # |O| must not split the Markdown cells


def _rho_rows(table):
  lines = [f"| series | \\|O\\| | seeds | ρ* | {statistics.LEVEL:.0%} interval (t over seeds) | "
           "per-seed ρ* | slope | status |",
           "|---|---:|---:|---:|---|---|---:|---|"]
  for row in table:
    interval = ("–" if not row["interval"] else
                f"[{row['interval'][0]:.3f}, {row['interval'][1]:.3f}]")
    per_seed = " ".join(_number(v) for v in row["seed_rho_stars"].values())
    status = STATUS_WORDS[row["status"]]
    if row["censored_seeds"] and row["status"] == "fit":
      status += f"; seed(s) {', '.join(row['censored_seeds'])} never cross 0.5: no interval"
    lines.append(f"| {_escape(row['label'])} | {row[results.SPACE_SIZE]:,} | {row['num_seeds']} | "
                 f"{_number(row['rho_star'])} | {interval} | {per_seed} | "
                 f"{_number(row['slope'], 1)} | {status} |")
  return lines


def _coverage_rows(s):
  k = s["key"][results.MAX_OBJECTS]
  headers = [h.format(K=k) for _, h in TABLE_METRICS]
  lines = [f"### {_escape(s['label'])}", "",
           "Values per seed, in the order of the seeds column.", "",
           "| coverage | held-out objects | seeds | step | " + " | ".join(headers) + " |",
           "|---:|---:|---|---|" + "---|" * len(headers)]
  for p in s["points"]:
    cells = []
    for metric, _ in TABLE_METRICS:
      m = p.get(metric)
      if m is None or m["mean"] is None:
        cells.append("–")
        continue
      values = " ".join(_number(v) for v in m["values"])
      cells.append(f"{values} (mean {_number(m['mean'])})")
    heldout = ", ".join(map(str, p["heldout_objects"])) or "–"
    if not p.get("fitted", True):
      heldout += " (≤ K: not fitted)"
    steps = ", ".join(map(str, sorted(set(p["steps"]))))
    seeds = " ".join(map(str, p["seeds"]))
    lines.append(f"| {p['coverage']:g} | {heldout} | {seeds} | {steps} | "
                 + " | ".join(cells) + " |")
  return lines


def _law_lines(laws):
  if not laws:
    return ["Scaling law: needs ρ* at three or more object-space sizes."]
  lines = [f"Scaling law over {laws['num_points']} sizes (best: {laws['best']}):", ""]
  for name in ("power_law", "log_linear"):
    law = laws[name]
    a, b = f"{law['a']:.4g}", f"{law['b']:.4g}"
    if "a_interval" in law:
      a += " [{:.4g}, {:.4g}]".format(*law["a_interval"])
      b += " [{:.4g}, {:.4g}]".format(*law["b_interval"])
    lines.append(f"- {name}: `{law['formula']}`, a = {a}, b = {b}, R² = {law['r2']:.3f}")
  if "concept_log_linear" in laws:
    law = laws["concept_log_linear"]
    values = [f"{k} = {law[k]:.4g}" + (" [{:.4g}, {:.4g}]".format(*law[f"{k}_interval"])
                                      if f"{k}_interval" in law else "") for k in "abc"]
    fit = ("passes through every point" if law["residual_dof"] == 0 else
           f"R² = {law['r2']:.3f}, {law['residual_dof']} residual degrees of freedom")
    lines.append(f"- concept_log_linear: `{law['formula']}`, {', '.join(values)} ({fit}); "
                 "c ≠ 0 means C moves ρ* beyond |O| = V^C")
  if "num_draws" in laws:
    lines += ["", f"Intervals: {statistics.LEVEL:.0%} of {laws['num_draws']} refits with every "
              "size's ρ* drawn from its own t distribution."]
  if laws.get("predictions"):
    names = [k for k in ("power_law", "log_linear", "concept_log_linear")
             if k in laws["predictions"][0]]
    lines += ["", "Predicted ρ* at sizes not in the fit (95% range over the same refits):", "",
              "| \\|O\\| | C | " + " | ".join(names) + " |",
              "|---:|---:|" + "---|" * len(names)]
    for p in laws["predictions"]:
      cells = [f"{p[k]['rho_star']:.3f} [{p[k]['range'][0]:.3f}, {p[k]['range'][1]:.3f}]"
               for k in names]
      lines.append(f"| {p[results.SPACE_SIZE]:,} | {p[results.NUM_CONCEPTS]} | "
                   + " | ".join(cells) + " |")
  return lines


def _step_words(step):
  return (STEP_WORDS.get(step) or
          f"the last evaluation at or before step {step:,}, no selection on held-out objects")


def markdown_table(table, laws, step, metric="accuracy", series=()):
  """The ρ* table, the scaling law and (given `series`) per-coverage tables, as Markdown.

  `laws`: one set of scaling laws (`statistics.fit_scaling_laws`, or None), or the groups of
  `report.make_report`'s scaling laws, each with its label. `metric` names the figure ρ* is read from.
  """
  what = {"accuracy": "held-out set-separation accuracy on max-object scenes",
          "binding": "held-out binding figure on two-object scenes"}[metric]
  ks = sorted({row[results.MAX_OBJECTS] for row in table})
  name = metrics.RHO_METRICS[metric].replace(results.ROW_K, "/".join(map(str, ks)))
  lines = [f"# Critical coverage ρ* ({_step_words(step)}; {what} (`{name}`), "
           f"crossing {statistics.THRESHOLD})", ""]
  lines += _rho_rows(table) + [""]
  groups = laws if isinstance(laws, list) else [(None, None, laws)]
  for label, _, group_laws in groups:
    lines += ([f"### Scaling law of {label}", ""] if label else []) + _law_lines(group_laws) + [""]
  if series:
    lines += ["## Per coverage", ""]
    for s in series:
      lines += _coverage_rows(s) + [""]
  return "\n".join(lines)
