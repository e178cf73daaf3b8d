"""A run's workdir, resolved once where it enters: its root and the place
of everything in it.

Training, evaluation, decoding, export and import all take a
:class:`WorkdirPaths` (or a string, which they resolve with
:func:`resolve` on entry), so a relative, absolute or ``gs://`` workdir
reaches Orbax, TensorBoard and the tokenizer as the same absolute path::

  WORKDIR/config.json         the experiment config (JSON)
  WORKDIR/tokenizer/          the tokenizer trained with
  WORKDIR/tokenizer.sha256    its fingerprint
  WORKDIR/checkpoints/STEP/   Orbax checkpoints
  WORKDIR/metrics.jsonl       one row per log or eval step
  WORKDIR/tensorboard/        TensorBoard events (and profiler traces)
"""

from __future__ import annotations

import dataclasses
import os

from etils import epath

from jax_transformer.runtime import storage

CONFIG_FILE = 'config.json'
TOKENIZER_DIR = 'tokenizer'
FINGERPRINT_FILE = 'tokenizer.sha256'
CHECKPOINTS_DIR = 'checkpoints'
METRICS_FILE = 'metrics.jsonl'
TENSORBOARD_DIR = 'tensorboard'


@dataclasses.dataclass(frozen=True)
class WorkdirPaths:
  """Where a workdir's files are.

  Attributes:
    given: the workdir as the user wrote it (for messages).
    root: the same place as an absolute local path or a remote URL.
  """
  given: str
  root: epath.Path

  def __str__(self) -> str:
    return self.given

  def __fspath__(self) -> str:
    return os.fspath(self.root)

  @property
  def config(self) -> epath.Path:
    return self.root / CONFIG_FILE

  @property
  def tokenizer(self) -> epath.Path:
    return self.root / TOKENIZER_DIR

  @property
  def fingerprint(self) -> epath.Path:
    return self.root / FINGERPRINT_FILE

  @property
  def checkpoints(self) -> epath.Path:
    return self.root / CHECKPOINTS_DIR

  def checkpoint(self, step: int) -> epath.Path:
    return self.checkpoints / str(step)

  @property
  def metrics(self) -> epath.Path:
    return self.root / METRICS_FILE

  @property
  def tensorboard(self) -> epath.Path:
    return self.root / TENSORBOARD_DIR


def resolve(location: str | os.PathLike | WorkdirPaths,
            flag: str = '--workdir') -> WorkdirPaths:
  """location as WorkdirPaths (unchanged when it already is one).

  A local path becomes absolute (``~`` expanded) against today's working
  directory; a remote one is checked: a scheme this machine cannot reach is
  refused in one sentence (``storage.check_backend``).
  """
  if isinstance(location, WorkdirPaths):
    return location
  return WorkdirPaths(os.fspath(location), storage.path(location, flag))
