"""The probe analysis of an embedding set (docs/probes.md) and its files: split the scenes, fit
`bindjax.frozen.probes.linear` probes on the training scenes, score both sides; probes.npz and
probe_metrics.json as `bindjax probe` writes them, and reading them back.
"""
import dataclasses
import io
import os
import zipfile

import jax.numpy as jnp
import numpy as np

from bindjax.base import errors
from bindjax.base import files
from bindjax.base import progress as progress_lib
from bindjax.frozen.probes import linear


PROBES_FILE = "probes.npz"
METRICS_FILE = "probe_metrics.json"


def write_probes(probes, metrics, workdir):
  """Writes workdir/probes.npz and workdir/probe_metrics.json atomically; returns their paths."""
  buffer = io.BytesIO()
  np.savez(buffer, **probes)
  probes_path = os.path.join(workdir, PROBES_FILE)
  metrics_path = os.path.join(workdir, METRICS_FILE)
  files.write_atomic(probes_path, buffer.getvalue())
  files.write_json(metrics_path, files.to_jsonable(metrics), indent=1)
  return probes_path, metrics_path


def run(config, embeddings_path, workdir, progress=True):
  """`bindjax probe`: fits the probes of `config` on the set at `embeddings_path` and writes
  workdir/probes.npz and probe_metrics.json. Returns (metrics, probes path, metrics path).

  A bad setting raises errors.ConfigError before the set is read; unreadable input ValueError.
  """
  from bindjax.frozen import embeddings  # pylint: disable=g-import-not-at-top
  with errors.config_errors():
    config = config.validate()
  embedding_set = embeddings.read_embeddings(embeddings_path)
  probes, metrics = run_probes(embedding_set, config, progress=progress)
  metrics["embeddings"] = os.path.abspath(embeddings_path)
  return (metrics,) + write_probes(probes, metrics, workdir)


def read_probes_file(path):
  """Probe vectors of a probes.npz as `bindjax probe` writes it ({head name: [Q, D] array}).

  Raises ValueError naming the file when it is missing or not an npz of arrays.
  """
  try:
    with np.load(path, allow_pickle=False) as f:
      return {k: f[k] for k in f.files}
  except (OSError, ValueError, zipfile.BadZipFile, AttributeError) as e:
    raise ValueError(f"probes file {path}: expected a probes.npz written by `bindjax probe` "
                     f"({type(e).__name__}: {e})") from None


def weights_from_file(path, values_per_concept):
  """ProbeWeights (dot scoring) of a probes.npz; ValueError naming the file on a bad file."""
  try:
    return linear.probes_to_weights(read_probes_file(path), values_per_concept)
  except ValueError as e:
    raise ValueError(f"probes file {path}: {e}" if str(path) not in str(e) else str(e)) from None


def probe_rows(embedding_set, scenes=linear.ProbeConfig.scenes):
  """Indices of the scenes `run_probes` splits: all of them, or the 2-object scenes alone
  ("two-object"); ValueError when that leaves fewer than 2."""
  if scenes not in linear.SCENES:
    raise ValueError(f"scenes={scenes!r}: expected one of {linear.SCENES}")
  rows = (np.arange(embedding_set.num_scenes) if scenes == "all"
          else embedding_set.two_object_rows())
  if rows.size < 2:
    raise ValueError(f"scenes={scenes!r}: the set has {rows.size} such scenes; a probe split "
                     "needs at least 2")
  return rows


def run_probes(embedding_set, config=linear.ProbeConfig(), progress=False):
  """The probe analysis of an EmbeddingSet (docs/probes.md): split, fit, score train and test.

  config.scenes picks the scenes that are split (the permutation runs over them, in set order);
  labels and object ids are the whole set's, so the stored probes fit any scene of the set.

  progress: show a progress bar (steps, rate, ETA, training loss) on stderr while fitting.

  Returns (probes dict in EmbeddingSet naming, metrics dict of JSON-ready values).
  """
  config.validate()
  labels = linear.labels_from_set(embedding_set)
  n = embedding_set.embeddings.shape[0]
  rows = probe_rows(embedding_set, config.scenes)
  train_rows, test_rows = linear.scene_split(len(rows), config.seed, config.train_fraction)
  train_mask = linear.rows_to_mask(rows[train_rows], n)
  test_mask = linear.rows_to_mask(rows[test_rows], n)
  bar, on_chunk = progress_lib.loss_bar(config.steps, "step", progress)
  try:
    weights, losses = linear.fit_probes(embedding_set.embeddings, labels, train_mask, config,
                                        on_chunk)
  finally:
    bar.close()
  z = jnp.asarray(embedding_set.embeddings, jnp.float32)
  train_scores = linear.score_embeddings(weights, z, labels, train_mask, config.similarity)
  test_scores = linear.score_embeddings(weights, z, labels, test_mask, config.similarity)
  metrics = {
      "train": linear.to_python(train_scores),
      "test": linear.to_python(test_scores),
      "final_train_loss": float(losses[-1]),
      "scenes": config.scenes,
      "num_scenes": len(rows),
      "num_train_scenes": int(train_mask.sum()),
      "num_test_scenes": int(test_mask.sum()),
      "config": dataclasses.asdict(config),
  }
  if config.similarity == "cosine":
    metrics["log_temperature"] = np.asarray(weights.log_temperature_H).tolist()
  probes = linear.weights_to_probes(weights, tuple(embedding_set.values_per_concept),
                                    config.similarity)
  return probes, metrics
