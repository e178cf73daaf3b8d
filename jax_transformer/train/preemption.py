"""Stop signals: SIGTERM or SIGINT (Ctrl-C) make a run save and stop.

A preempted machine, a scheduler's cancel or a user's Ctrl-C gets a saved
checkpoint at the next step and an exit status that says "unfinished"
(``runtime.exits.EXIT_INTERRUPTED``), never a lost run. Before the first
step of a start (preparing the data, reading the first batch) there is
nothing new to save and no step to wait for: the signal ends the run at
once (``StoppedBeforeFirstStep``; train.py says so in one line).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Processes compare their flags every this many steps (a collective).
AGREE_EVERY = 10
STARTING = 'preparing the data and the model'
FIRST_BATCH = 'reading the first batch'


class StoppedBeforeFirstStep(KeyboardInterrupt):
  """A stop signal before the first step of this start: nothing new to
  save, so the run stopped at once."""

  def __init__(self, signal_name: str, during: str):
    super().__init__(f'{signal_name} while {during}, before the first step: '
                     'stopped with nothing new to save; rerun to go on.')


class Preemption:
  """Turns SIGTERM and SIGINT into a flag the run checks after each step.

  A training hook (see hooks.py): after a step it sets ``run.stop`` when a
  signal asked (every process at the same step); after the save that
  follows it says so; at the end it puts the previous handlers back.
  Made before the run's data is prepared, it stops the run at once
  (``StoppedBeforeFirstStep``) while ``at_once`` names what the run is
  doing: until the trainer clears it (with the run's state made), and
  again while the first step waits for its batch.
  """

  def __init__(self, at_once: str | None = STARTING):
    self.requested = None  # the name of the signal that asked to stop
    self.at_once = at_once
    self._lost = False  # the stop's exception was swallowed: raise again
    self._previous = {s: signal.signal(s, self._handle)
                      for s in STOP_SIGNALS}
    self._previous_unraisable = sys.unraisablehook
    sys.unraisablehook = self._unraisable

  def _handle(self, signum, frame):
    del frame
    if self.requested and not self._lost:
      # A second signal ends a process that cannot reach its next step.
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
    self._lost = False
    self.requested = signal.Signals(signum).name
    if self.at_once:
      raise StoppedBeforeFirstStep(self.requested, self.at_once)

  def _unraisable(self, unraisable) -> None:
    """The handler's exception, raised where Python only reports one (a
    garbage collector's callback, JAX's among them, or a __del__), is
    signalled again a moment later from another thread, so that it is
    raised in the code that runs then rather than printed and lost."""
    if (isinstance(unraisable.exc_value, StoppedBeforeFirstStep)
        and self.requested):
      self._lost = True
      again = threading.Timer(0.01, os.kill, (
          os.getpid(), signal.Signals[self.requested]))
      again.daemon = True
      again.start()
      return
    self._previous_unraisable(unraisable)

  def check(self) -> None:
    """Raises StoppedBeforeFirstStep where a signal asked to stop at once
    and its exception is still to be raised."""
    if self.requested and self.at_once:
      raise StoppedBeforeFirstStep(self.requested, self.at_once)

  def start(self, run) -> None:
    # After a first evaluation (which stops between its batches): the first
    # batch, which may be long in coming, is waited for next.
    if not self.requested and not run.last:
      self.at_once = FIRST_BATCH

  def should_stop(self, step: int, every: int = AGREE_EVERY) -> bool:
    if jax.process_count() == 1:
      return bool(self.requested)
    # Every process must stop at the same step; agreeing costs a collective,
    # so hosts compare flags every few steps only.
    if step % every:
      return False
    flags = multihost_utils.process_allgather(np.array(bool(self.requested)))
    return bool(np.any(flags))

  @property
  def reason(self) -> str:
    """Why a run stops: this process's signal, else another's."""
    return self.requested or 'another host'

  def after_step(self, run) -> None:
    if run.stop is None and self.should_stop(run.step):
      run.stop = self.reason

  def saved(self, run) -> None:
    if run.stop is not None:
      run.log(f'\n{run.stop}: saved step {run.step}; exiting to resume '
              'later.')

  def end(self, run) -> None:
    del run
    self.restore()

  def restore(self) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    if sys.unraisablehook == self._unraisable:
      sys.unraisablehook = self._previous_unraisable


class FirstBatchRead:
  """The end of a Preemption's stop at once: the first step's batch is
  read when the step compiles (or, compiled, launches). A hook placed
  before all others, so that a stop at any of those moments (a fault
  point's included) waits for the step and its save, as after it."""

  def __init__(self, stop: Preemption):
    self._stop = stop

  def compiling(self, run) -> None:
    del run
    self._stop.at_once = None

  launching = compiling
