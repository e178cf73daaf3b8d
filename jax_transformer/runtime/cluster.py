"""Which job this process belongs to, as the machine says: JAX's own
cluster detection (``jax._src.clusters``), and the accelerators a process
takes on its host.

Every environment JAX 0.10 knows is asked, in JAX's order (Open MPI, SLURM,
GKE TPUs, GCE TPU VMs and queued resources through the metadata server,
Kubernetes; multi-slice through the Megascale variables), so a launch that
plain ``jax.distributed.initialize()`` would join, joins. Two things differ
from JAX's own defaults:

- a job of one process stays a single process (no distributed client);
- a launcher with several tasks per host (SLURM, Open MPI) is asked how many
  run on this host: with one task per node the process keeps every local
  accelerator, where JAX would give it the one numbered by its local rank.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

from jax._src import cloud_tpu_init, clusters

# JAX's variables for the coordinator, honoured as jax.distributed does.
_ADDRESS_VAR = 'JAX_COORDINATOR_ADDRESS'
_PORT_VAR = 'JAX_COORDINATOR_PORT'

# The variables a process's visible accelerators are listed in, first wins.
_VISIBLE_VARS = ('CUDA_VISIBLE_DEVICES', 'HIP_VISIBLE_DEVICES',
                 'ROCR_VISIBLE_DEVICES')


@dataclasses.dataclass(frozen=True)
class Plan:
  """How this process joins its job (the arguments of
  jax.distributed.initialize). local_device_ids: the accelerators it takes
  on its host, None for all it sees. source: 'flags' or the name of JAX's
  cluster environment (e.g. 'SlurmCluster')."""
  coordinator_address: str
  num_processes: int
  process_id: int
  local_device_ids: tuple[int, ...] | None
  source: str


def detect() -> type[clusters.ClusterEnv] | None:
  """JAX's cluster environment this process runs in, in JAX's order, or
  None (opt-in ones, such as mpi4py, are skipped as JAX skips them)."""
  for env in clusters.ClusterEnv._cluster_types:  # pylint: disable=protected-access
    if not env.opt_in_only_method and env.is_env_present():
      return env
  return None


def plan(coordinator_address: str | None = None,
         num_processes: int | None = None,
         process_id: int | None = None,
         timeout_s: int = 300,
         environ: Mapping[str, str] = os.environ) -> Plan | None:
  """How this process joins its job; None for a single process.

  Explicit arguments (train.py's flags, all three or none) win over the
  environment; otherwise the environment JAX detects says, and a job it
  counts as one process is None. timeout_s: how long JAX may wait for the
  coordinator's name to resolve (TPU VMs).
  """
  env = detect()
  launcher = _launcher(env)
  if coordinator_address is not None:
    return Plan(coordinator_address, num_processes, process_id,
                local_device_ids(environ, launcher), 'flags')
  if env is None:
    return None
  count = env.get_process_count()
  if count <= 1:
    return None
  address = environ.get(_ADDRESS_VAR) or env.get_coordinator_address(
      timeout_secs=timeout_s, override_coordinator_port=environ.get(_PORT_VAR))
  # JAX never narrows the devices of a TPU VM's process.
  ids = (None if cloud_tpu_init.running_in_cloud_tpu_vm
         else local_device_ids(environ, launcher))
  return Plan(address, count, env.get_process_id(), ids, env.__name__)


def _launcher(env) -> str | None:
  """'slurm' or 'ompi' for the launchers that run several tasks per host
  (the environments whose get_local_process_id JAX uses)."""
  return {'SlurmCluster': 'slurm', 'OmpiCluster': 'ompi'}.get(
      getattr(env, '__name__', None))


def local_device_ids(environ: Mapping[str, str],
                     launcher: str | None) -> tuple[int, ...] | None:
  """The accelerators this process takes on its host, as indices among
  those it sees; None for every one it sees.

  launcher: 'slurm' or 'ompi' (others start one process per host: None).
  One task on this host: None. Several: the task's share of the host's
  accelerators (its own one with one task per GPU, JAX's default), or None
  where the launcher already bound each task's accelerators (fewer visible
  than tasks on the host); where the count of tasks or accelerators is not
  told, JAX's default (the one numbered by the task's local rank).
  """
  if launcher == 'slurm':
    local, tasks = int(environ['SLURM_LOCALID']), slurm_tasks_on_node(environ)
  elif launcher == 'ompi':
    local = int(environ['OMPI_COMM_WORLD_LOCAL_RANK'])
    tasks = _int(environ.get('OMPI_COMM_WORLD_LOCAL_SIZE'))
  else:
    return None
  if tasks == 1:
    return None
  visible = _visible_count(environ)
  gpus = visible if visible is not None else _slurm_gpus(environ)
  if tasks is not None and gpus is not None:
    if gpus >= tasks and gpus % tasks == 0:
      share = gpus // tasks
      return tuple(range(local * share, (local + 1) * share))
    if visible is not None and visible < tasks:
      return None
  return (local,)


def slurm_tasks_on_node(environ: Mapping[str, str]) -> int | None:
  """How many tasks of this SLURM step run on this node, None if not told.

  From the step's (then the job's) tasks per node, e.g. '2(x3),1', at this
  node's index (SLURM_NODEID; not needed when every node runs as many),
  then SLURM_NTASKS_PER_NODE, then one per node when SLURM_NTASKS equals
  the step's nodes.
  """
  for name in ('SLURM_STEP_TASKS_PER_NODE', 'SLURM_TASKS_PER_NODE'):
    counts = _expand_counts(environ.get(name, ''))
    if not counts:
      continue
    node = _int(environ.get('SLURM_NODEID'))
    if node is not None and node < len(counts):
      return counts[node]
    if len(set(counts)) == 1:
      return counts[0]
  per_node = _int(environ.get('SLURM_NTASKS_PER_NODE'))
  if per_node is not None:
    return per_node
  tasks = _int(environ.get('SLURM_NTASKS'))
  nodes = _int(environ.get('SLURM_STEP_NUM_NODES') or
               environ.get('SLURM_NNODES'))
  if tasks is not None and tasks == nodes:
    return 1
  return None


def _expand_counts(text: str) -> list[int]:
  """SLURM's compressed counts: '2(x3),1' -> [2, 2, 2, 1]; [] if not such."""
  counts = []
  for item in filter(None, text.split(',')):
    match = re.fullmatch(r'\s*(\d+)(?:\(x(\d+)\))?\s*', item)
    if not match:
      return []
    counts += [int(match[1])] * int(match[2] or 1)
  return counts


def _visible_count(environ: Mapping[str, str]) -> int | None:
  """How many accelerators the launcher lets this process see, if it says."""
  for name in _VISIBLE_VARS:
    value = environ.get(name)
    if value is not None and value.strip():
      return len([d for d in value.split(',') if d.strip()])
  return None


def _slurm_gpus(environ: Mapping[str, str]) -> int | None:
  """The GPUs SLURM gave this job on this node, if it says."""
  count = _int(environ.get('SLURM_GPUS_ON_NODE'))
  if count is not None:
    return count
  for name in ('SLURM_STEP_GPUS', 'SLURM_JOB_GPUS'):
    if environ.get(name, '').strip():
      return len(environ[name].split(','))
  return None


def _int(value: str | None) -> int | None:
  try:
    return int(value)
  except (TypeError, ValueError):
    return None
