"""From an experiment to its model, optimizer and train state.

Shared by the trainer and by checkpoint loading, so both build exactly the
same pytrees.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import optax
from flax import nnx

from jax_transformer.experiment import Experiment
from jax_transformer.model import lora
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.families import family
from jax_transformer.model.params import ModelDef, Params, abstract, split
from jax_transformer.train import optim


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


@dataclasses.dataclass(frozen=True, eq=False)
class Setup:
  """Everything static about one training run: the model, and (None where
  only the model is wanted: ``build_model``, for inference) its schedule
  and optimizer."""
  model_config: ModelConfig
  model_cls: type
  model_def: ModelDef
  abstract_params: Params
  schedule: optax.Schedule | None = None
  tx: optax.GradientTransformation | None = None

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


def build(exp: Experiment, tokenizer_vocab: int) -> Setup:
  """The Setup of an experiment whose tokenizer has tokenizer_vocab
  ids: its model, schedule and optimizer."""
  return with_optimizer(build_model(exp, tokenizer_vocab), exp)


def build_model(exp: Experiment, tokenizer_vocab: int) -> Setup:
  """The Setup of an experiment's model alone (no schedule, no optimizer:
  what inference opens)."""
  cls = family(exp.model_kind).model_class  # UsageError for an unknown kind
  mc = exp.model_config(tokenizer_vocab)
  model_def, abstract_params = lora.apply(
      exp.lora, *abstract(lambda: cls(mc, nnx.Rngs(0))))
  return Setup(mc, cls, model_def, abstract_params)


def with_optimizer(base: Setup, exp: Experiment) -> Setup:
  """base with exp's schedule and optimizer (e.g. another gradient
  accumulation, or a model built alone), its model unchanged: no model is
  built again."""
  schedule, tx = optim.build(exp.optim, base.model_config.d_model,
                             exp.num_steps,
                             lora.trainable(base.abstract_params))
  return dataclasses.replace(base, schedule=schedule, tx=tx)


def abstract_state_of(setup: Setup, seed: int = 0) -> dict[str, Any]:
  """setup.abstract_state() from its abstract parameters: the optimizer
  state's shapes without initialising a model."""
  return jax.eval_shape(lambda p: train_state(p, setup.tx, seed),
                        setup.abstract_params)
