"""Pure, jit-able train and eval steps over a flat parameter dict.

The train state is a plain dict pytree, which is also what checkpoints hold:
  params:    {dotted path: array}
  opt_state: the Optax state for params
  step:      int32 scalar, number of steps taken
  rng:       uint32[2] base key; step s uses fold_in(rng, s) for dropout
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jax_transformer.losses import cross_entropy
from jax_transformer.params import ModelDef

Batch = dict[str, jax.Array]
TrainState = dict[str, Any]


def forward(model: nnx.Module, batch: Batch, deterministic: bool,
            rngs: nnx.Rngs | None = None):
  """Logits [B, T, V], targets [B, T] and weights [B, T] for either batch
  format of ``jax_transformer.data.batching``: LM (``inputs``...) or
  translation (``src``, ``tgt_in``...)."""
  if 'src' in batch:
    logits = model(batch['src'], batch['tgt_in'], deterministic=deterministic,
                   src_segment_ids=batch['src_segment_ids'],
                   tgt_segment_ids=batch['tgt_segment_ids'],
                   src_positions=batch['src_positions'],
                   tgt_positions=batch['tgt_positions'], rngs=rngs)
    return logits, batch['tgt_out'], batch['tgt_segment_ids'] > 0
  logits = model(batch['inputs'], deterministic=deterministic,
                 segment_ids=batch['segment_ids'],
                 positions=batch['positions'], rngs=rngs)
  return logits, batch['targets'], batch['segment_ids'] > 0


def make_train_step(model_def: ModelDef, tx: optax.GradientTransformation,
                    label_smoothing: float = 0.0, z_loss: float = 0.0
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
  """One optimizer step (or one micro-step under gradient accumulation)."""

  def loss_fn(params, batch, key):
    model = model_def.merge(params)
    logits, targets, weights = forward(model, batch, False,
                                       nnx.Rngs(dropout=key))
    sums = cross_entropy(logits, targets, weights, label_smoothing, z_loss)
    return sums['loss'] / jnp.maximum(sums['tokens'], 1.0), sums

  def train_step(state: TrainState, batch: Batch):
    key = jax.random.fold_in(jax.random.wrap_key_data(state['rng']),
                             state['step'])
    grads, sums = jax.grad(loss_fn, has_aux=True)(state['params'], batch, key)
    updates, opt_state = tx.update(grads, state['opt_state'], state['params'])
    new_state = dict(state, params=optax.apply_updates(state['params'],
                                                       updates),
                     opt_state=opt_state, step=state['step'] + 1)
    metrics = dict(sums, grad_norm=optax.tree.norm(grads))
    return new_state, metrics

  return train_step


def make_eval_step(model_def: ModelDef) -> Callable[[dict, Batch], dict]:
  """Sums of nll and tokens on one batch (dropout off)."""

  def eval_step(params, batch):
    logits, targets, weights = forward(model_def.merge(params), batch, True)
    sums = cross_entropy(logits, targets, weights)
    return {'nll': sums['nll'], 'tokens': sums['tokens']}

  return eval_step
