"""Restart to first step: where a start's seconds went until its first
step finished, in one line, e.g.

  First step (9) finished 21.4 s after the process started: start-up
  14.2 s, restore 0.9 s, data iterator 0.6 s, compile 3.1 s (cache hit;
  XLA 0.2 s), other processes 2.0 s, step 0.6 s.

start-up is the interpreter, imports, JAX's start, the data preparation
and the model's state; restore is reading the checkpoint (either tier);
data iterator is making it, setting its saved position and waiting for the
first batch; compile is the train step's (tracing, lowering and XLA's
part), with what JAX's persistent compilation cache
(``--compilation_cache_dir``) did for it, told by JAX's own monitoring
events: 'cache hit' (read from the cache), 'cache miss' (compiled and
written to it), 'not cached' (compiled, too quick for the cache's
threshold or no cache dir set), and XLA's part alone (the backend compile,
or reading it from the cache: all that the cache can save); other
processes is the wait for the slowest host's compile (and the memory
check); step is the first step itself. ``scripts/benchmark.py --suite
restart`` reads the line.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Iterator

import jax

HIT = '/jax/compilation_cache/cache_hits'
MISS = '/jax/compilation_cache/cache_misses'
# Around the backend compile or the cache read (jax/_src/dispatch.py).
BACKEND = '/jax/core/compile/backend_compile_duration'
PREFIX = 'First step ('


class CacheEvents:
  """Counts JAX's compilation-cache hits and misses from the moment it is
  made (a monitoring listener: JAX has no way to ask after the fact)."""

  def __init__(self):
    self.counts = {HIT: 0, MISS: 0, BACKEND: 0.0}
    jax.monitoring.register_event_listener(self._heard)
    jax.monitoring.register_event_duration_secs_listener(self._timed)

  def _heard(self, event: str, **kwargs) -> None:
    del kwargs
    if event in self.counts:
      self.counts[event] += 1

  def _timed(self, event: str, seconds: float, **kwargs) -> None:
    del kwargs
    if event == BACKEND:
      self.counts[BACKEND] += seconds

  def backend_s(self, before: dict[str, float]) -> float:
    """Seconds in XLA's compile or the cache's read since ``before``."""
    return self.counts[BACKEND] - before[BACKEND]

  def verdict(self, before: dict[str, int]) -> str:
    """What the cache did since ``before`` (a copy of counts)."""
    if self.counts[HIT] > before[HIT]:
      return 'cache hit'
    if self.counts[MISS] > before[MISS]:
      return 'cache miss'
    return 'not cached'


# One listener per process: JAX keeps every one registered for good.
_EVENTS: CacheEvents | None = None


def cache_events() -> CacheEvents:
  global _EVENTS
  if _EVENTS is None:
    _EVENTS = CacheEvents()
  return _EVENTS


class FirstStep:
  """The line, printed by every process, as a training hook (see
  hooks.py): ``timed`` blocks of the start (restore, data iterator) are
  measured by the trainer before the hooks exist; compile, the first
  batch's wait and the rest come from the run's goodput clock when the
  first step of this start has finished."""
  part = 'other'

  def __init__(self):
    self.seconds = {'restore': 0.0, 'data iterator': 0.0}
    self._events = cache_events()
    self._before = dict(self._events.counts)
    self._cache = 'not cached'
    self._xla_s = 0.0
    self._compiled_at = None  # when every host had compiled
    self._done = False

  @contextlib.contextmanager
  def timed(self, part: str) -> Iterator[None]:
    """Adds the block's seconds to part ('restore', 'data iterator')."""
    start = time.perf_counter()
    try:
      yield
    finally:
      self.seconds[part] += time.perf_counter() - start

  def compiling(self, run) -> None:
    del run
    self._before = dict(self._events.counts)

  def compiled(self, run) -> None:
    del run
    self._compiled_at = time.time()
    self._cache = self._events.verdict(self._before)
    self._xla_s = self._events.backend_s(self._before)

  def finished(self, run, step: int, metrics) -> None:
    del metrics
    if self._done:
      return
    self._done = True
    # Every process: each host's start is its own (a slow disk, a cache
    # that missed: JAX writes the persistent cache from process 0 only).
    print(self.line(run.clock, step), flush=True)

  def line(self, clock, step: int) -> str:
    totals, now = clock.totals, time.time()
    wall = now - clock.started
    iterator = self.seconds['data iterator'] + totals['data_wait']
    restore = self.seconds['restore']
    startup = totals['startup'] - restore - self.seconds['data iterator']
    compile_s = totals['compile']
    step_s = now - (self._compiled_at or now)
    others = wall - totals['startup'] - totals['data_wait'] - compile_s - step_s
    return (f'{PREFIX}{step}) finished {wall:.1f} s after the process '
            f'started: start-up {startup:.1f} s, restore {restore:.1f} s, '
            f'data iterator {iterator:.1f} s, compile {compile_s:.1f} s '
            f'({self._cache}; XLA {self._xla_s:.1f} s), other processes '
            f'{max(others, 0.0):.1f} s, step {step_s:.1f} s.')


LINE = re.compile(
    r'First step \((\d+)\) finished ([\d.]+) s after the process started: '
    r'start-up ([\d.]+) s, restore ([\d.]+) s, data iterator ([\d.]+) s, '
    r'compile ([\d.]+) s \(([a-z ]+); XLA ([\d.]+) s\), other processes '
    r'([\d.]+) s, step ([\d.]+) s\.')


def parse(text: str) -> dict | None:
  """The first such line in text as numbers (None where there is none)."""
  found = LINE.search(text)
  if not found:
    return None
  g = found.groups()
  return {'first_step': int(g[0]), 'to_first_step_s': float(g[1]),
          'startup_s': float(g[2]), 'restore_s': float(g[3]),
          'data_iterator_s': float(g[4]), 'compile_s': float(g[5]),
          'cache': g[6], 'xla_s': float(g[7]),
          'other_processes_s': float(g[8]), 'step_s': float(g[9])}
