"""Multi-host start-up through jax.distributed."""

from __future__ import annotations

import os

import jax

# Environment variables that mean "this is one process of a cluster job"
# that jax.distributed.initialize() can configure by itself.
_CLUSTER_ENV = ('SLURM_NTASKS', 'TPU_WORKER_HOSTNAMES',
                'MEGASCALE_COORDINATOR_ADDRESS', 'OMPI_COMM_WORLD_SIZE')


def _in_cluster() -> bool:
  if int(os.environ.get('SLURM_NTASKS', '1')) > 1:
    return True
  return any(os.environ.get(k) for k in _CLUSTER_ENV[1:])


def initialize(coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Joins the multi-host job, if there is one.

  Explicit flags win; otherwise TPU pods, SLURM and Open MPI jobs are
  detected from the environment; otherwise this is a single process.
  """
  explicit = (coordinator_address, num_processes, process_id)
  if any(x is not None for x in explicit):
    if any(x is None for x in explicit):
      raise ValueError('Set all of --coordinator_address, --num_processes '
                       'and --process_id, or none of them.')
    if not 0 <= process_id < num_processes:
      raise ValueError(f'--process_id={process_id} is not in '
                       f'[0, {num_processes}).')
  elif not _in_cluster():
    return
  if jax.config.jax_platforms in (None, '', 'cpu') or os.environ.get(
      'JAX_PLATFORMS', '') == 'cpu':
    # CPU processes need a collectives backend to talk to each other.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address, num_processes, process_id)
