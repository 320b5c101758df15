"""Summaries of repeated timings, shared by the benchmark scripts beside this file."""
import json
import os

import numpy as np


def stats(x):
  """Median, min, max and the values of repeated measurements `x`."""
  return {"median": float(np.median(x)), "min": float(np.min(x)), "max": float(np.max(x)),
          "values": [float(v) for v in x]}


def fmt(summary, digits=1):
  """'median (min–max)' of a `stats` summary."""
  return (f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}–"
          f"{summary['max']:.{digits}f})")


def write_table(out, result, text):
  """Prints the Markdown `text` and writes it to OUT.md, and `result` to OUT.json."""
  print(text)
  os.makedirs(os.path.dirname(out), exist_ok=True)
  with open(out + ".json", "w") as f:
    json.dump(result, f, indent=2)
  with open(out + ".md", "w") as f:
    f.write(text)
