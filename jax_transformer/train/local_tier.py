"""The local checkpoint tier: frequent saves to each host's own disk.

``config.local_checkpoint_dir`` (host-local: a local SSD, ``/dev/shm``) is
written every ``config.local_checkpoint_every`` steps by Orbax's emergency
checkpoint manager, ``orbax.checkpoint.experimental.emergency.p2p`` (every
host saves its own shards and every process's data position; a host whose
directory is empty, a replaced machine, fetches a data-parallel peer's copy
over TCP). The persistent tier (``checkpoint.Checkpointer``, the workdir)
stays as it is, saved every ``checkpoint_every`` steps, and is what
evaluate/generate/export read. A restart resumes from the newer of the two.

Why the p2p manager rather than ``emergency.CheckpointManager``: that one
keeps a local copy only on the non-primary data-parallel replicas (the
primary one writes only the persistent tier, in its own single-item
layout), and its data iterator state goes to the persistent tier alone, so
a step restored from the local tier would have no data position. The p2p
manager keeps every host's copy and its data position, and runs on CPU
with gloo (checked with two processes: a restore from each host's own copy
and from a peer's).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from typing import Any

import grain.python as pygrain
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint.experimental.emergency.p2p import args as p2p_args
from orbax.checkpoint.experimental.emergency.p2p import (
  checkpoint_manager as p2p_manager,
)
from orbax.checkpoint.experimental.emergency.p2p import options as p2p_options

from jax_transformer.errors import UsageError
from jax_transformer.model import lora
from jax_transformer.runtime import distributed, storage
from jax_transformer.runtime.workdir import WorkdirPaths

# Local steps kept on each host besides the one being written: a kill mid-
# write still leaves the one before.
KEEP = 2


# Orbax's warnings that say nothing about a run: a host-local write
# (primary_host=None, as the local tier writes) does not log its size, once
# per array and save; an empty local directory (every first start, and a
# replaced host, which the restart's own line reports).
_NOISE = ('Global object size logging disabled', 'Local scan: No steps found',
          'Local scan: Directory not found')


class _HostLocalNoise:
  """A logging filter dropping _NOISE."""

  def filter(self, record) -> bool:
    message = record.getMessage()
    return not any(noise in message for noise in _NOISE)


logging.get_absl_logger().addFilter(_HostLocalNoise())


class DataPosition:
  """One process's data-iterator state as Orbax's grain handler saves and
  restores it (JSON bytes). Taken when made: the handler may ask later."""

  def __init__(self, state: Any = None):
    self.state = state

  def get_state(self) -> bytes:
    return json.dumps(self.state).encode()

  def set_state(self, state: bytes) -> None:
    self.state = json.loads(state)


def check_paths(local: str | None, workdir: WorkdirPaths) -> None:
  """Refuses a local directory (config.local_checkpoint_dir) inside the
  workdir (that is the persistent tier's disk, and evaluate/export would
  see half a tier there)."""
  if not local or storage.is_remote(os.fspath(workdir.root)):
    return
  inner = os.path.realpath(os.path.abspath(local))
  root = os.path.realpath(os.path.abspath(os.fspath(workdir.root)))
  if inner == root or inner.startswith(root + os.sep):
    raise UsageError(f'config.local_checkpoint_dir={local} is inside the '
                     f'workdir {workdir}: give each host a directory of its '
                     'own disk outside it (a local SSD, /dev/shm).')


def _refuse_shared(directory: str) -> None:
  """Refuses, on every process, a local directory that several processes
  see as one (a shared file system): each writes a file named at random
  and looks for the others'. Detectable only with several processes."""
  if jax.process_count() == 1:
    return
  mine = f'.host-probe-{uuid.uuid4().hex}'
  path = os.path.join(directory, mine)
  with open(path, 'w') as f:
    f.write(str(jax.process_index()))
  names = _allgather_text(mine)
  seen = any(os.path.exists(os.path.join(directory, name))
             for name in names if name != mine)
  multihost_utils.sync_global_devices('local tier probed')
  os.remove(path)
  shared = multihost_utils.process_allgather(np.int32(seen))
  if np.any(shared):
    raise UsageError(f'config.local_checkpoint_dir={directory} is one folder '
                     'that several processes see (a shared file system): '
                     'give each host a directory on its own disk (a local '
                     'SSD, /dev/shm).')


def _allgather_text(text: str) -> list[str]:
  """Every process's short ASCII string, in process order."""
  blob = np.zeros(64, np.uint8)
  blob[:len(text)] = np.frombuffer(text.encode(), np.uint8)
  return [bytes(b).rstrip(b'\0').decode()
          for b in multihost_utils.process_allgather(blob)]


