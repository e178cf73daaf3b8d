"""Pure, jit-able train and eval steps over a flat parameter dict, and
their jitted forms for a run's mesh (state shardings, donated state,
activation constraints): what the trainer runs and what a compile for a
target lowers.

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
from jax.sharding import NamedSharding, PartitionSpec

from jax_transformer.experiment import OptimConfig
from jax_transformer.model import attention, balance, lora, sharding
from jax_transformer.model.families import family_of
from jax_transformer.model.params import ModelDef
from jax_transformer.train import optim
from jax_transformer.train.losses import chunked_cross_entropy, cross_entropy

Batch = dict[str, jax.Array]
TrainState = dict[str, Any]


def _lengths(segment_ids: jax.Array) -> jax.Array:
  """Real tokens per right-padded row: segment_ids [B, T] -> [B] int32.

  An empty row (an eval batch's filler) counts one: a row with no key at
  all is a case fused kernels need not define, and its loss weight is 0.
  """
  return jnp.maximum((segment_ids > 0).sum(axis=1, dtype=jnp.int32), 1)


def forward(model: nnx.Module, batch: Batch, deterministic: bool,
            rngs: nnx.Rngs | None = None, packed: bool = True,
            return_hidden: bool = False):
  """Logits [B, T, V] (or the hidden states [B, T, D] under the head when
  return_hidden), targets [B, T] and weights [B, T] of a batch in the
  format of ``jax_transformer.data.batching`` that the model's family
  trains on (``Family.loss_call``: LM ``inputs``..., with ``loss_mask``
  weights only where it is 1; translation ``src``, ``tgt_in``...).

  packed=False promises one right-padded sequence per row (what the
  batcher makes without packing): attention then gets per-row lengths,
  which a fused kernel applies without reading a mask, instead of segments.
  """
  def row_masks(segment_ids):
    if packed:
      return {'segment_ids': segment_ids}
    return {'mask': _lengths(segment_ids), 'segment_ids': None}

  family = family_of(model)
  kwargs = {}
  if family.balances_rows:
    length = next(iter(batch.values())).shape[1]
    shards = attention.balanced_shards(model.config, length)
    if shards > 1:  # the loss sums over tokens: their order is free
      batch, kwargs = balance.balanced_batch(batch, shards), {'balanced': True}
  call = family.loss_call(batch, row_masks)
  out = model(*call.args, **call.kwargs, **kwargs,
              deterministic=deterministic, rngs=rngs,
              return_hidden=return_hidden)
  return out, call.targets, call.weights


def loss_sums(model: nnx.Module, batch: Batch, deterministic: bool,
              rngs: nnx.Rngs | None = None, *, label_smoothing: float = 0.0,
              z_loss: float = 0.0, packed: bool = True,
              loss_chunk_size: int = 0) -> dict[str, jax.Array]:
  """The sums of ``losses.cross_entropy`` for one batch.

  loss_chunk_size > 0: the head and the loss run over chunks of that many
  tokens (``losses.chunked_cross_entropy``), so float32 [B, T, V] logits
  never exist; the same sums to float rounding.
  """
  if not loss_chunk_size:
    logits, targets, weights = forward(model, batch, deterministic, rngs,
                                       packed)
    return cross_entropy(logits, targets, weights, label_smoothing, z_loss)
  hidden, targets, weights = forward(model, batch, deterministic, rngs,
                                     packed, return_hidden=True)
  return chunked_cross_entropy(
      hidden, model.head_kernel(), targets, weights, label_smoothing, z_loss,
      chunk_size=loss_chunk_size, compute_dtype=model.config.compute_dtype)


def make_train_step(model_def: ModelDef, tx: optax.GradientTransformation,
                    label_smoothing: float = 0.0, z_loss: float = 0.0, *,
                    packed: bool = True, loss_chunk_size: int = 0
                    ) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
  """One optimizer step (or one micro-step under gradient accumulation).

  The metrics are the step's loss sums (``loss_sums``), grad_norm (the
  norm of this step's gradient of the loss per target token, before
  clipping: under accumulation, of this micro-batch's alone) and, for an
  optimizer from ``optim.make_optimizer``, the counters of skipped
  updates (``optim.SKIP_COUNTERS``). ``tx`` gets the loss sum and the
  target tokens as the keyword arguments loss and tokens, which
  ``optim.skip_non_finite`` and ``optim.accumulate_per_token`` read (and
  any other optimizer ignores).
  packed and loss_chunk_size: see ``forward`` and ``loss_sums``.

  Where the params hold LoRA adapters, only they are differentiated and
  updated (``lora.trainable``); the frozen base passes through unchanged.
  """
  tx = optax.with_extra_args_support(tx)

  def loss_fn(trained, frozen, batch, key):
    params = {**frozen, **trained}
    # LoRA's applies its adapters factored: no weight gradient of a frozen
    # kernel (model/lora.py).
    sums = loss_sums(model_def.merge_for_training(params, key), batch, False,
                     nnx.Rngs(dropout=key), label_smoothing=label_smoothing,
                     z_loss=z_loss, packed=packed,
                     loss_chunk_size=loss_chunk_size)
    return sums['loss'] / jnp.maximum(sums['tokens'], 1.0), sums

  def train_step(state: TrainState, batch: Batch):
    key = jax.random.fold_in(jax.random.wrap_key_data(state['rng']),
                             state['step'])
    trained = lora.trainable(state['params'])
    frozen = lora.frozen(state['params'])
    grads, sums = jax.grad(loss_fn, has_aux=True)(trained, frozen, batch, key)
    updates, opt_state = tx.update(grads, state['opt_state'], trained,
                                   loss=sums['loss'], tokens=sums['tokens'])
    new_state = dict(state, params={**frozen, **optax.apply_updates(
                         trained, updates)},
                     opt_state=opt_state, step=state['step'] + 1)
    metrics = dict(sums, grad_norm=optax.tree.norm(grads),
                   **optim.skip_counts(opt_state))
    return new_state, metrics

  return train_step


def make_eval_step(model_def: ModelDef, *, packed: bool = True,
                   loss_chunk_size: int = 0
                   ) -> Callable[[dict, Batch], dict]:
  """Sums of nll and tokens on one batch (dropout off)."""

  def eval_step(params, batch):
    sums = loss_sums(model_def.merge(params), batch, True, packed=packed,
                     loss_chunk_size=loss_chunk_size)
    return {'nll': sums['nll'], 'tokens': sums['tokens']}

  return eval_step


def state_shardings(setup, mesh, abstract_state):
  """NamedShardings for the whole train state, planned before any compile."""
  param_specs = sharding.param_specs(setup.model_def.logical_axes)
  sharding.check_divisible(
      {k: v.shape for k, v in setup.abstract_params.items()}, param_specs,
      mesh)
  opt_specs = optax.tree_map_params(
      setup.tx, lambda _, spec: spec, abstract_state['opt_state'],
      lora.trainable(param_specs),
      transform_non_params=lambda _: PartitionSpec(),
      is_leaf=lambda x: isinstance(x, PartitionSpec))
  specs = {'params': param_specs, 'opt_state': opt_specs,
           'step': PartitionSpec(), 'rng': PartitionSpec()}
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                           is_leaf=lambda x: isinstance(x, PartitionSpec))
  return shardings, param_specs


def jit_train_step(optim: OptimConfig, packed: bool, loss_chunk_size: int,
                   setup, mesh, shardings):
  """The run's train step (its loss as ``optim`` says, over packed rows or
  not), jitted for its state shardings and mesh (the state is donated).
  Lower it under ``jax.sharding.use_abstract_mesh`` so that the activation
  constraints apply."""
  return jax.jit(
      make_train_step(setup.model_def, setup.tx, optim.label_smoothing,
                      optim.z_loss, packed=packed,
                      loss_chunk_size=loss_chunk_size),
      in_shardings=(shardings, sharding.batch_sharding(mesh)),
      out_shardings=(shardings, NamedSharding(mesh, PartitionSpec())),
      donate_argnums=0)


def jit_eval_step(loss_chunk_size: int, setup, mesh, shardings):
  """The run's eval step over its sharded params (evaluation batches are
  never packed, see data.pipeline); like jit_train_step, call or lower it
  with the mesh in context (``traced_under``)."""
  return jax.jit(
      make_eval_step(setup.model_def, packed=False,
                     loss_chunk_size=loss_chunk_size),
      in_shardings=(shardings['params'], sharding.batch_sharding(mesh)),
      out_shardings=NamedSharding(mesh, PartitionSpec()))


def sharded_abstract(abstract, shardings):
  """abstract (ShapeDtypeStructs) with the shardings of a placed state."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      abstract, shardings)


def traced_under(mesh, jitted):
  """jitted, traced with mesh in context, so that the models' activation
  sharding constraints (``sharding.constrain``) apply."""
  def call(*args):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return jitted(*args)
  return call
