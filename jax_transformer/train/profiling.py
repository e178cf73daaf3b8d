"""``jax.profiler`` traces of chosen training steps, planned or on demand.

Planned: ``config.profile.start_step=N`` and ``config.profile.num_steps=M``
trace steps N to N+M-1. On demand: a file named ``PROFILE`` in the workdir
(its text, if a number, the steps to trace; else DEMAND_STEPS) makes a
running trainer trace its next steps; the file is removed once the trace is
written. Each trace is a run of its own under WORKDIR/tensorboard/
(``steps_12-14/plugins/profile/<time>/``), where TensorBoard's profile
plugin finds it (``*.xplane.pb``) and Perfetto opens the
``*.trace.json.gz`` beside it.
"""

from __future__ import annotations

import os

import jax

from jax_transformer.experiment import ProfileConfig
from jax_transformer.runtime.workdir import WorkdirPaths

DEMAND_FILE = 'PROFILE'
DEMAND_STEPS = 5
# Checked for every this many steps: a stat of the workdir is cheap, but a
# workdir in object storage is not.
DEMAND_EVERY = 10


class Profiler:
  """Starts and stops traces around steps; process 0's only on demand.

  A training hook (see hooks.py): ``launching``, ``dispatched``,
  ``after_step``, ``end``.
  """

  def __init__(self, profile: ProfileConfig, workdir: WorkdirPaths,
               main: bool):
    self._first_planned = profile.start_step
    self._planned_count = profile.num_steps
    self._dir = os.fspath(workdir.tensorboard)
    self._demand = os.path.join(os.fspath(workdir.root), DEMAND_FILE)
    self._main = main
    self._until = None  # the last step of the trace under way
    self._outputs = None  # the last step's, to wait for at a trace's end
    self.written: list[tuple[int, int]] = []  # (first, last) step traced

  def launching(self, run) -> None:
    self.start_at(run.step + 1)

  def dispatched(self, run, metrics) -> None:
    del run
    self._outputs = metrics

  def after_step(self, run) -> None:
    if self.stop_after(run.step, self._outputs):
      first, last = self.written[-1]
      run.log(f'Wrote a profile of steps {first} to {last} under '
              f'{self._dir}.')

  def end(self, run) -> None:
    del run
    self.stop()

  def start_at(self, step: int) -> None:
    """Starts a trace if step (1-based, about to run) is where one begins."""
    if self._until is not None:
      return
    count = 0
    if self._planned_count and step == self._first_planned:
      count = self._planned_count
    elif step % DEMAND_EVERY == 0 or step == 1:
      count = self._demanded()
    if count:
      self._first, self._until = step, step + count - 1
      jax.profiler.start_trace(os.path.join(
          self._dir, f'steps_{step}-{self._until}'))

  def stop_after(self, step: int, outputs) -> bool:
    """Ends the trace after its last step (waiting for outputs, so the
    trace holds the step's device work). True when a trace was written."""
    if self._until is None or step < self._until:
      return False
    jax.block_until_ready(outputs)
    self.stop()
    return True

  def stop(self) -> None:
    """Ends a trace under way (the run ended inside it)."""
    if self._until is None:
      return
    jax.profiler.stop_trace()
    self.written.append((self._first, self._until))
    self._until = None
    if self._main and os.path.exists(self._demand):
      os.remove(self._demand)

  def _demanded(self) -> int:
    """Steps the PROFILE file asks for, or 0 when there is none."""
    try:
      with open(self._demand) as f:
        text = f.read().strip()
    except OSError:
      return 0
    return int(text) if text.isdigit() and int(text) > 0 else DEMAND_STEPS
