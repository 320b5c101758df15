"""Multi-process JAX jobs (docs/accelerators.md): joining one when a launcher started us, the
process that writes results, and agreement and barriers across processes.

Every process builds the same host arrays (the grid is deterministic) and places its own shards
(`bindjax.runtime.parallel`); only process 0 writes files (`is_writer`, then
`bindjax.base.files`).
"""
import logging
import os

import jax
import numpy as np
from jax.experimental import multihost_utils

# Environment variables whose presence means "started by a multi-host launcher".
_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_NTASKS")
_TPU_POD_VARS = ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


def detect_cluster(environ=None):
  """Names the multi-host environment we run in: "slurm", "tpu_pod", "env" or None.

  SLURM counts only with more than one task; a TPU VM only when it lists several worker hosts.
  "env" means the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables.
  This only decides whether to join: JAX's own detection, which `maybe_initialize_distributed`
  leaves the coordinator and process ids to, also takes a one-task SLURM job or a single-host
  TPU VM for a cluster, and has no public test for one.
  """
  env = os.environ if environ is None else environ
  if all(v in env for v in _SLURM_VARS) and int(env.get("SLURM_NTASKS", "1")) > 1:
    return "slurm"
  hosts = env.get("TPU_WORKER_HOSTNAMES", "")
  if len([h for h in hosts.split(",") if h.strip()]) > 1 or "MEGASCALE_COORDINATOR_ADDRESS" in env:
    return "tpu_pod"
  if env.get("JAX_COORDINATOR_ADDRESS"):
    return "env"
  return None


def maybe_initialize_distributed(coordinator_address=None, num_processes=None, process_id=None,
                                 local_device_ids=None, initialization_timeout=300,
                                 environ=None):
  """Joins a multi-process JAX job when there is one; returns True if distributed is on.

  Explicit arguments win (all three of coordinator_address, num_processes, process_id);
  otherwise SLURM with several tasks and multi-host TPU VMs are detected and JAX's own cluster
  detection fills in the details; "env" reads JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
  JAX_PROCESS_ID. Single-host runs return False without touching jax.distributed. Safe to call
  twice.
  """
  if jax.distributed.is_initialized():
    return True
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise ValueError(f"coordinator_address={coordinator_address!r}, num_processes="
                       f"{num_processes!r}, process_id={process_id!r}: give all three or none")
    if not 0 <= int(process_id) < int(num_processes):
      raise ValueError(f"process_id={process_id}: expected 0 ≤ id < num_processes={num_processes}")
    jax.distributed.initialize(coordinator_address, int(num_processes), int(process_id),
                               local_device_ids=local_device_ids,
                               initialization_timeout=initialization_timeout)
    return True
  env = os.environ if environ is None else environ
  cluster = detect_cluster(env)
  if cluster is None:
    return False
  if cluster == "env":
    jax.distributed.initialize(env["JAX_COORDINATOR_ADDRESS"], int(env["JAX_NUM_PROCESSES"]),
                               int(env["JAX_PROCESS_ID"]), local_device_ids=local_device_ids,
                               initialization_timeout=initialization_timeout)
  else:
    jax.distributed.initialize(local_device_ids=local_device_ids,
                               initialization_timeout=initialization_timeout)
  logging.info("jax.distributed on %s: process %d of %d, %d devices", cluster,
               jax.process_index(), jax.process_count(), jax.device_count())
  return True


def is_writer():
  """True on the process that writes results (process 0)."""
  return jax.process_index() == 0


def any_process(flag):
  """Whether `flag` is true on any process (`flag` itself on one process); every process must
  call it."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.asarray(multihost_utils.process_allgather(np.int32(bool(flag)))).any())


def sync(name):
  """Barrier across processes (no-op on one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)
