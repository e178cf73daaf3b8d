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
from jax_transformer.model.attention import KVCache

Array = jax.Array
TokenChooser = Callable[[Array, Array], Array]


# New tokens per fixed-trip inner loop. The "all finished?" test runs
# between chunks only: a data-dependent loop condition costs XLA:GPU a
# device-to-host copy and a wait per iteration, a fixed trip count does not.
# A chunk may run up to CHUNK - 1 steps past the last useful one.
CHUNK = 16


def chunk_size(steps: int) -> int:
  return max(1, min(CHUNK, steps))


def in_chunks(body: Callable, carry, first: int, last: int, chunk: int,
              more: Callable):
  """Runs ``carry = body(i, carry)`` for i = first, first + 1, ... in
  fixed-trip chunks of ``chunk`` steps, while i < last and ``more(carry)``
  (both checked between chunks). Steps past ``last - 1`` in the final chunk
  run too: ``body`` must make them harmless."""

  def chunk_body(state):
    i, carry = state
    carry = jax.lax.fori_loop(0, chunk, lambda j, c: body(i + j, c), carry)
    return i + chunk, carry

  def cond(state):
    i, carry = state
    return (i < last) & more(carry)

  return jax.lax.while_loop(cond, chunk_body, (jnp.int32(first), carry))[1]


def within(cache: KVCache) -> KVCache:
  """The cache with its write index held at its last slot at most.

  A chunk's overrun steps (see ``in_chunks``) would write past the cache's
  end, which ``extend`` refuses; held, they rewrite the last slot, after
  every result they could change is final.
  """
  return cache._replace(index=jnp.minimum(cache.index, cache.max_len - 1))


@functools.partial(jax.jit, static_argnames=(
    'graphdef', 'max_new_tokens', 'sampler', 'mesh', 'prefill_chunk'))
def generate_jit(graphdef, state, inputs: Inputs, key: Array,
                 eos_id: Array, pad_id: Array, *, max_new_tokens: int,
                 sampler: TokenChooser, mesh: Mesh | None,
                 prefill_chunk: int | None = None):
  # eos_id -1 (no EOS) matches no token.
  model = nnx.merge(graphdef, state)
  b, t = inputs.prompt.shape
  n = max_new_tokens
  chunk = chunk_size(n - 1)
  # Room for the final chunk's overrun; sliced off at the end.
  width = 1 + chunk * -(-(n - 1) // chunk)
  # The last new token is never fed back, so it needs no slot. Overrun
  # steps rewrite the cache's last slot (see within) after every returned
  # token is final, which is harmless.
  logits, cache = prefill(model, inputs, n - 1, mesh, prefill_chunk)
  first = sampler(logits, jax.random.fold_in(key, 0)).astype(jnp.int32)
  tokens = jnp.full((b, width), pad_id, jnp.int32).at[:, 0].set(first)
  done = first == eos_id
  lengths = jnp.where(done, 1, n).astype(jnp.int32)

  def step(i, carry):
    tokens, done, lengths, cache = carry
    previous = jax.lax.dynamic_slice_in_dim(tokens, i - 1, 1, axis=1)
    logits, cache = model.extend(previous, within(cache))
    token = sampler(logits[:, 0], jax.random.fold_in(key, i)).astype(
        jnp.int32)
    token = jnp.where(done, pad_id, token)
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None], i,
                                                 axis=1)
    ended = ~done & (token == eos_id) & (i < n)
    lengths = jnp.where(ended, i + 1, lengths)
    return (constrain(tokens, mesh), done | ended, lengths,
            constrain(cache, mesh))

  carry = (constrain(tokens, mesh), done, lengths, cache)
  tokens, _, lengths, _ = in_chunks(step, carry, 1, n, chunk,
                                    lambda c: ~jnp.all(c[1]))
  return Generation(tokens[:, :n], lengths)
