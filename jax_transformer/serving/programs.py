"""The serving engine's compiled programs, over a KV cache laid out by slot.

The cache holds ``S`` rows (decode slots), each of ``L`` cache slots, with a
write index per row (``KVCache.index`` [S]): a request owns one row from its
prefill until its last token, and rows start and end at different times.

* :func:`prefill_fresh` runs a new request's prompt (right-padded to a
  bucket width ``C``) against an empty ``[P, K, C, H]`` cache and writes the
  ``C`` slots into its rows; only those slots move.
* :func:`prefill_more` runs the next chunk of a long prompt against the
  rows' whole caches (gathered, then written back).
* :func:`decode_step` advances every row by one token, reading the cache;
  :func:`write_step` then writes the new slots in place (one program
  doing both made XLA copy the cache each step). Rows without a request
  run masked (nothing they write is ever attended).

Each returns the token chosen after the last real token of each row, drawn
by :func:`choose` with that row's own sampling parameters.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from jax_transformer.decoding.inputs import constrain
from jax_transformer.decoding.sampling import allowed
from jax_transformer.model import attention as attn
from jax_transformer.model.attention import KVCache

Array = jax.Array


class Sampling(NamedTuple):
  """Per-row sampling parameters, one entry per row [R].

  temperature: float32, 0 = greedy (the argmax, lowest id among ties).
  top_p: float32 in (0, 1]: sample from the nucleus of this mass.
  keys: uint32 [R, 2], ``jax.random.key_data(jax.random.key(seed))``.
  drawn: int32, tokens the request has drawn before this one: token i is
    drawn with ``fold_in(key, i)``, so a seed gives the same answer whatever
    else shares the batch.
  """
  temperature: Array
  top_p: Array
  keys: Array
  drawn: Array


def choose(logits: Array, sampling: Sampling) -> Array:
  """One token per row: logits [R, V] float32 -> ids [R] int32."""
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

  def draw(nucleus: bool) -> Array:
    hot = sampling.temperature > 0
    scaled = logits / jnp.where(hot, sampling.temperature, 1.0)[:, None]
    if nucleus:
      keep = allowed(scaled, None, sampling.top_p[:, None])
      scaled = jnp.where(keep, scaled, -jnp.inf)
    keys = jax.vmap(jax.random.fold_in)(
        jax.random.wrap_key_data(sampling.keys), sampling.drawn)
    drawn = jax.vmap(jax.random.categorical)(keys, scaled).astype(jnp.int32)
    return jnp.where(hot, drawn, greedy)

  # The nucleus needs a sort of the vocabulary: only when a row asks.
  sampled = lambda: jax.lax.cond(  # noqa: E731
      jnp.any(sampling.top_p < 1), lambda: draw(True), lambda: draw(False))
  return jax.lax.cond(jnp.any(sampling.temperature > 0), sampled,
                      lambda: greedy)


def _last_real(mask: Array) -> Array:
  """The last True of each row: mask [R, C] -> [R] int32."""
  width = mask.shape[1]
  return (width - 1 - jnp.argmax(mask[:, ::-1], axis=1)).astype(jnp.int32)


def _rows(cache: KVCache, rows: Array) -> KVCache:
  """The cache of rows [P] alone: [P, K, L, H] each."""
  return cache._replace(keys=tuple(k[rows] for k in cache.keys),
                        values=tuple(v[rows] for v in cache.values),
                        valid=cache.valid[rows], index=cache.index[rows])


def _put_slots(cache: KVCache, rows: Array, part: KVCache, start: Array,
               width: int, index: Array) -> KVCache:
  """cache with slots [start[p], start[p] + width) of row rows[p] taken
  from part's row p (at the same slots), and that row's index set.

  Only those slots move, one dynamic-update-slice per row: writing whole
  rows, or scattering, makes XLA copy the whole cache first.
  """
  def put(whole, piece, axis):
    for p in range(piece.shape[0]):
      written = jax.lax.dynamic_slice_in_dim(piece[p:p + 1], start[p], width,
                                             axis=axis)
      at = [jnp.int32(0)] * whole.ndim
      at[0], at[axis] = rows[p], start[p]
      whole = jax.lax.dynamic_update_slice(whole, written, at)
    return whole

  return cache._replace(
      keys=tuple(put(k, n, 2) for k, n in zip(cache.keys, part.keys)),
      values=tuple(put(v, n, 2) for v, n in zip(cache.values, part.values)),
      valid=put(cache.valid, part.valid, 1),
      index=cache.index.at[rows].set(index))


def _first(cache: KVCache, n: int) -> KVCache:
  """The cache of its first n rows (itself when it has n)."""
  if n == cache.valid.shape[0]:
    return cache
  return jax.tree.map(lambda x: x[:n], cache)


_STATIC = ('graphdef', 'mesh')


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames='cache')
def prefill_fresh(graphdef, state, cache: KVCache, rows: Array, ids: Array,
                  mask: Array, sampling: Sampling, *, mesh=None):
  """New requests' prompts (or first chunks) into rows [P].

  ids, mask [P, C]: right-padded prompts, written to slots [0, C). The
  rest of each row is left as it was, never attended: its valid mask is
  cleared. Each row's index becomes its real length (so padding slots are
  overwritten by the tokens that follow). Returns (ids [P], cache).
  """
  model = nnx.merge(graphdef, state)
  p, c = ids.shape
  logits, part = model.extend(ids, model.init_cache(p, c), mask,
                              logits_at=_last_real(mask))
  cache = cache._replace(valid=cache.valid.at[rows].set(False))
  zeros = jnp.zeros((p,), jnp.int32)
  cache = _put_slots(cache, rows, part, zeros, c,
                     mask.sum(axis=1, dtype=jnp.int32))
  return choose(logits[:, 0], sampling), constrain(cache, mesh)


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames='cache')
def prefill_more(graphdef, state, cache: KVCache, rows: Array, ids: Array,
                 mask: Array, sampling: Sampling, *, mesh=None):
  """The next chunk of long prompts, ids and mask [P, C], after what rows
  [P] hold. Returns (ids [P], cache), as :func:`prefill_fresh`."""
  model = nnx.merge(graphdef, state)
  part = _rows(cache, rows)
  start = part.index
  logits, part = model.extend(ids, part, mask, logits_at=_last_real(mask))
  cache = _put_slots(cache, rows, part, start, ids.shape[1],
                     start + mask.sum(axis=1, dtype=jnp.int32))
  return choose(logits[:, 0], sampling), constrain(cache, mesh)


@functools.partial(jax.jit, static_argnames=_STATIC)
def decode_step(graphdef, state, cache: KVCache, tokens: Array,
                active: Array, sampling: Sampling, *, mesh=None):
  """The first R rows one token further, read: tokens [R] (each row's
  last), active [R] bool (rows holding a request). The cache is only read
  (the rows after R not at all: with few requests, a step costs what few
  rows cost; each R is its own program); :func:`write_step` writes what
  the step made. Returns (ids [R], attention.NewSlots)."""
  model = nnx.merge(graphdef, state)
  logits, new = model.extend(tokens[:, None], _first(cache, tokens.shape[0]),
                             active[:, None], write=False)
  return choose(logits[:, 0], sampling), new


@functools.partial(jax.jit, static_argnames=('mesh',),
                   donate_argnames='cache')
def write_step(cache: KVCache, new: attn.NewSlots, *, mesh=None) -> KVCache:
  """cache with a decode step's new slots written in place (its first R
  rows; a row without a request writes a slot it never attends and keeps
  its index, so a prompt's next chunk writes over it)."""
  return constrain(attn.write_new(cache, new), mesh)
