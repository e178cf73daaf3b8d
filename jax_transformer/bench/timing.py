"""Interleaved timing: two (or more) contenders, alternating order, rounds.

Timing one side and then the other lets a machine's drifting speed (a noisy
neighbour, thermal limits, a slower VM) masquerade as a speed-up. Here every
round times each contender once, the order alternating between rounds, and
the result is the median time of each and the median of per-round ratios.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable


def load_average() -> float | None:
  """The 1-minute load average (None where the OS has none)."""
  try:
    return os.getloadavg()[0]
  except OSError:
    return None


def timed(fn: Callable[[], object]) -> float:
  """Seconds for one call; ``fn`` must block until its result is ready."""
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def interleave(contenders: dict[str, Callable[[], object]], rounds: int,
               warmup: int = 1) -> dict[str, list[float]]:
  """Per-contender lists of ``rounds`` timings, taken in alternating order.

  Each contender first runs ``warmup`` untimed calls. Round r runs them in
  the given order when r is even and reversed when odd, so neither always
  follows the other (caches, allocator state, frequency scaling).
  """
  names = list(contenders)
  for name in names:
    for _ in range(warmup):
      contenders[name]()
  times = {name: [] for name in names}
  for r in range(rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      times[name].append(timed(contenders[name]))
  return times


def summary(times: dict[str, list[float]], ours: str, theirs: str) -> dict:
  """Medians of each side and the median of per-round ratios ours/theirs."""
  ratios = [a / b for a, b in zip(times[ours], times[theirs])]
  return {f'{ours}_s': statistics.median(times[ours]),
          f'{theirs}_s': statistics.median(times[theirs]),
          'ratio': statistics.median(ratios),
          'ratio_min': min(ratios), 'ratio_max': max(ratios),
          'rounds': len(ratios)}
