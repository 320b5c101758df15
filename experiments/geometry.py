"""Geometry of frozen embeddings: additive decomposition, interventions, MDS (docs/geometry.md).

  bindjax decompose --embeddings=tests/data/clevr_text --workdir=runs/clevr_text/decompose \
      --config=experiments/geometry.py:cpu
  bindjax interventions --embeddings=tests/data/clevr_text \
      --workdir=runs/clevr_text/interventions --config=experiments/geometry.py:cpu \
      --config.interventions.strengths=1,2
  bindjax mds --embeddings=tests/data/clevr_text --workdir=runs/clevr_text/mds \
      --config=experiments/geometry.py:smoke --quadruple=red,blue,cube,sphere
  bindjax interventions-table --summaries=runs/clevr_text/interventions,runs/other/interventions \
      --workdir=runs/tables

Presets: smoke (seconds, reduced fit/probe steps), cpu (3,000 steps), paper (10,000 steps).
"""
from bindjax.geometry import config as geometry_config


def get_config(arg="paper"):
  return geometry_config.get_config(arg or "paper")
