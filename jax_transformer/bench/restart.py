"""Restart to first step: a cold start, a warm start and a restart after
one of two processes was SIGKILLed, for each of two shapes (SHAPES):

* ``default``: the default job, ``train.py --config lm_shakespeare``, one
  CPU device a process;
* ``lm_350m``: ``lm_350m``'s model (24 scanned layers of width 1024, remat,
  FSDP; about 303M parameters at the plays' byte vocabulary) on the offline
  plays (its ``shakespeare`` preset), four CPU host devices a process, so
  8 devices in all, in float32 with 8 rows of 64 tokens (the full
  recipe's 16 x 256 bf16 tokens are 8 times a step's 22-25 s on 2 cores).

Every start is two processes on 127.0.0.1 (gloo), sharing one persistent
compilation cache (``--compilation_cache_dir``) and, for the restart, the
local tier (``config.local_checkpoint_dir``, one directory per process).
What is timed is the trainer's own line (``train/first_step.py``): from
each process's start to its first finished step, split into start-up,
restore, data iterator and compile (cache hit or miss). Process 0's line
is the row.

* cold: a fresh workdir and an empty cache;
* warm: a fresh workdir, the cache the cold start filled;
* restart: a run whose process 1 is SIGKILLed as step KILL_AT is dispatched
  (no handler runs, nothing is saved), process 0 ended too, then both
  restarted: they resume from the local tier.

A start is ended (SIGKILL) once its line is printed: the figures are
about getting back to work, not the steps after.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import NamedTuple

from jax_transformer.bench.timing import load_average
from jax_transformer.train import first_step

KILL_AT = 7
FLAGS = ('--config.num_steps=1000', '--config.checkpoint_every=4',
         '--config.log_every=1', '--config.eval_every=1000',
         '--config.sample.enabled=False', '--heartbeat_timeout=10')
WAIT_S = 1800.0


class Shape(NamedTuple):
  """One run the suite restarts: its config flags and CPU devices a
  process."""
  flags: tuple[str, ...]
  devices_per_process: int


SHAPES = {
    'default': Shape(('--config', 'lm_shakespeare'), 1),
    'lm_350m': Shape(('--config', 'lm_350m:shakespeare',
                      '--config.model.dtype=float32', '--config.seq_len=64',
                      '--config.batch_size=8', '--config.eval_batch_size=8'),
                     4),
}


def _port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class Job:
  """Two train.py processes of one run, their output read as it comes."""

  def __init__(self, shape: Shape, work: str, cache: str,
               env: dict | None = None):
    address = f'127.0.0.1:{_port()}'
    self.lines = [[], []]
    self.procs = []
    devices = ('--xla_force_host_platform_device_count='
               f'{shape.devices_per_process}')
    env = dict(os.environ, **(env or {}),
               XLA_FLAGS=f'{os.environ.get("XLA_FLAGS", "")} {devices}')
    for i in range(2):
      local = os.path.join(work, f'host{i}')
      cmd = [sys.executable, '-u', 'train.py', *shape.flags, *FLAGS,
             '--workdir', os.path.join(work, 'run'),
             f'--compilation_cache_dir={cache}',
             f'--config.local_checkpoint_dir={local}',
             '--config.local_checkpoint_every=2',
             f'--coordinator_address={address}', '--num_processes=2',
             f'--process_id={i}']
      proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=env)
      self.procs.append(proc)
      threading.Thread(target=self._read, args=(proc, self.lines[i]),
                       daemon=True).start()

  @staticmethod
  def _read(proc, lines):
    for line in proc.stdout:
      lines.append(line)

  def first_step(self, process: int = 0) -> dict:
    """A process's first-step figures, once printed."""
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
      found = first_step.parse(''.join(self.lines[process]))
      if found:
        return found
      if self.procs[process].poll() is not None:
        break
      time.sleep(0.5)
    raise RuntimeError(f'no first-step line from process {process}:\n' +
                       ''.join(self.lines[process])[-3000:])

  def wait(self, timeout: float) -> list[int | None]:
    """Exit statuses after at most timeout seconds (None: still running)."""
    deadline = time.time() + timeout
    for proc in self.procs:
      try:
        proc.wait(max(deadline - time.time(), 0.1))
      except subprocess.TimeoutExpired:
        pass
    return [proc.poll() for proc in self.procs]

  def kill(self) -> None:
    for proc in self.procs:
      proc.kill()
      proc.wait()


def _start(name: str, kind: str, work: str, cache: str) -> dict:
  job = Job(SHAPES[name], work, cache)
  try:
    found = job.first_step()
    other = job.first_step(1)
  finally:
    job.kill()
  # Process 1's compile: JAX writes the persistent cache from process 0
  # only, so a cold start's process 1 reads nothing back from it.
  return {'suite': 'restart', 'shape': name, 'start': kind, **found,
          'process_1_compile_s': other['compile_s'],
          'process_1_cache': other['cache'], 'load_average': load_average()}


def _killed(name: str, work: str, cache: str) -> list[int | None]:
  """The run whose process 1 dies at KILL_AT; ends once both have."""
  job = Job(SHAPES[name], work, cache, env={'JAX_TRANSFORMER_FAULT':
                              f'SIGKILL@step:{KILL_AT}',
                              'JAX_TRANSFORMER_FAULT_PROCESS': '1'})
  try:
    # Process 0 notices the lost process within --heartbeat_timeout.
    return job.wait(WAIT_S)
  finally:
    job.kill()


def run(shapes: tuple[str, ...] = tuple(SHAPES)):
  """Per shape: the three rows, then one with the ratios."""
  for name in shapes:
    yield from _rows(name)


def _rows(name: str):
  with tempfile.TemporaryDirectory(prefix='restart_bench_') as root:
    cache = os.path.join(root, 'xla_cache')
    cold = _start(name, 'cold', os.path.join(root, 'cold'), cache)
    yield cold
    warm = _start(name, 'warm', os.path.join(root, 'warm'), cache)
    yield warm
    statuses = _killed(name, os.path.join(root, 'killed'), cache)
    restart = _start(name, 'restart', os.path.join(root, 'killed'), cache)
    # Steps up to KILL_AT - 1 had finished; the restart's first step is
    # the one after the step it resumed from.
    yield dict(restart, killed_statuses=statuses,
               steps_lost=KILL_AT - restart['first_step'])
    yield {'suite': 'restart', 'shape': name, 'start': 'ratios',
           'restart_over_warm': round(restart['to_first_step_s'] /
                                      warm['to_first_step_s'], 3),
           'restart_compile_over_cold': round(
               restart['compile_s'] / max(cold['compile_s'], 1e-9), 3),
           # What the cache can save: XLA's compile (tracing and lowering
           # run again in any start).
           'restart_xla_over_cold': round(
               restart['xla_s'] / max(cold['xla_s'], 1e-9), 3),
           'load_average': load_average()}
