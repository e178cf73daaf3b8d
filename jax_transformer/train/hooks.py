"""What the training loop tells the rest of a run, and when.

The loop (``trainer.run_steps``) only reads a batch, runs a step and tells
its hooks. Everything else a run does (checkpoints, evaluation, metrics
rows, the progress bar, the goodput clock's rows, the stall watch, the
finite check, the profiler, stop signals, fault points, the sample) is a
hook: an object with a method for each moment it cares about (:class:`Hook`
lists them, :class:`Hooks` says when each is called), each taking the
:class:`Run` first.

Adding a behaviour to training is adding a hook to ``trainer.make_hooks``
(see docs/training.md, "Add a behaviour"), never editing the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterable, Protocol

import jax
import numpy as np

from jax_transformer.data.pipeline import Batches
from jax_transformer.data.tokenizers import Tokenizer
from jax_transformer.runtime.workdir import WorkdirPaths
from jax_transformer.train.goodput import Clock
from jax_transformer.train.metrics import MetricWriter
from jax_transformer.train.model_setup import Setup

# In the order a step meets them.
MOMENTS = ('start', 'before_step', 'compiling', 'compiled', 'launching',
           'dispatched', 'finished', 'after_step', 'row', 'logged',
           'evaluating', 'before_save', 'saved', 'end', 'completed')


class Hook(Protocol):
  """What a hook may define: any of these moments (only those it cares
  about: read this as a list, not as a type to check against, since a
  Protocol has no optional members), each called by the :class:`Hooks`
  method of the same name, and ``part``, the goodput part its time is
  charged to ('other' where it has none; None for the clock's own hook,
  which switches parts itself)."""

  part: str | None

  def start(self, run: Run) -> None: ...
  def before_step(self, run: Run) -> None: ...
  def compiling(self, run: Run) -> None: ...
  def compiled(self, run: Run) -> None: ...
  def launching(self, run: Run) -> None: ...
  def dispatched(self, run: Run, metrics: dict[str, jax.Array]) -> None: ...
  def finished(self, run: Run, step: int,
               metrics: dict[str, np.ndarray]) -> None: ...
  def after_step(self, run: Run) -> None: ...
  def row(self, run: Run, row: dict[str, float]) -> None: ...
  def logged(self, run: Run, row: dict[str, float]) -> None: ...
  def evaluating(self, run: Run, at: int) -> None: ...
  def before_save(self, run: Run) -> None: ...
  def saved(self, run: Run) -> None: ...
  def end(self, run: Run) -> None: ...
  def completed(self, run: Run) -> None: ...


class Hooks:
  """A run's hooks, told of each moment by the method of its name: every
  hook that defines the moment is called, in the hooks' order, its time
  charged to its goodput part."""

  def __init__(self, hooks: Iterable[object], clock: Clock):
    self.all = list(hooks)
    self._clock = clock
    # Each moment's (method, goodput part) of the hooks that define it.
    self._takers = {
        moment: [(getattr(h, moment), getattr(h, 'part', 'other'))
                 for h in self.all if callable(getattr(h, moment, None))]
        for moment in MOMENTS}

  def _call(self, moment: str, *args: object) -> None:
    """Calls the moment's takers in order, each charged to its part. At
    'end' each one runs even where another raised (the others still end:
    threads, handlers), and the first error is raised after them."""
    error = None
    for method, part in self._takers[moment]:
      try:
        with (contextlib.nullcontext() if part is None
              else self._clock.charged(part)):
          method(*args)
      except BaseException as err:  # pylint: disable=broad-except
        if moment != 'end':
          raise
        error = error or err
    if error is not None:
      raise error

  def start(self, run: Run) -> None:
    """Before the first step of this start (the loop's first act)."""
    self._call('start', run)

  def before_step(self, run: Run) -> None:
    """Step ``run.step + 1`` is about to read its batch."""
    self._call('before_step', run)

  def compiling(self, run: Run) -> None:
    """The train step's first compile begins: minutes on a large model,
    with no progress to report."""
    self._call('compiling', run)

  def compiled(self, run: Run) -> None:
    """The train step is compiled, its memory checked, every host there."""
    self._call('compiled', run)

  def launching(self, run: Run) -> None:
    """Step ``run.step + 1`` has its batch and is compiled; it runs next."""
    self._call('launching', run)

  def dispatched(self, run: Run, metrics: dict[str, jax.Array]) -> None:
    """Step ``run.step`` is running; its metrics are still on the device."""
    self._call('dispatched', run, metrics)

  def finished(self, run: Run, step: int,
               metrics: dict[str, np.ndarray]) -> None:
    """Step ``step``'s metrics reached the host (numbers): each step once,
    in step order, maybe after later steps were dispatched."""
    self._call('finished', run, step, metrics)

  def after_step(self, run: Run) -> None:
    """After step ``run.step`` is dispatched: the hooks' decisions (rows,
    evaluation, stopping, saving), each in turn."""
    self._call('after_step', run)

  def row(self, run: Run, row: dict[str, float]) -> None:
    """A metrics row of ``run.step`` is being made: a hook adds its
    figures (evaluation, time parts) to ``row``."""
    self._call('row', run, row)

  def logged(self, run: Run, row: dict[str, float]) -> None:
    """``row``, the metrics row of ``run.step``, was written."""
    self._call('logged', run, row)

  def evaluating(self, run: Run, at: int) -> None:
    """Between two batches of the evaluation of step ``at``."""
    self._call('evaluating', run, at)

  def before_save(self, run: Run) -> None:
    """A checkpoint of step ``run.step`` is about to be saved (every
    dispatched step has finished)."""
    self._call('before_save', run)

  def saved(self, run: Run) -> None:
    """That checkpoint's save has started (it may still be writing)."""
    self._call('saved', run)

  def end(self, run: Run) -> None:
    """The loop ended, however: every hook's ``end`` runs even where one
    raises, and the first error is raised after them."""
    self._call('end', run)

  def completed(self, run: Run) -> None:
    """After ``end``, where the loop ended without an error: the sample,
    the last row."""
    self._call('completed', run)


@dataclasses.dataclass(eq=False)
class Run:
  """What the loop shares with its hooks: the run's fixed parts, its state
  and how far it got."""
  num_steps: int                # the run's last step
  workdir: WorkdirPaths
  mesh: jax.sharding.Mesh
  setup: Setup
  tokenizer: Tokenizer
  writer: MetricWriter
  clock: Clock
  train_iter: Batches
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
    return self.step == self.num_steps

  def log(self, *args) -> None:
    """print on process 0."""
    if self.main:
      print(*args, flush=True)
