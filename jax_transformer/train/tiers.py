"""A run's checkpoints as one object: the workdir's persistent tier and,
where ``config.local_checkpoint_dir`` is set, the host-local tier.

The trainer asks it for the newest step, restores from whichever tier
holds it, takes its saving hooks and closes it; which tiers exist is its
business alone (``checkpoint.py`` for the persistent tier, ``local_tier.py``
for the local one).
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from jax_transformer.errors import named_line
from jax_transformer.experiment import Experiment
from jax_transformer.runtime import distributed
from jax_transformer.runtime.workdir import WorkdirPaths
from jax_transformer.train import checkpoint, init_from, local_tier


class Tiers:
  """The persistent tier (``persistent``, a Checkpointer) and the local
  one (``local``, a LocalTier or None)."""

  def __init__(self, persistent: checkpoint.Checkpointer,
               local: local_tier.LocalTier | None = None):
    self.persistent = persistent
    self.local = local

  @classmethod
  def open(cls, exp: Experiment, workdir: WorkdirPaths, mesh) -> Tiers:
    """The run's tiers. Refuses (on every process, before anything is
    opened that would need closing) a local directory that hosts share or
    that another run's steps are in."""
    local = local_tier.open_tier(exp.local_checkpoint_dir,
                                 exp.local_checkpoint_every, mesh, workdir)
    persistent = checkpoint.Checkpointer(workdir, keep=exp.keep_checkpoints,
                                         read_base=init_from.frozen_base)
    return cls(persistent, local)

  def latest_step(self) -> int | None:
    """The newest step either tier holds (None: neither holds one)."""
    steps = [self.persistent.latest_step(),
             self.local.latest_step() if self.local else None]
    return max((s for s in steps if s is not None), default=None)

  def restore(self, abstract_state: dict[str, Any],
              notice: Callable[[str], None]
              ) -> tuple[dict[str, Any], Any, str]:
    """(state, data position, the tier read) from the newest step either
    tier holds. A local step that not every process can read is moved
    aside on each host, with one line to ``notice``, and the persistent
    tier is read instead (with its own damaged-step handling)."""
    local, persistent = self.local, self.persistent.latest_step()
    newest = local.latest_step() if local else None
    if newest is not None and (persistent is None or newest > persistent):
      try:
        state, position = local.restore(abstract_state, newest)
        state = self._with_frozen(state, abstract_state)
        error = None
      except Exception as err:  # pylint: disable=broad-except
        state, error = None, err
      if distributed.everywhere(error is None):
        local.forget_after(newest)
        return state, position, 'local tier'
      local.move_aside(newest)
      notice(f'Local checkpoint step {newest} could not be read '
             f'({named_line(error) if error else "on another process"}); '
             f'moved it to {local.directory}/{newest}.unreadable and resumed '
             'from the persistent tier.')
    if persistent is None:
      raise FileNotFoundError('No tier holds a readable checkpoint.')
    state, position = self.persistent.restore(abstract_state)
    if local:
      local.forget_after(int(jax.device_get(state['step'])))
    return state, position, 'persistent tier'

  def _with_frozen(self, state, abstract_state):
    """A LoRA run's frozen base put back beside its restored adapters."""
    frozen = self.persistent.frozen(abstract_state['params'])
    if frozen:
      state = dict(state, params={**frozen, **state['params']})
    return state

  def saving_hooks(self, every: int) -> list:
    """The hooks that save: the local tier's first (see
    ``local_tier.LocalSaving``), then the persistent tier's every
    ``every`` steps, at the last step and at a stop."""
    local = [local_tier.LocalSaving(self.local)] if self.local else []
    return [*local, checkpoint.Saving(self.persistent, every)]

  def close(self) -> None:
    """Closes both tiers (no save or thread of theirs outlives this)."""
    try:
      self.persistent.close()
    finally:
      if self.local:
        self.local.close()
