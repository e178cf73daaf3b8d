"""Faults on purpose at named points of a run, for the soak test and the
tests of what a run does when it is stopped or stuck there.

A point is reached by the trainer as ``faults.reached(PHASE, STEP)``; the
environment variable ``JAX_TRANSFORMER_FAULT='ACTION@PHASE:STEP'`` makes the
first arrival at that point act, once per process:

* ACTION ``SIGTERM``, ``SIGINT`` or ``SIGKILL``: sends this process the
  signal (a Python handler runs before ``reached`` returns);
* ACTION ``stall``: blocks this thread for good (a stuck reader);
* ACTION ``sleepN``: blocks this thread for N seconds (a host slow to save
  or to read), then goes on.

PHASE is one of PHASES: ``prepare`` (before the run prepares its data,
STEP 0), ``data`` (before the batch of STEP is read),
``compile`` (before the train step compiles, STEP being the first step this
start runs), ``step`` (STEP dispatched, not finished), ``eval`` (between
the batches of STEP's evaluation), ``save`` (STEP's checkpoint save
started) and ``exit`` (on the way out, after JAX's shutdown barrier: the
moment one process of a job may outlive the others). STEP ``*`` is the
first arrival at PHASE whatever the step (the save of a stop, whose step no
test knows in advance). With ``JAX_TRANSFORMER_FAULT_PROCESS=I`` only
process I of a multi-process run acts (one task of a SLURM job made slow to
exit). Unset, ``reached`` costs one attribute read.

Its effect is timed by the program, not by the clock, so a test that kills
a run during its last evaluation does so however fast the machine is.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
from typing import NamedTuple

import jax

from jax_transformer.errors import UsageError

ENV = 'JAX_TRANSFORMER_FAULT'
PROCESS_ENV = 'JAX_TRANSFORMER_FAULT_PROCESS'
PHASES = ('prepare', 'data', 'compile', 'step', 'eval', 'save', 'exit')
ACTIONS = ('SIGTERM', 'SIGINT', 'SIGKILL', 'stall', 'sleepN')


class Fault(NamedTuple):
  action: str
  phase: str
  step: int | None  # None: any step

  def __str__(self):
    return f'{self.action}@{self.phase}:{"*" if self.step is None else self.step}'


def _known(action: str) -> bool:
  if action.startswith('sleep'):
    return action[len('sleep'):].isdigit()
  return action in ACTIONS


def parse(text: str) -> Fault:
  """'ACTION@PHASE:STEP' as a Fault; UsageError in one sentence."""
  action, _, where = text.partition('@')
  phase, _, step = where.partition(':')
  if not _known(action) or phase not in PHASES or not (
      step.isdigit() or step == '*'):
    raise UsageError(f'{ENV}={text!r} must read ACTION@PHASE:STEP with '
                     f'ACTION one of {", ".join(ACTIONS)} and PHASE one of '
                     f'{", ".join(PHASES)}, STEP a number or *, e.g. '
                     'SIGTERM@eval:8.')
  return Fault(action, phase, None if step == '*' else int(step))


_planned = parse(os.environ[ENV]) if os.environ.get(ENV) else None


def _exiting() -> None:
  jax.distributed.shutdown()  # its barrier first, whoever registered last
  reached('exit', 0)


if _planned is not None and _planned.phase == 'exit':
  atexit.register(_exiting)


_process = None  # this process's index, read while the job is up


def _this_process_acts() -> bool:
  wanted = os.environ.get(PROCESS_ENV)
  return wanted is None or str(_process) == wanted


def reached(phase: str, step: int) -> None:
  """Acts once if this is the planned point (see the module docstring)."""
  global _planned, _process  # pylint: disable=global-statement
  if _planned is None:
    return
  if _process is None and phase != 'exit':
    _process = jax.process_index()  # after JAX's shutdown it reads 0
  if _planned.phase != phase or (
      _planned.step not in (None, step)):
    return
  action, _planned = _planned.action, None  # once: a second SIGTERM kills
  if not _this_process_acts():
    return
  if action == 'stall':
    threading.Event().wait()
  elif action.startswith('sleep'):
    time.sleep(int(action[len('sleep'):]))
  else:
    os.kill(os.getpid(), getattr(signal, action))


class FaultPoints:
  """The points above as a training hook (see train/hooks.py): each moment
  of the loop that has a PHASE reaches it."""

  def before_step(self, run) -> None:
    reached('data', run.step + 1)

  def compiling(self, run) -> None:
    reached('compile', run.step + 1)

  def dispatched(self, run, metrics) -> None:
    del metrics
    reached('step', run.step)

  def evaluating(self, run, at: int) -> None:
    del run
    reached('eval', at)

  def saved(self, run) -> None:
    reached('save', run.step)