class LocalTier:
  """Orbax's emergency p2p manager over this host's local directory, with
  no persistent directory of its own (the workdir's Checkpointer is that
  tier). All processes call every method together."""

  def __init__(self, directory: str, mesh: jax.sharding.Mesh, every: int):
    self.directory = directory
    self.every = every
    os.makedirs(directory, exist_ok=True)
    _refuse_shared(directory)
    options = p2p_options.CheckpointManagerOptions(
        local=p2p_options.LocalCheckpointOptions(save_interval_steps=every,
                                                 max_to_keep=KEEP),
        # Data-parallel replicas hold the same shards: a peer's copy fits.
        replica_axis_index=mesh.axis_names.index('data'))
    self.manager = p2p_manager.CheckpointManager(mesh, None, directory,
                                                 None, options=options)

  def latest_step(self) -> int | None:
    """The newest step some host holds for every shard, or None."""
    return self.manager.latest_step()

  def save(self, state: dict[str, Any], data_state: Any) -> None:
    """Saves the state (a LoRA run's adapters only) and this process's
    data position on this host (in the background)."""
    step = int(jax.device_get(state['step']))
    self.manager.save(step, args=p2p_args.Composite(
        state=ocp.args.PyTreeSave(_tree(state)),
        data_iter=pygrain.PyGrainCheckpointSave(DataPosition(data_state))),
                      force=True)

  def restore(self, abstract_state: dict[str, Any], step: int
              ) -> tuple[dict[str, Any], Any]:
    """(state placed as abstract_state's trainable part, data position) of
    step, from this host's copy or a peer's."""
    position = DataPosition()
    got = self.manager.restore(step, args=p2p_args.Composite(
        state=ocp.args.PyTreeRestore(_tree(abstract_state)),
        data_iter=pygrain.PyGrainCheckpointRestore(position)))
    tree = got['state']
    return dict(tree['train'], params=tree['params']), position.state

  def forget_after(self, step: int) -> None:
    """Removes this host's steps newer than step (a resume from an older
    one saves them again; Orbax would refuse an existing step)."""
    for name in os.listdir(self.directory):
      if name.isdigit() and int(name) > step:
        shutil.rmtree(os.path.join(self.directory, name))
    self.manager.reload()

  def move_aside(self, step: int) -> None:
    """Renames this host's copy of step to STEP.unreadable, which Orbax
    never reads or deletes."""
    source = epath.Path(self.directory) / str(step)
    if source.exists():
      target, n = source.with_name(f'{step}.unreadable'), 1
      while target.exists():
        target, n = source.with_name(f'{step}.unreadable.{n}'), n + 1
      source.rename(target)
    self.manager.reload()

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def _tree(state: dict[str, Any]) -> dict[str, Any]:
  """The saved tree: trainable params apart from the rest, as the
  persistent tier keeps them."""
  return {'params': lora.trainable(state['params']),
          'train': {k: v for k, v in state.items() if k != 'params'}}


def open_tier(directory: str | None, every: int | None, mesh,
              workdir: WorkdirPaths) -> LocalTier | None:
  """The run's local tier in directory (config.local_checkpoint_dir),
  saved every ``every`` steps, or None where directory is None (off).
  Refused on every process where one host's directory holds another
  workdir's steps."""
  if not directory:
    return None
  try:
    claim(directory, workdir)
  except UsageError as err:
    distributed.all_passed('local tier', str(err))
    raise
  distributed.all_passed('local tier')
  return LocalTier(directory, mesh, every)


def claim(directory: str, workdir: WorkdirPaths) -> None:
  """Marks directory as workdir's local tier (the file WORKDIR). Refuses
  one that another workdir's run claimed: its steps would resume the
  wrong run. Where workdir holds no config.json (a new run, or one
  started anew in an emptied folder), steps there are an old run's: they
  are removed."""
  os.makedirs(directory, exist_ok=True)
  marker = os.path.join(directory, 'WORKDIR')
  owner = os.fspath(workdir.root)
  if not storage.is_remote(owner):
    owner = os.path.realpath(os.path.abspath(owner))
  if os.path.exists(marker):
    with open(marker) as f:
      claimed = f.read().strip()
    if claimed != owner:
      raise UsageError(f'config.local_checkpoint_dir={directory} holds the '
                       f'local checkpoints of another run ({claimed}): '
                       'empty it or give this run a directory of its own.')
  if not workdir.config.exists():
    for name in os.listdir(directory):
      if name.isdigit():
        shutil.rmtree(os.path.join(directory, name))
  with open(marker, 'w') as f:
    f.write(owner + '\n')


class LocalSaving:
  """The local tier as a training hook (see hooks.py), before
  checkpoint.Saving: every ``local_checkpoint_every`` steps, the persistent
  tier's steps included (a kill while that slower save is being written
  then still loses at most local_checkpoint_every steps); not at a stop,
  which the persistent tier saves. A failed background write stops the run
  at the next step; the end waits for the last save and closes the tier.
  """
  part = 'checkpoint'

  def __init__(self, tier: LocalTier):
    self._tier = tier

  def dispatched(self, run, metrics) -> None:
    del run, metrics
    self._tier.manager.check_for_errors()

  def after_step(self, run) -> None:
    if run.step % self._tier.every or run.stop is not None:
      return
    run.finish_steps()
    run.hooks.before_save(run)  # never save a state a bad step made
    self._tier.save(run.state, run.train_iter.get_state())

  def end(self, run) -> None:
    del run
    self._tier.wait()

