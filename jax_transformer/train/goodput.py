"""Where a run's wall time goes: start-up, compile, data waits, steps,
checkpoints and evaluation, per metrics row and for the whole start.

A :class:`Clock` charges every second to exactly one part: the part it
was last switched to (``switch``, or ``charged`` for a block), from the
process's start (interpreter and imports are start-up). What no part
claims (metrics rows, the progress bar) is 'other', so the parts add up
to the summary's wall time; what they cannot show is the process's exit
after the summary, which an outside clock (``time``) adds.

Goodput is the share of wall time spent in training steps. Across the
starts of one workdir (``across_starts``), a restart also loses its
start-up and compile, counted as 'restarts'.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator, Mapping

from jax_transformer import started
from jax_transformer.train import metrics

# The parts, in the order summaries list them. 'startup' is everything
# before the loop (data preparation, restore, state init) but compiles.
PARTS = ('startup', 'compile', 'data_wait', 'step', 'checkpoint', 'eval',
         'other')
ROW_PARTS = ('data_wait', 'step', 'checkpoint', 'eval')


def process_start_time() -> float:
  """When this program started, on the ``time.time()`` clock: the later of
  the process's fork (``/proc``) and the moment Python began running
  (``started.AT``), so that nothing a shell did before it exec'd Python
  counts as start-up."""
  try:
    with open(f'/proc/{os.getpid()}/stat') as f:
      ticks = int(f.read().rsplit(')', 1)[1].split()[19])
    with open('/proc/stat') as f:
      boot = next(int(line.split()[1]) for line in f
                  if line.startswith('btime'))
    forked = boot + ticks / os.sysconf('SC_CLK_TCK')
  except (OSError, ValueError, StopIteration):
    return started.AT  # no /proc
  return max(forked, started.AT)


class Clock:
  """Charges wall time to parts; starts in 'startup'."""

  def __init__(self, started: float | None = None):
    self.started = process_start_time() if started is None else started
    self.totals = dict.fromkeys(PARTS, 0.0)
    self._since_row = dict.fromkeys(PARTS, 0.0)
    self._part = 'startup'
    self._mark = time.time()
    # Time before this clock existed (interpreter and imports).
    self.totals['startup'] += max(0.0, self._mark - self.started)

  def switch(self, part: str) -> str:
    """Charges the time since the last switch to the current part, then
    makes ``part`` current; returns the part it replaced."""
    now = time.time()
    self.totals[self._part] += now - self._mark
    self._since_row[self._part] += now - self._mark
    self._mark, previous, self._part = now, self._part, part
    return previous

  @contextlib.contextmanager
  def charged(self, part: str) -> Iterator[None]:
    """Within, time goes to part; after, back to the part before."""
    previous = self.switch(part)
    try:
      yield
    finally:
      self.switch(previous)

  def since_row(self, *parts: str) -> float:
    """Seconds charged to parts since the last row, the current part's
    running time included."""
    running = time.time() - self._mark
    return sum(self._since_row[p] + (running if p == self._part else 0.0)
               for p in parts)

  def row(self) -> dict[str, float]:
    """``data_wait_s``, ``step_s``, ``checkpoint_s``, ``eval_s`` since the
    last row (for a metrics row)."""
    self.switch(self._part)
    out = {f'{p}_s': round(self._since_row[p], 6) for p in ROW_PARTS}
    self._since_row = dict.fromkeys(PARTS, 0.0)
    return out

  def summary(self) -> dict[str, float]:
    """Every part's total (``total_step_s``, ...), ``wall_s`` from the
    process's start, and ``goodput`` (step time over wall time)."""
    self.switch(self._part)
    wall = time.time() - self.started
    out = {f'total_{p}_s': round(t, 6) for p, t in self.totals.items()}
    out['wall_s'] = round(wall, 6)
    out['goodput'] = self.totals['step'] / wall if wall > 0 else 0.0
    return out


def describe(summary: Mapping[str, float]) -> str:
  """The summary as the one line a run ends with."""
  names = {'startup': 'start-up', 'compile': 'compile',
           'data_wait': 'data waits', 'step': 'steps',
           'checkpoint': 'checkpoints', 'eval': 'evaluation',
           'other': 'other', 'restarts': 'restarts'}
  parts = ', '.join(f'{names[p]} {summary[f"total_{p}_s"]:.1f} s'
                    for p in (*PARTS, 'restarts')
                    if f'total_{p}_s' in summary)
  return (f'Time: {summary["wall_s"]:.1f} s wall, goodput '
          f'{summary["goodput"]:.1%} ({parts}).')


def across_starts(summaries: list[Mapping[str, float]]) -> dict[str, float]:
  """One summary for every start of a workdir: parts and wall summed; the
  start-up and compile of every start after the first moved to
  'restarts' (time the first start would not have spent again)."""
  if not summaries:
    raise ValueError('no run summaries')
  out = {f'total_{p}_s': 0.0 for p in (*PARTS, 'restarts')}
  out['wall_s'] = 0.0
  for i, s in enumerate(summaries):
    for key in (*(f'total_{p}_s' for p in PARTS), 'wall_s'):
      out[key] += s.get(key, 0.0)
    if i:
      for part in ('startup', 'compile'):
        out['total_restarts_s'] += s.get(f'total_{part}_s', 0.0)
        out[f'total_{part}_s'] -= s.get(f'total_{part}_s', 0.0)
  out['goodput'] = (out['total_step_s'] / out['wall_s'] if out['wall_s']
                    else 0.0)
  out['starts'] = len(summaries)
  return out


class TimeParts:
  """The clock as a training hook (see train/hooks.py): the loop's own
  time is 'step' (hooks charge theirs to their parts); every metrics row
  gets the parts since the previous one; a start that did anything ends
  with a row of its totals and the summary line."""
  part = None  # it switches the clock itself

  def __init__(self, clock: Clock):
    self._clock = clock

  def start(self, run) -> None:
    del run
    self._clock.switch('step')

  def row(self, run, row: dict) -> None:
    del run
    row.update(self._clock.row())

  def completed(self, run) -> None:
    if run.step > run.start_step or run.row or run.stop:
      summary = self._clock.summary()
      _end_row(run.writer, run.workdir, run.step, summary)
      run.log(describe(summary))


def _end_row(writer, workdir, step: int, summary: Mapping[str, float]
             ) -> None:
  """The start's last metrics row: the last row logged so far again (a
  re-logged step replaces it, see metrics.read_history), with where the
  time went."""
  history = (metrics.read_history(workdir)
             if writer.enabled and workdir.metrics.exists() else [])
  row = dict(history[-1]) if history else {'step': step}
  writer.write(row.pop('step'), {**row, **summary})
