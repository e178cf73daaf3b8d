"""Orbax checkpoints of the train state, plus the files saved beside them.

A workdir holds:
  checkpoints/<step>/  params, train (opt_state, step, rng), data (iterator
                       state, JSON) as Orbax items
  config.json          the experiment config
  tokenizer/           the tokenizer the model was trained with
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.data.tokenizers import load_tokenizer

CONFIG_FILE = 'config.json'
TOKENIZER_DIR = 'tokenizer'


class Checkpointer:
  """Saves every N steps (async), keeps the last K, restores any mesh."""

  def __init__(self, workdir: str, keep: int = 3, async_save: bool = True):
    self.manager = ocp.CheckpointManager(
        os.path.join(os.path.abspath(workdir), 'checkpoints'),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save,
            create=True))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, state: dict[str, Any], data_state: Any) -> None:
    step = int(jax.device_get(state['step']))
    train = {k: v for k, v in state.items() if k != 'params'}
    self.manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(state['params']),
        train=ocp.args.StandardSave(train),
        data=ocp.args.JsonSave(data_state)), force=True)

  def restore(self, abstract_state: dict[str, Any],
              step: int | None = None) -> tuple[dict[str, Any], Any]:
    """The state (placed as abstract_state's shardings) and data state."""
    step = self.latest_step() if step is None else step
    train = {k: v for k, v in abstract_state.items() if k != 'params'}
    try:
      got = self.manager.restore(step, args=ocp.args.Composite(
          params=ocp.args.StandardRestore(abstract_state['params']),
          train=ocp.args.StandardRestore(train),
          data=ocp.args.JsonRestore()))
    except (ValueError, KeyError, TypeError) as err:
      raise ValueError(
          f'Checkpoint at step {step} in {self.manager.directory} does not '
          f'match this model/optimizer config: {err}') from err
    return dict(got['train'], params=got['params']), got['data']

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def save_side_files(workdir: str, cfg: ml_collections.ConfigDict,
                    tokenizer) -> None:
  """config.json and tokenizer/ beside the checkpoints (process 0 only)."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, CONFIG_FILE), 'w') as f:
    f.write(cfg.to_json(indent=2, sort_keys=True))
  tokenizer.save(os.path.join(workdir, TOKENIZER_DIR))


def load_config(workdir: str) -> ml_collections.ConfigDict | None:
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def load_for_inference(workdir: str, step: int | None = None):
  """(model, tokenizer) from a trained workdir, on the local devices.

  The model is an EncoderDecoder or DecoderLM holding the checkpoint's
  parameters (replicated); the tokenizer is the one it was trained with.
  """
  # Imported here: experiment imports the models, this module is lower.
  from jax_transformer import experiment  # pylint: disable=g-import-not-at-top
  cfg = load_config(workdir)
  if cfg is None:
    raise FileNotFoundError(f'{workdir} has no {CONFIG_FILE}: not a '
                            'training workdir.')
  tokenizer = load_tokenizer(os.path.join(workdir, TOKENIZER_DIR))
  setup = experiment.setup(cfg, tokenizer.vocab_size)
  replicated = NamedSharding(
      jax.sharding.Mesh(jax.local_devices()[:1], ('data',)), PartitionSpec())
  abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated)
              for k, v in setup.abstract_params.items()}
  checkpointer = Checkpointer(workdir, async_save=False)
  step = checkpointer.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f'{workdir} has no checkpoint yet.')
  got = checkpointer.manager.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract)))
  checkpointer.close()
  return setup.model_def.merge(got['params']), tokenizer
