"""The sampling loop: one token per step from a prefilled cache, under one
jit."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from jax_transformer.decoding.inputs import Inputs, constrain
from jax_transformer.decoding.prefill import prefill
from jax_transformer.decoding.results import Generation

Array = jax.Array
TokenChooser = Callable[[Array, Array], Array]


@functools.partial(jax.jit, static_argnames=(
    'graphdef', 'max_new_tokens', 'sampler', 'mesh'))
def generate_jit(graphdef, state, inputs: Inputs, key: Array,
                  eos_id: Array, pad_id: Array, *, max_new_tokens: int,
                  sampler: TokenChooser, mesh: Mesh | None):
  # eos_id -1 (no EOS) matches no token.
  model = nnx.merge(graphdef, state)
  b, t = inputs.prompt.shape
  n = max_new_tokens
  # The last new token is never fed back, so it needs no slot.
  logits, cache = prefill(model, inputs, t + n - 1, mesh)
  first = sampler(logits, jax.random.fold_in(key, 0)).astype(jnp.int32)
  tokens = jnp.full((b, n), pad_id, jnp.int32).at[:, 0].set(first)
  done = first == eos_id
  lengths = jnp.where(done, 1, n).astype(jnp.int32)

  def cond(carry):
    i, _, done, _, _ = carry
    return (i < n) & ~jnp.all(done)

  def body(carry):
    i, tokens, done, lengths, cache = carry
    previous = jax.lax.dynamic_slice_in_dim(tokens, i - 1, 1, axis=1)
    logits, cache = model.extend(previous, cache)
    token = sampler(logits[:, 0], jax.random.fold_in(key, i)).astype(
        jnp.int32)
    token = jnp.where(done, pad_id, token)
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], i,
                                                 axis=1)
    ended = ~done & (token == eos_id)
    lengths = jnp.where(ended, i + 1, lengths)
    done = done | ended
    return (i + 1, constrain(tokens, mesh), done, lengths,
            constrain(cache, mesh))

  carry = (jnp.int32(1), constrain(tokens, mesh), done, lengths, cache)
  _, tokens, _, lengths, _ = jax.lax.while_loop(cond, body, carry)
  return Generation(tokens, lengths)
