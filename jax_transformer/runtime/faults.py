"""Faults on purpose at named points of a run, for the soak test and the
tests of what a run does when it is stopped or stuck there.

A point is reached by the trainer as ``faults.reached(PHASE, STEP)``; the
environment variable ``JAX_TRANSFORMER_FAULT='ACTION@PHASE:STEP'`` makes the
first arrival at that point act, once per process:

* ACTION ``SIGTERM``, ``SIGINT`` or ``SIGKILL``: sends this process the
  signal (a Python handler runs before ``reached`` returns);
* ACTION ``stall``: blocks this thread for good (a stuck reader).

PHASE is one of PHASES: ``data`` (before the batch of STEP is read),
``compile`` (before the train step compiles, STEP being the first step this
start runs), ``step`` (STEP dispatched, not finished), ``eval`` (between
the batches of STEP's evaluation) and ``save`` (STEP's checkpoint save
started). Unset, ``reached`` costs one attribute read.

Its effect is timed by the program, not by the clock, so a test that kills
a run during its last evaluation does so however fast the machine is.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import NamedTuple

from jax_transformer.errors import UsageError

ENV = 'JAX_TRANSFORMER_FAULT'
PHASES = ('data', 'compile', 'step', 'eval', 'save')
ACTIONS = ('SIGTERM', 'SIGINT', 'SIGKILL', 'stall')


class Fault(NamedTuple):
  action: str
  phase: str
  step: int

  def __str__(self):
    return f'{self.action}@{self.phase}:{self.step}'


def parse(text: str) -> Fault:
  """'ACTION@PHASE:STEP' as a Fault; UsageError in one sentence."""
  action, _, where = text.partition('@')
  phase, _, step = where.partition(':')
  if action not in ACTIONS or phase not in PHASES or not step.isdigit():
    raise UsageError(f'{ENV}={text!r} must read ACTION@PHASE:STEP with '
                     f'ACTION one of {", ".join(ACTIONS)} and PHASE one of '
                     f'{", ".join(PHASES)}, e.g. SIGTERM@eval:8.')
  return Fault(action, phase, int(step))


_planned = parse(os.environ[ENV]) if os.environ.get(ENV) else None


def reached(phase: str, step: int) -> None:
  """Acts once if this is the planned point (see the module docstring)."""
  global _planned  # pylint: disable=global-statement
  if _planned is None or (_planned.phase, _planned.step) != (phase, step):
    return
  action, _planned = _planned.action, None  # once: a second SIGTERM kills
  if action == 'stall':
    threading.Event().wait()
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
