"""Ends a run that is alive but stuck.

The heartbeats of liveness.py notice a process that is gone; a process that
is there but makes no progress (a collective that never returns because
another host hangs, a reader blocked on a stalled filesystem) would wait
forever. Here a daemon thread watches the time since the trainer last
reported progress (a step finished, an evaluation batch, a checkpoint
save). When it passes the limit (``config.step_timeout_s``) the thread
prints the stack of every thread of the process, then one line, and ends
the process with EXIT_STUCK, so that a restart loop starts it again.

Compiling reports nothing for minutes on a large model: the trainer pauses
the watch around it (``paused()``). Unset, the limit is automatic: the
longest interval seen between two reports of this start, times
AUTO_FACTOR, and never below AUTO_FLOOR_S, so evaluations and checkpoint
saves of the run's own size fit easily.
"""

from __future__ import annotations

import contextlib
import faulthandler
import sys
import threading
import time
from typing import Callable, Iterator

from jax_transformer.runtime import liveness
from jax_transformer.runtime.exits import EXIT_STUCK

AUTO_FLOOR_S = 600.0
AUTO_FACTOR = 20.0


class Progress:
  """When progress was last reported, and the limit it is judged by.

  Bookkeeping only, over times passed in, so that tests need no waiting.
  limit: seconds, or None for automatic (see the module docstring).
  """

  def __init__(self, limit: float | None, now: float):
    self.explicit = limit
    self._last = now
    self._longest = 0.0
    self._pauses = 0

  @property
  def limit(self) -> float:
    if self.explicit is not None:
      return self.explicit
    return max(AUTO_FLOOR_S, AUTO_FACTOR * self._longest)

  def report(self, now: float) -> None:
    if not self._pauses:
      self._longest = max(self._longest, now - self._last)
    self._last = now

  def pause(self) -> None:
    self._pauses += 1

  def resume(self, now: float) -> None:
    self._pauses -= 1
    self._last = now  # the paused time is not silence

  def overdue(self, now: float) -> float | None:
    """Seconds without progress when over the limit, else None."""
    silent = now - self._last
    if self._pauses or silent <= self.limit:
      return None
    return silent


class StallWatch:
  """The watching thread over a Progress; ``report()`` from the loop.

  limit 0: off (no thread; the calls do nothing that matters). exit_fn(
  message, status) ends the process (tests pass their own).
  """

  def __init__(self, limit: float | None, checkpoint_dir: str,
               exit_fn: Callable[[str, int], None] = liveness.exit_now,
               clock: Callable[[], float] = time.monotonic,
               poll: float | None = None):
    self._clock = clock
    self._checkpoint_dir = checkpoint_dir
    self._exit_fn = exit_fn
    self._lock = threading.Lock()
    self._progress = Progress(limit, clock())
    self._stopped = threading.Event()
    # Several looks per limit: the overrun is noticed within a tenth of it.
    self._poll = poll or min(1.0, (limit or AUTO_FLOOR_S) / 10)
    self._thread = None
    if limit != 0:
      self._thread = threading.Thread(target=self._watch, daemon=True,
                                      name='stall-watch')
      self._thread.start()

  def report(self) -> None:
    """Something finished: a step, an evaluation batch, a save."""
    with self._lock:
      self._progress.report(self._clock())

  @contextlib.contextmanager
  def paused(self) -> Iterator[None]:
    """No judging inside (compiling)."""
    with self._lock:
      self._progress.pause()
    try:
      yield
    finally:
      with self._lock:
        self._progress.resume(self._clock())

  # As a training hook (see train/hooks.py): progress is a finished step,
  # an evaluation batch or a started save; compiling is not watched.

  def finished(self, run, step, metrics) -> None:
    del run, step, metrics
    self.report()

  def evaluating(self, run, at) -> None:
    del run, at
    self.report()

  def saved(self, run) -> None:
    del run
    self.report()

  def compiling(self, run) -> None:
    del run
    with self._lock:
      self._progress.pause()

  def compiled(self, run) -> None:
    del run
    with self._lock:
      self._progress.resume(self._clock())

  def end(self, run) -> None:
    del run
    self.stop()

  def stop(self) -> None:
    self._stopped.set()
    if self._thread is not None:
      self._thread.join(timeout=self._poll * 2)

  def _watch(self) -> None:
    while not self._stopped.wait(self._poll):
      with self._lock:
        silent = self._progress.overdue(self._clock())
        limit = self._progress.limit
        explicit = self._progress.explicit is not None
      if silent is not None and not self._stopped.is_set():
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        self._exit_fn(self._message(silent, limit, explicit), EXIT_STUCK)
        return

  def _message(self, silent: float, limit: float, explicit: bool) -> str:
    how = ('config.step_timeout_s' if explicit
           else 'the automatic config.step_timeout_s')
    return (f'No training step finished for {silent:.0f} s ({how}={limit:g}); '
            'the stacks of all threads are above. Stopping with exit status '
            f'{EXIT_STUCK}: {liveness.resume_hint(self._checkpoint_dir)}.')

