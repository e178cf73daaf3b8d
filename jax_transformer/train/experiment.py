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

from jax_transformer.errors import UsageError
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.models import DecoderLM, EncoderDecoder
from jax_transformer.model.params import ModelDef, Params, abstract, split
from jax_transformer.train import optim

MODELS = {'decoder_lm': DecoderLM, 'encoder_decoder': EncoderDecoder}


def model_class(cfg: ml_collections.ConfigDict) -> type:
  if cfg.model_kind not in MODELS:
    raise UsageError(f'model_kind must be one of {sorted(MODELS)}, got '
                     f'{cfg.model_kind!r}.')
  return MODELS[cfg.model_kind]


def model_config(cfg: ml_collections.ConfigDict,
                 tokenizer_vocab: int) -> ModelConfig:
  """config.model's fields, with vocab_size None meaning the tokenizer's
  (rounded up to ``config.vocab_multiple`` so it splits over 'tensor')."""
  fields = cfg.model.to_dict()
  known = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise UsageError(f'config.model has unknown fields {unknown}.')
  if fields.get('vocab_size') is None:
    multiple = int(cfg.get('vocab_multiple', 1))
    fields['vocab_size'] = -(-tokenizer_vocab // multiple) * multiple
  elif fields['vocab_size'] < tokenizer_vocab:
    raise UsageError(f'config.model.vocab_size={fields["vocab_size"]} is '
                     f'smaller than the tokenizer\'s {tokenizer_vocab}; '
                     'raise it, or unset it to use the tokenizer\'s.')
  return ModelConfig(**fields)


def train_state(params: Params, tx: optax.GradientTransformation,
                seed: int = 0, step: int = 0) -> dict[str, Any]:
  """The train state (see ``steps.py``) holding ``params`` at ``step``, a
  fresh optimizer state and the run's base dropout key for ``seed``."""
  _, rng = jax.random.split(jax.random.key(seed))
  return {'params': params, 'opt_state': tx.init(params),
          'step': jax.numpy.asarray(step, jax.numpy.int32),
          'rng': jax.random.key_data(rng)}


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
    return split(model)[1]

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


def check_lengths(cfg: ml_collections.ConfigDict, mc: ModelConfig) -> None:
  """Sequences must fit the model's max_len (a learned table has no more)."""
  for name, length in (('seq_len', cfg.seq_len),
                       ('data.src_len', cfg.data.get('src_len'))):
    if length is not None and length > mc.max_len:
      raise UsageError(f'config.{name}={length} exceeds model.max_len='
                       f'{mc.max_len}; raise max_len or shorten sequences.')


def setup(cfg: ml_collections.ConfigDict, tokenizer_vocab: int) -> Setup:
  mc = model_config(cfg, tokenizer_vocab)
  check_lengths(cfg, mc)
  cls = model_class(cfg)
  model_def, abstract_params = abstract(lambda: cls(mc, nnx.Rngs(0)))
  schedule = optim.make_schedule(cfg.optim, mc.d_model, cfg.num_steps)
  tx = optim.make_optimizer(cfg.optim, schedule, abstract_params)
  return Setup(mc, cls, model_def, abstract_params, schedule, tx)
