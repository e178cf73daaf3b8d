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

import dataclasses
import math
import os
import threading

import jax
from jax._src import distributed as jax_distributed

from jax_transformer.runtime import liveness

# Environment variables that mean "this is one process of a cluster job"
# that jax.distributed.initialize() can configure by itself.
_CLUSTER_ENV = ('SLURM_NTASKS', 'TPU_WORKER_HOSTNAMES',
                'MEGASCALE_COORDINATOR_ADDRESS', 'OMPI_COMM_WORLD_SIZE')


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


def _in_cluster() -> bool:
  if int(os.environ.get('SLURM_NTASKS', '1')) > 1:
    return True
  return any(os.environ.get(k) for k in _CLUSTER_ENV[1:])


def initialize(coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None,
               bounds: Timeouts | None = None) -> None:
  """Joins the multi-host job, if there is one.

  Explicit flags win; otherwise TPU pods, SLURM and Open MPI jobs are
  detected from the environment; otherwise this is a single process.
  bounds: the run's Timeouts (default: Timeouts()).
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
  elif not _in_cluster():
    return
  if jax.config.jax_platforms in (None, '', 'cpu') or os.environ.get(
      'JAX_PLATFORMS', '') == 'cpu':
    # CPU processes need a collectives backend to talk to each other.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  # JAX's own bound on joining aborts with a crash dump: ours, shorter,
  # says what was awaited instead.
  where = f' at {coordinator_address}' if coordinator_address else ''
  who = ('this process' if process_id is None
         else f'process {process_id} of {num_processes}')
  deadline = threading.Timer(_timeouts.init, liveness.exit_now, args=(
      f'Not every process joined the job within {_timeouts.init:g} s '
      f'(--init_timeout), so {who} stops: check that all of them started, '
      f'with the same --num_processes, and can reach the coordinator{where}.',
  ))
  deadline.daemon = True
  deadline.start()
  try:
    jax.distributed.initialize(
        coordinator_address, num_processes, process_id,
        initialization_timeout=math.ceil(_timeouts.init) + 30,
        heartbeat_timeout_seconds=_timeouts.jax_heartbeat(),
        shutdown_timeout_seconds=math.ceil(_timeouts.barrier))
  finally:
    deadline.cancel()


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
