"""Multi-host start-up through jax.distributed, with a bound on every wait.

Three kinds of wait, three bounds (train.py flags, in seconds):

- joining the job: ``init``, for every process to connect;
- barriers and messages (``barrier``, ``receive``): ``barrier``, and
  ``data`` for the wait while process 0 prepares the dataset;
- collectives, which take no timeout: the heartbeat watchdog of
  ``liveness.py`` ends a process whose peer has been silent for
  ``heartbeat``.

A wait that runs out ends in one sentence naming what was awaited; a lost
process ends the others with exit status ``liveness.EXIT_LOST_PROCESS``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import threading

import jax
import numpy as np
from jax._src import distributed as jax_distributed
from jax.experimental import multihost_utils

from jax_transformer.runtime import cluster, liveness, xla_options


@dataclasses.dataclass(frozen=True)
class Timeouts:
  """Seconds a multi-process run waits before giving up.

  init: for every process to join. heartbeat: the silence after which a
  process counts as lost (a dead process is noticed within 7/6 of this).
  barrier: at a barrier, and in JAX's shutdown barrier at exit. data: while
  process 0 prepares the dataset; long, because building a large corpus
  and its tokenizer takes hours, while a dead process 0 is caught by the
  heartbeat and a failed one sends its error at once.
  """
  init: float = 300
  heartbeat: float = 60
  barrier: float = 300
  data: float = 6 * 3600

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if (isinstance(value, bool) or not isinstance(value, (int, float))
          or not value > 0 or not math.isfinite(value)):
        raise ValueError(f'--{field.name}_timeout must be a positive number '
                         f'of seconds, got {value!r}.')

  def jax_heartbeat(self) -> int:
    """JAX's own heartbeat timeout. When it expires, JAX's coordination
    service aborts every process with a native crash dump; it notices a
    silent process after half to all of this, the watchdog within 7/6 of
    ``heartbeat``, so 3x (and 10 s for small values) lets the watchdog
    speak first."""
    return math.ceil(3 * self.heartbeat + 10)


# The bounds this process runs with (set by initialize).
_timeouts = Timeouts()


def initialize(coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None,
               bounds: Timeouts | None = None) -> None:
  """Joins the multi-host job, if there is one.

  Explicit flags win; otherwise the job is what JAX's own cluster detection
  finds (TPU VMs through the metadata server, GKE, Megascale, SLURM, Open
  MPI, Kubernetes: see cluster.py); otherwise, or for a job of one
  process, this is a single process. bounds: the run's Timeouts (default:
  Timeouts()).
  """
  global _timeouts
  _timeouts = bounds or Timeouts()
  explicit = (coordinator_address, num_processes, process_id)
  if any(x is not None for x in explicit):
    if any(x is None for x in explicit):
      raise ValueError('Set all of --coordinator_address, --num_processes '
                       'and --process_id, or none of them.')
    if not 0 <= process_id < num_processes:
      raise ValueError(f'--process_id={process_id} is not in '
                       f'[0, {num_processes}).')
  # JAX's own bound on joining aborts with a crash dump: ours, shorter,
  # says what was awaited instead. It covers the detection too, which may
  # ask a metadata server or wait for the coordinator's name to resolve.
  joining = {'who': 'this process', 'where': ''}
  deadline = threading.Timer(_timeouts.init, lambda: liveness.exit_now(
      f'Not every process joined the job within {_timeouts.init:g} s '
      f'(--init_timeout), so {joining["who"]} stops: check that all of '
      f'them started, with the same --num_processes, and can reach the '
      f'coordinator{joining["where"]}.'))
  deadline.daemon = True
  deadline.start()
  try:
    job = cluster.plan(coordinator_address, num_processes, process_id,
                       timeout_s=math.ceil(_timeouts.init))
    if job is None:
      return
    joining.update(who=f'process {job.process_id} of {job.num_processes}',
                   where=f' at {job.coordinator_address}')
    if jax.config.jax_platforms in (None, '', 'cpu') or os.environ.get(
        'JAX_PLATFORMS', '') == 'cpu':
      # CPU processes need a collectives backend to talk to each other.
      jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    # Detection is done: JAX must not redo it (it would narrow a SLURM or
    # Open MPI process to one accelerator).
    jax.distributed.initialize(
        job.coordinator_address, job.num_processes, job.process_id,
        local_device_ids=job.local_device_ids,
        cluster_detection_method='deactivate',
        initialization_timeout=math.ceil(_timeouts.init) + 30,
        heartbeat_timeout_seconds=_timeouts.jax_heartbeat(),
        shutdown_timeout_seconds=math.ceil(_timeouts.barrier))
  finally:
    deadline.cancel()


def describe_job() -> str:
  """One line on the job this process is in, e.g. 'Job: 2 processes (this
  is 0), 1 cpu device each (cpu), 1 slice.'; on TPUs and GPUs it names
  the collective-overlap options in force too (``xla_options.describe``),
  e.g. '... 1 slice. XLA overlap: lhs, async-fusion, ... (LIBTPU_INIT_ARGS).'
  """
  devices = jax.devices()
  per_process = collections.Counter(d.process_index for d in devices)
  counts = sorted(set(per_process.values()))
  each = (str(counts[0]) if len(counts) == 1
          else f'{counts[0]} to {counts[-1]}')
  local = jax.local_devices()[0]
  slices = len({getattr(d, 'slice_index', 0) for d in devices})
  processes = jax.process_count()
  overlap = (f' {xla_options.describe(local.platform)}.'
             if xla_options.platform_of(local.platform) else '')
  return (f'Job: {_plural(processes, "process", "processes")} (this is '
          f'{jax.process_index()}), {each} {local.platform} '
          f'device{"" if counts[-1] == 1 else "s"} each '
          f'({local.device_kind}), {_plural(slices, "slice", "slices")}.'
          + overlap)


def _plural(count: int, one: str, many: str) -> str:
  return f'{count} {one if count == 1 else many}'


def barrier(name: str, kind: str = 'barrier') -> None:
  """Waits until every process reaches the barrier called name (nothing to
  do for one process), at most the run's ``kind`` timeout ('barrier' or
  'data'); past it, raises TimeoutError in every process that waited.
  """
  if jax.process_count() == 1:
    return
  seconds = getattr(_timeouts, kind)
  try:
    _client().wait_at_barrier(name, math.ceil(seconds * 1000))
  except jax.errors.JaxRuntimeError as err:
    _raise_if_late(err, f'Not every process reached the barrier {name!r} '
                   f'within {seconds:g} s (--{kind}_timeout)',
                   "the others' logs say where they are")
    raise


# Where send and receive keep their values in the key-value store.
_MESSAGES = 'jax_transformer/message/'


def send(name: str, value: str) -> None:
  """Tells the other processes value under name (see receive); once per
  name and run."""
  if jax.process_count() > 1:
    _client().key_value_set(_MESSAGES + name, value)


def receive(name: str, kind: str = 'barrier') -> str:
  """What another process sent under name, waiting for it at most the
  run's ``kind`` timeout; past it, raises TimeoutError.

  Unlike a barrier, the sender can say that it failed, so that the others
  stop at once with its reason instead of waiting out the bound.
  """
  seconds = getattr(_timeouts, kind)
  try:
    return _client().blocking_key_value_get(_MESSAGES + name,
                                            math.ceil(seconds * 1000))
  except jax.errors.JaxRuntimeError as err:
    _raise_if_late(err, f'No process sent {name!r} within {seconds:g} s '
                   f'(--{kind}_timeout)', "the sender's log says why")
    raise


def everywhere(ok: bool) -> bool:
  """Whether ok holds on every process: the same answer on all (a
  collective: every process calls it at the same point)."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def all_passed(name: str, failure: str | None = None) -> None:
  """Every process reports how its own check called name went (failure:
  None, or why it failed); where the check passed, raises RuntimeError
  naming the first process whose check failed, so that every process stops
  at once instead of the others waiting at their next barrier. A process
  whose check failed raises its own error after calling this.
  """
  if jax.process_count() == 1:
    return
  me = jax.process_index()
  send(f'{name}/{me}', failure or 'ok')
  if failure:
    return
  for process in range(jax.process_count()):
    outcome = 'ok' if process == me else receive(f'{name}/{process}')
    if outcome != 'ok':
      raise RuntimeError(f'Process {process} failed {name!r} ({outcome}), so '
                         f'process {me} of {jax.process_count()} stops too.')


def _client():
  """JAX's distributed runtime client (jax.distributed has no public
  accessor; the pinned JAX range keeps this attribute)."""
  return jax_distributed.global_state.client


def _raise_if_late(err: Exception, what: str, where: str) -> None:
  """Turns a wait past its bound into one sentence (other errors pass)."""
  if 'DEADLINE_EXCEEDED' in str(err):
    raise TimeoutError(
        f'{what}, so process {jax.process_index()} of {jax.process_count()} '
        f'stops: {where}.') from err


def watch(checkpoint_dir: str) -> liveness.Watchdog | None:
  """Starts this process's heartbeat watchdog (None for one process).

  checkpoint_dir: where the run's checkpoints are, to name the newest one
  when a lost process stops the run. Call .stop() on the result when the
  run ends normally.
  """
  if jax.process_count() == 1:
    return None
  return liveness.Watchdog(_client(), jax.process_index(), jax.process_count(),
                           _timeouts.heartbeat, checkpoint_dir)
