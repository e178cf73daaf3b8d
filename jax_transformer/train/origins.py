"""Where a run's first train state comes from, chosen once.

Three origins, each able to name the tokenizer the run uses and to make
the state for the run's plan:

* ``Resume``: the workdir holds a step (either checkpoint tier); the
  state and the data position are restored;
* ``Pretrained``: ``config.init_from`` names a model and the workdir has
  no step yet; its parameters, a fresh optimizer, step 0;
* ``Fresh``: new parameters from the run's seed.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from jax_transformer.experiment import Experiment
from jax_transformer.interop.hf_checkpoint import Source
from jax_transformer.train import init_from
from jax_transformer.train.run_plan import RunPlan
from jax_transformer.train.tiers import Tiers


@dataclasses.dataclass(frozen=True)
class Resume:
  """The newest step of the run's checkpoint tiers."""
  tiers: Tiers
  resuming = True

  def tokenizer(self, prepared_tokenizer):
    # The workdir's own tokenizer wins (checkpoint.run_tokenizer).
    return prepared_tokenizer

  def state(self, plan: RunPlan, train_iter, timed, notice
            ) -> tuple[dict[str, Any], str]:
    """(the restored state, the line saying so); the data iterator is set
    to the step's position. timed(part): a context charging its time to
    the start's part ('restore', 'data iterator'); notice(line): a line on
    stderr (a damaged local step)."""
    with timed('restore'):
      state, position, tier = self.tiers.restore(plan.sharded_state,
                                                 notice)
    with timed('data iterator'):
      train_iter.set_state(position)
    which = f' ({tier})' if self.tiers.local else ''  # only where two
    return state, (f'Resumed from step {int(state["step"])} in '
                   f'{self.tiers.persistent.paths}{which}.')


@dataclasses.dataclass(frozen=True)
class Pretrained:
  """A model named by config.init_from, opened once."""
  start: init_from.Start
  seed: int
  resuming = False

  def tokenizer(self, prepared_tokenizer):
    del prepared_tokenizer  # the checkpoint's tokenizer is the model's
    return self.start.tokenizer

  def state(self, plan: RunPlan, train_iter, timed, notice
            ) -> tuple[dict[str, Any], str]:
    del train_iter, timed, notice  # a new run's data starts at the beginning
    source = self.start.source
    return (self.start.state(plan.setup, self.seed, plan.shardings),
            f'Started from {source.path} ({source.what}).')


@dataclasses.dataclass(frozen=True)
class Fresh:
  """New parameters from the run's seed."""
  resuming = False

  def tokenizer(self, prepared_tokenizer):
    return prepared_tokenizer

  def state(self, plan: RunPlan, train_iter, timed, notice
            ) -> tuple[dict[str, Any], None]:
    del train_iter, timed, notice
    return plan.fresh_state(), None


def choose(exp: Experiment, tiers: Tiers, source: Source | None
           ) -> Resume | Pretrained | Fresh:
  """The run's origin: a step in the workdir wins over config.init_from
  (``source``, opened when the config was resolved), which wins over new
  parameters."""
  if tiers.latest_step() is not None:
    return Resume(tiers)
  if exp.init_from:  # its path gone: open_source says so in one sentence
    source = source or init_from.open_source(os.fspath(exp.init_from))
    return Pretrained(init_from.start(source), exp.seed)
  return Fresh()
