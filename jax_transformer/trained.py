"""A training workdir opened for inference: its config, tokenizer, model
definition and parameters (one checkpoint, or the average of several as in
the paper), placed on a mesh.

Sits above ``checkpoint`` and ``experiment``: scripts that score, decode or
export a trained model start here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np
from jax.sharding import NamedSharding

from jax_transformer import checkpoint, experiment, sharding
from jax_transformer.data.tokenizers import load_tokenizer


@dataclasses.dataclass(frozen=True, eq=False)
class Workdir:
  """What a training directory holds, before any parameters are read."""
  path: str
  config: ml_collections.ConfigDict
  tokenizer: Any
  setup: experiment.Setup
  steps: tuple[int, ...]  # checkpointed steps, ascending

  def model(self, params):
    return self.setup.model_def.merge(params)


def open_workdir(path: str) -> Workdir:
  """Reads config.json and tokenizer/ and lists the checkpoints.

  Raises FileNotFoundError with one sentence when path is not a training
  directory, has no tokenizer, or holds no checkpoint.
  """
  if not os.path.isdir(path):
    raise FileNotFoundError(f'{path} is not a directory.')
  cfg = checkpoint.load_config(path)
  if cfg is None:
    raise FileNotFoundError(f'{path} has no {checkpoint.CONFIG_FILE}: not a '
                            'training workdir.')
  tokenizer_dir = os.path.join(path, checkpoint.TOKENIZER_DIR)
  if not os.path.isdir(tokenizer_dir):
    raise FileNotFoundError(f'{path} has no {checkpoint.TOKENIZER_DIR}/ '
                            'directory: the tokenizer it was trained with is '
                            'missing.')
  tokenizer = load_tokenizer(tokenizer_dir)
  setup = experiment.setup(cfg, tokenizer.vocab_size)
  checkpointer = checkpoint.Checkpointer(path, async_save=False)
  try:
    steps = tuple(sorted(checkpointer.manager.all_steps()))
  finally:
    checkpointer.close()
  if not steps:
    raise FileNotFoundError(f'{path} holds no checkpoint yet.')
  return Workdir(path, cfg, tokenizer, setup, steps)


def choose_steps(workdir: Workdir, step: int | None = None,
                 average_last: int = 1) -> list[int]:
  """The checkpoint steps to read: ``step`` (default the latest) and the
  ``average_last - 1`` checkpoints before it."""
  if average_last < 1:
    raise ValueError(f'--average_last must be at least 1, got {average_last}.')
  if step is None:
    step = workdir.steps[-1]
  if step not in workdir.steps:
    raise ValueError(f'{workdir.path} has no checkpoint at step {step}; it '
                     f'has steps {list(workdir.steps)}.')
  upto = [s for s in workdir.steps if s <= step]
  if len(upto) < average_last:
    raise ValueError(f'Cannot average the last {average_last} checkpoints up '
                     f'to step {step}: {workdir.path} keeps only {upto}.')
  return upto[-average_last:]


def param_shardings(workdir: Workdir, mesh) -> dict[str, NamedSharding]:
  """The training run's parameter shardings on ``mesh``."""
  specs = sharding.param_specs(workdir.setup.model_def.logical_axes)
  return {k: NamedSharding(mesh, specs[k]) for k in specs}


def restore_params(workdir: Workdir, steps: Sequence[int], mesh
                   ) -> dict[str, jax.Array]:
  """The parameters of one checkpoint, or their mean over several (summed
  in float64 on the host, so the order of steps does not matter), placed as
  in training on ``mesh``."""
  shardings = param_shardings(workdir, mesh)
  abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k])
              for k, v in workdir.setup.abstract_params.items()}
  checkpointer = checkpoint.Checkpointer(workdir.path, async_save=False)
  try:
    if len(steps) == 1:
      return checkpointer.restore_params(abstract, steps[0])
    total = None
    for step in steps:
      params = jax.device_get(checkpointer.restore_params(abstract, step))
      params = {k: np.asarray(v, np.float64) for k, v in params.items()}
      total = params if total is None else {
          k: total[k] + params[k] for k in total}
  finally:
    checkpointer.close()
  mean = {k: (v / len(steps)).astype(abstract[k].dtype)
          for k, v in total.items()}
  return {k: jax.device_put(v, shardings[k]) for k, v in mean.items()}
