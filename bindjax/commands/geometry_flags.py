"""Flags shared by the geometry commands (decompose, interventions, mds)."""
from absl import flags

from bindjax.commands import flags as flags_lib


def new_flag_values():
  """FlagValues with --config (geometry config), --workdir, --embeddings and --overwrite.

  Commands add their own flags before calling `parse`.
  """
  fv = flags_lib.new_flag_values(config_help="geometry config (experiments/geometry.py:ARG; "
                                 "default: the settings of docs/geometry.md)",
                                 workdir_help="output directory")
  flags.DEFINE_string("embeddings", None, "embedding set: native directory, reference folder "
                      "or TFDS dataset", flag_values=fv)
  flags_lib.define_overwrite(fv)
  return fv


def parse(fv, argv, description=None):
  """Parses argv into fv; --embeddings and --workdir are required (see `flags.parse`)."""
  flags_lib.parse(fv, argv, required=("embeddings", "workdir"), description=description,
                  default_config=_default_config)


def _default_config():
  from bindjax.frozen.geometry import config  # pylint: disable=g-import-not-at-top
  return config.default_config()
