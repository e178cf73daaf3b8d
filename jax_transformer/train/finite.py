"""The finite check: training stops at a non-finite loss or gradient norm
(or after too many skipped updates) without saving the state it made.
"""

from __future__ import annotations

import numpy as np


def check_finite(metrics: dict, step: int, checkpointer,
                 max_skipped: int = 0) -> None:
  """Stops training at the first non-finite loss or gradient norm, or with
  max_skipped > 0 (optim.max_skipped_updates) once that many consecutive
  updates were skipped for one (``optim.skip_non_finite``).

  metrics: one step's (on the host); step: that step's number, counting
  from 1. Raises FloatingPointError naming the step and the checkpoint a
  rerun resumes from; the caller saves nothing after it.
  """
  if max_skipped:
    consecutive = int(metrics['consecutive_skips'])
    if consecutive < max_skipped:
      return
    problem = (f'The {consecutive} steps up to step {step} all had a '
               'non-finite loss or gradient norm and were skipped '
               f'(optim.max_skipped_updates={max_skipped}; '
               f'{int(metrics["skipped_updates"])} skipped since step 0)')
  else:
    values = {k: float(metrics[k]) for k in ('loss', 'grad_norm')}
    if all(np.isfinite(v) for v in values.values()):
      return
    problem = (f'Step {step} gave a non-finite loss sum or gradient norm '
               f'({values})')
  checkpointer.wait()
  last = checkpointer.latest_step()
  where = ('no checkpoint yet' if last is None
           else f'the last checkpoint is step {last}')
  raise FloatingPointError(
      f'{problem}; training stopped without saving it ({where}): lower '
      'optim.learning_rate or set optim.clip_norm, then rerun to resume.')


class FiniteCheck:
  """check_finite over every finished step, as a training hook (see
  hooks.py): steps are checked in order after each step's rows, and
  before any save, so no checkpoint holds a state a bad step made, while
  the row of the bad step is still written (it shows the values).
  """

  def __init__(self, checkpointer, max_skipped: int = 0):
    self._checkpointer = checkpointer
    self._max_skipped = max_skipped
    self._unchecked = []  # (step, host metrics)

  def finished(self, run, step: int, metrics: dict) -> None:
    del run
    self._unchecked.append((step, metrics))

  def after_step(self, run) -> None:
    del run
    unchecked, self._unchecked = self._unchecked, []
    for step, metrics in unchecked:
      check_finite(metrics, step, self._checkpointer, self._max_skipped)

  before_save = after_step
