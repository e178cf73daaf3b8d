"""Stop signals: SIGTERM or SIGINT (Ctrl-C) make a run save and stop.

A preempted machine, a scheduler's cancel or a user's Ctrl-C gets a saved
checkpoint at the next step and an exit status that says "unfinished"
(``runtime.exits.EXIT_INTERRUPTED``), never a lost run.
"""

from __future__ import annotations

import os
import signal

import jax
import numpy as np
from jax.experimental import multihost_utils

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Processes compare their flags every this many steps (a collective).
AGREE_EVERY = 10


class Preemption:
  """Turns SIGTERM and SIGINT into a flag the run checks after each step.

  A training hook (see hooks.py): after a step it sets ``run.stop`` when a
  signal asked (every process at the same step); after the save that
  follows it says so; at the end it puts the previous handlers back.
  """

  def __init__(self):
    self.requested = None  # the name of the signal that asked to stop
    self._previous = {s: signal.signal(s, self._handle)
                      for s in STOP_SIGNALS}

  def _handle(self, signum, frame):
    del frame
    if self.requested:
      # A second signal ends a process that cannot reach its next step.
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
    self.requested = signal.Signals(signum).name

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
