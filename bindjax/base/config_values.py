"""Config fields read the same way everywhere: list values, and typed settings.

ml_collections overrides a tuple field from the command line: `--config.seeds=0,1,2` gives
(0, 1, 2), and `--config.models=additive,product` gives the one-string tuple
('additive,product'); `names` splits such strings, so either spelling works.

Typed settings (dataclasses) hold every default of the analyses; a command's ConfigDict is
spelled from them (`fields`) and read back into them (`pop_settings`, then `check_all_used`).
"""
import dataclasses


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


def fields(settings, prefix="", only=None, exclude=()):
  """{prefix + name: value} of the fields of the dataclass instance `settings` (those named in
  `only`, default all, less those in `exclude`): a config section spelled from typed settings,
  so each default stays where the dataclass holds it."""
  chosen = only or [f.name for f in dataclasses.fields(settings)]
  return {prefix + name: getattr(settings, name) for name in chosen if name not in exclude}


def pop_settings(cls, values, prefix="", **given):
  """An instance of the dataclass `cls` from the entries `prefix + field` of the dict `values`
  (removed from it) and the fields in `given`; fields in neither keep their defaults."""
  taken = {f.name: values.pop(prefix + f.name) for f in dataclasses.fields(cls)
           if f.name not in given and prefix + f.name in values}
  return cls(**taken, **given)


def check_all_used(values, section):
  """ValueError naming a field left in `values` (the rest of config section `section`, such as
  "config.mds.") that no setting took: a preset's misspelt field, say."""
  if values:
    raise ValueError(f"{section}{sorted(values)[0]}: not a setting; expected only the fields of "
                     "the command's default config")
