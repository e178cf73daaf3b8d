"""What the training loop tells the rest of a run, and when.

The loop (``trainer.run_steps``) only reads a batch, runs a step and tells
its hooks. Everything else a run does (checkpoints, evaluation, metrics
rows, the progress bar, the goodput clock's rows, the stall watch, the
finite check, the profiler, stop signals, fault points, the sample) is a
hook: an object with a method for each moment it cares about, named below,
each taking the :class:`Run` first. A hook defines only its moments; its
time is charged to the goodput part it names (``part``, default 'other';
None for the clock's own hook, which switches parts itself).

Moments, in the order a step meets them:

- ``start(run)``: before the first step of this start.
- ``before_step(run)``: step ``run.step + 1`` is about to read its batch.
- ``compiling(run)``, ``compiled(run)``: around the first compile of the
  train step (minutes on a large model, with no progress to report).
- ``launching(run)``: its batch is read and the step compiled; it runs next.
- ``dispatched(run, metrics)``: step ``run.step`` is running; metrics are
  still on the device.
- ``finished(run, step, metrics)``: a step's metrics reached the host
  (numbers), in step order, each step once.
- ``after_step(run)``: decisions after step ``run.step`` (rows,
  evaluation, stopping, saving), in the hooks' order.
- ``row(run, row)``: a metrics row of ``run.step`` is being made: add your
  figures (evaluation, time parts) to the dict.
- ``logged(run, row)``: the row was written.
- ``evaluating(run, at)``: between two batches of step ``at``'s evaluation.
- ``before_save(run)``, ``saved(run)``: around starting a checkpoint save.
- ``end(run)``: the loop ended, however (every hook's end runs, the first
  error is raised after).
- ``completed(run)``: the loop ended without an error (the sample, the
  last row).

Adding a behaviour to training is adding a hook to ``trainer.make_hooks``
(see docs/training.md, "Add a behaviour"), never editing the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterable

import jax
import ml_collections

MOMENTS = ('start', 'before_step', 'compiling', 'compiled', 'launching',
           'dispatched',
           'finished', 'after_step', 'row', 'logged', 'evaluating',
           'before_save', 'saved', 'end', 'completed')


class Hooks:
  """Calls the hooks that define a moment, in order, each charged to its
  goodput part: ``hooks.after_step(run)`` and so on for every moment."""

  def __init__(self, hooks: Iterable[Any], clock):
    self.all = list(hooks)
    self._clock = clock
    for moment in MOMENTS:
      make = self._end_caller if moment == 'end' else self._caller
      setattr(self, moment, make(self._takers(moment)))

  def _takers(self, moment: str) -> list:
    """(method, goodput part) of every hook that defines moment."""
    return [(getattr(h, moment), getattr(h, 'part', 'other'))
            for h in self.all if callable(getattr(h, moment, None))]

  def _charged(self, part):
    return (contextlib.nullcontext() if part is None
            else self._clock.charged(part))

  def _caller(self, takers):
    def call(*args) -> None:
      for method, part in takers:
        with self._charged(part):
          method(*args)
    return call

  def _end_caller(self, takers):
    def call(*args) -> None:
      error = None
      for method, part in takers:
        try:
          with self._charged(part):
            method(*args)
        except BaseException as err:  # pylint: disable=broad-except
          error = error or err  # the others still end: threads, handlers
      if error is not None:
        raise error
    return call


@dataclasses.dataclass(eq=False)
class Run:
  """What the loop shares with its hooks: the run's fixed parts, its state
  and how far it got."""
  cfg: ml_collections.ConfigDict
  workdir: Any                  # runtime.workdir.WorkdirPaths
  mesh: jax.sharding.Mesh
  setup: Any                    # train.experiment.Setup
  tokenizer: Any
  writer: Any                   # train.metrics.MetricWriter
  clock: Any                    # train.goodput.Clock
  train_iter: Any               # data.pipeline.Batches
  state: dict[str, Any]
  step: int                     # steps done (the last one dispatched)
  hooks: Hooks | None = None
  # Why the loop ends after this step (a signal's name), or None.
  stop: str | None = None
  # Waits for every dispatched step (their ``finished`` moments run).
  finish_steps: Callable[[], None] = lambda: None
  row: dict[str, float] = dataclasses.field(default_factory=dict)
  compile_s: float | None = None  # the train step's, until a row takes it
  # Whether this start took the run to its last step (or finished the last
  # step's evaluation): what the sample waits for.
  finished_now: bool = False
  start_step: int = dataclasses.field(init=False)

  def __post_init__(self):
    self.start_step = self.step

  @property
  def main(self) -> bool:
    return jax.process_index() == 0

  @property
  def last(self) -> bool:
    """Whether run.step is the run's last step."""
    return self.step == self.cfg.num_steps

  def log(self, *args) -> None:
    """print on process 0."""
    if self.main:
      print(*args, flush=True)


def every(n: int, step: int, last: bool = False) -> bool:
  """A schedule: step is a multiple of n (n > 0), or the last."""
  return last or (n > 0 and step % n == 0)
