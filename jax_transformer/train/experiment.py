"""From an experiment config (ml_collections) to model, optimizer and state.

Shared by the trainer and by checkpoint loading, so both build exactly the
same pytrees.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
import optax
from flax import nnx

from jax_transformer.model import lora
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.params import ModelDef, Params, abstract, split
from jax_transformer.train import checks, optim


def train_state(params: Params, tx: optax.GradientTransformation,
                seed: int = 0, step: int = 0) -> dict[str, Any]:
  """The train state (see ``steps.py``) holding ``params`` at ``step``, a
  fresh optimizer state (of the adapters alone where params hold LoRA
  adapters: ``lora.trainable``) and the run's base dropout key for
  ``seed``."""
  _, rng = jax.random.split(jax.random.key(seed))
  return {'params': params, 'opt_state': tx.init(lora.trainable(params)),
          'step': jax.numpy.asarray(step, jax.numpy.int32),
          'rng': jax.random.key_data(rng)}


def source_len(cfg: ml_collections.ConfigDict) -> int:
  """Source tokens per row of an encoder-decoder run (data.src_len, else
  seq_len); 0 for a decoder-only LM."""
  if cfg.model_kind != 'encoder_decoder':
    return 0
  return cfg.data.get('src_len') or cfg.seq_len


@dataclasses.dataclass(frozen=True, eq=False)
class Setup:
  """Everything static about one training run."""
  model_config: ModelConfig
  model_cls: type
  model_def: ModelDef
  abstract_params: Params
  schedule: optax.Schedule
  tx: optax.GradientTransformation

  def init_params(self, key: jax.Array) -> Params:
    model = self.model_cls(self.model_config, nnx.Rngs(params=key))
    params = split(model)[1]
    if isinstance(self.model_def, lora.LoraModelDef):
      params.update(self.init_adapters(jax.random.fold_in(key, 1)))
    return params

  def init_adapters(self, key: jax.Array) -> Params:
    """Fresh LoRA adapters ({} without LoRA)."""
    if not isinstance(self.model_def, lora.LoraModelDef):
      return {}
    return self.model_def.init_adapters(key)

  def init_state(self, seed: int) -> dict[str, Any]:
    """A fresh train state (call under jit with out_shardings)."""
    params_key, _ = jax.random.split(jax.random.key(seed))
    return self.state_for(self.init_params(params_key), seed)

  def state_for(self, params: Params, seed: int,
                step: int = 0) -> dict[str, Any]:
    """The train state of a run with ``seed`` holding ``params`` at ``step``
    with a fresh optimizer state (imported parameters start here)."""
    return train_state(params, self.tx, seed, step)

  def abstract_state(self, seed: int = 0) -> dict[str, Any]:
    return jax.eval_shape(lambda: self.init_state(seed))


def setup(cfg: ml_collections.ConfigDict, tokenizer_vocab: int) -> Setup:
  mc = checks.model_config(cfg, tokenizer_vocab)
  checks.check_lengths(cfg, mc)
  cls = checks.check_model_kind(cfg)
  model_def, abstract_params = abstract(lambda: cls(mc, nnx.Rngs(0)))
  adapters = cfg.get('lora') or {}
  if adapters.get('rank'):
    model_def, abstract_params = lora.with_adapters(
        model_def, abstract_params, adapters['rank'], adapters['alpha'],
        adapters['targets'])
  schedule = optim.make_schedule(cfg.optim, mc.d_model, cfg.num_steps)
  tx = optim.make_optimizer(cfg.optim, schedule,
                            lora.trainable(abstract_params))
  return Setup(mc, cls, model_def, abstract_params, schedule, tx)


def with_optimizer(base: Setup, cfg: ml_collections.ConfigDict) -> Setup:
  """base with cfg's schedule and optimizer (e.g. another gradient
  accumulation), its model unchanged: no model is built again."""
  schedule = optim.make_schedule(cfg.optim, base.model_config.d_model,
                                 cfg.num_steps)
  return dataclasses.replace(
      base, schedule=schedule,
      tx=optim.make_optimizer(cfg.optim, schedule,
                              lora.trainable(base.abstract_params)))


def abstract_state_of(setup: Setup, seed: int = 0) -> dict[str, Any]:
  """setup.abstract_state() from its abstract parameters: the optimizer
  state's shapes without initialising a model."""
  return jax.eval_shape(lambda p: train_state(p, setup.tx, seed),
                        setup.abstract_params)
