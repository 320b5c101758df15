"""List-valued config fields: tuples in every config, read the same way everywhere.

ml_collections overrides a tuple field from the command line: `--config.seeds=0,1,2` gives
(0, 1, 2), and `--config.models=additive,product` gives the one-string tuple
('additive,product'); `names` splits such strings, so either spelling works.
"""


def names(value, field):
  """A tuple of non-empty stripped strings from a tuple/list of strings (each may be a comma
  list) or one comma-separated string; ValueError naming `field` otherwise."""
  parts = value if isinstance(value, (list, tuple)) else (value,)
  out = []
  for part in parts:
    if not isinstance(part, str):
      raise ValueError(f"{field}={value!r}: expected a tuple of names")
    out.extend(p.strip() for p in part.split(",") if p.strip())
  return tuple(out)


def numbers(value, field):
  """A non-empty tuple of floats from a tuple/list of numbers (or of strings of comma lists);
  ValueError naming `field` otherwise."""
  parts = value if isinstance(value, (list, tuple)) else (value,)
  out = []
  try:
    for part in parts:
      if isinstance(part, bool):
        raise ValueError
      out.extend([float(part)] if not isinstance(part, str) else
                 [float(p) for p in part.split(",") if p.strip()])
  except (TypeError, ValueError):
    raise ValueError(f"{field}={value!r}: expected a tuple of numbers") from None
  if not out:
    raise ValueError(f"{field}={value!r}: expected at least one number")
  return tuple(out)
