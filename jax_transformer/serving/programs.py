"""The serving engine's compiled programs, over a KV cache laid out by row.

The cache holds ``C`` rows (the engine's capacity, which it grows and
shrinks with the requests it holds), each of ``L`` cache slots, with a
write index per row (``KVCache.index`` [C]): a request owns one row from
its prefill until its last token, and rows start and end at different
times.

* :func:`prefill_fresh` runs new requests' prompts (right-padded to a
  bucket width ``W``) against an empty ``[P, K, W, H]`` cache, and
  :func:`prefill_more` the next chunk of long prompts against their rows
  (taken by :func:`take_rows`); each returns the rows' new caches, which
  :func:`put_rows` writes into theirs: only those slots move.
* :func:`decode_step` advances every row by one token, reading the cache;
  :func:`write_step` then writes the new slots in place (one program
  doing both made XLA copy the cache each step). Rows without a request
  run masked (nothing they write is ever attended).
* :func:`resize` and :func:`move_row` change the capacity and pack the
  rows: a step reads a whole cache, never a slice of one (XLA:CPU copies
  a slice before a dot reads it, at a few GB/s: a step over 8 of 32 rows
  cost 88 ms against 48 ms over a cache of 8).

The decoding programs return the token chosen after the last real token
of each row, drawn by :func:`choose` with that row's own sampling
parameters.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental import checkify

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


def greedy(logits: Array) -> Array:
  """The argmax of each row, the lowest id among ties: logits [R, V] ->
  [R] int32. A max and a min: XLA:CPU's argmax (one reduction over value
  and index pairs) took 3.9 ms at 32 rows of GPT-2's vocabulary, these
  2.1 ms."""
  ids = jnp.arange(logits.shape[-1], dtype=jnp.int32)
  top = logits.max(axis=-1, keepdims=True)
  # A NaN is the max (as argmax has it): max() is NaN, and equals nothing.
  hit = (logits == top) | jnp.isnan(logits)
  return jnp.min(jnp.where(hit, ids, logits.shape[-1]), axis=-1)


def choose(logits: Array, sampling: Sampling) -> Array:
  """One token per row: logits [R, V] float32 -> ids [R] int32."""
  greedy_ids = greedy(logits)

  def draw(nucleus: bool) -> Array:
    hot = sampling.temperature > 0
    scaled = logits / jnp.where(hot, sampling.temperature, 1.0)[:, None]
    if nucleus:
      keep = allowed(scaled, None, sampling.top_p[:, None])
      scaled = jnp.where(keep, scaled, -jnp.inf)
    keys = jax.vmap(jax.random.fold_in)(
        jax.random.wrap_key_data(sampling.keys), sampling.drawn)
    drawn = jax.vmap(jax.random.categorical)(keys, scaled).astype(jnp.int32)
    return jnp.where(hot, drawn, greedy_ids)

  # The nucleus needs a sort of the vocabulary: only when a row asks.
  sampled = lambda: jax.lax.cond(  # noqa: E731
      jnp.any(sampling.top_p < 1), lambda: draw(True), lambda: draw(False))
  return jax.lax.cond(jnp.any(sampling.temperature > 0), sampled,
                      lambda: greedy_ids)


def _last_real(mask: Array) -> Array:
  """The last True of each row: mask [R, C] -> [R] int32."""
  width = mask.shape[1]
  return (width - 1 - jnp.argmax(mask[:, ::-1], axis=1)).astype(jnp.int32)


def prefill_fresh(graphdef, state, ids: Array, mask: Array,
                  sampling: Sampling, *, mesh=None):
  """New requests' prompts (or first chunks), ids and mask [P, W]
  right-padded. Returns (ids [P], their rows' caches [P, K, W, H]), each
  row's index its real length (so padding slots are overwritten by the
  tokens that follow)."""
  model = nnx.merge(graphdef, state)
  p, w = ids.shape
  logits, part = model.extend(ids, model.init_cache(p, w), mask,
                              logits_at=_last_real(mask))
  part = part._replace(index=mask.sum(axis=1, dtype=jnp.int32))
  return choose(logits[:, 0], sampling), constrain(part, mesh)


def prefill_more(graphdef, state, part: KVCache, ids: Array, mask: Array,
                 sampling: Sampling, *, mesh=None):
  """The next chunk of long prompts, ids and mask [P, W], after what their
  rows' caches part [P, K, L, H] hold. Returns (ids [P], part extended)."""
  model = nnx.merge(graphdef, state)
  start = part.index
  logits, part = model.extend(ids, part, mask, logits_at=_last_real(mask))
  part = part._replace(index=start + mask.sum(axis=1, dtype=jnp.int32))
  return choose(logits[:, 0], sampling), constrain(part, mesh)


def take_rows(cache: KVCache, rows: Array, *, mesh=None) -> KVCache:
  """The caches of rows [P] alone: [P, K, L, H] each."""
  return constrain(jax.tree.map(lambda x: x[rows], cache), mesh)


def put_rows(cache: KVCache, rows: Array, part: KVCache, start: Array, *,
             width: int, mesh=None) -> KVCache:
  """cache with slots [start[p], start[p] + width) of row rows[p] taken
  from part's row p ([P, K, W, H], the same slots), and that row's valid
  mask (part's; the slots after W empty, never attended) and index.

  Only those slots move, one dynamic-update-slice per row: writing whole
  rows, or scattering, makes XLA copy the whole cache first. (The valid
  masks, [C, L] booleans, are written whole.)
  """
  valid = jnp.pad(part.valid, ((0, 0), (0, cache.max_len - part.max_len)))

  def put(whole, piece, axis, size, first):
    for p in range(piece.shape[0]):
      written = jax.lax.dynamic_slice_in_dim(piece[p:p + 1], first[p], size,
                                             axis=axis)
      at = [jnp.int32(0)] * whole.ndim
      at[0], at[axis] = rows[p], first[p]
      whole = jax.lax.dynamic_update_slice(whole, written, at)
    return whole

  slots = functools.partial(put, axis=2, size=width, first=start)
  return constrain(cache._replace(
      keys=tuple(map(slots, cache.keys, part.keys)),
      values=tuple(map(slots, cache.values, part.values)),
      valid=put(cache.valid, valid, 1, cache.max_len, jnp.zeros_like(start)),
      index=cache.index.at[rows].set(part.index)), mesh)


def empty_cache(graphdef, state, *, rows: int, length: int,
                mesh=None) -> KVCache:
  """A cache of rows x length empty slots, one index per row, laid out as
  the other programs leave it (so that they see one input sharding)."""
  cache = nnx.merge(graphdef, state).init_cache(rows, length)
  return constrain(cache._replace(index=jnp.zeros((rows,), jnp.int32)),
                   mesh)


def decode_step(graphdef, state, cache: KVCache, tokens: Array,
                active: Array, sampling: Sampling, *, mesh=None):
  """Every row one token further, read: tokens [C] (each row's last),
  active [C] bool (rows holding a request). The cache is only read;
  :func:`write_step` writes what the step made. Returns (ids [C],
  attention.NewSlots)."""
  model = nnx.merge(graphdef, state)
  logits, new = model.extend(tokens[:, None], cache, active[:, None],
                             write=False)
  return choose(logits[:, 0], sampling), new


def write_step(cache: KVCache, new: attn.NewSlots, *, mesh=None) -> KVCache:
  """cache with a decode step's new slots written in place (a row without
  a request writes a slot it never attends and keeps its index, so a
  prompt's next chunk writes over it)."""
  return constrain(attn.write_new(cache, new), mesh)


def resize(cache: KVCache, *, rows: int, mesh=None) -> KVCache:
  """cache with its first ``rows`` rows, or grown to ``rows`` with empty
  rows after its own."""
  def fit(x):
    have = x.shape[0]
    if rows <= have:
      return x[:rows]
    return jnp.pad(x, ((0, rows - have),) + ((0, 0),) * (x.ndim - 1))
  return constrain(jax.tree.map(fit, cache), mesh)


def move_row(cache: KVCache, source: Array, target: Array, *,
             mesh=None) -> KVCache:
  """cache with row ``source`` copied to row ``target`` (in place)."""
  def move(x):
    row = jax.lax.dynamic_slice_in_dim(x, source, 1, axis=0)
    return jax.lax.dynamic_update_slice_in_dim(x, row, target, axis=0)
  return constrain(jax.tree.map(move, cache), mesh)


class Programs(NamedTuple):
  """The programs above, jitted for one model and mesh: each takes its
  arguments after graphdef, without mesh."""
  prefill_fresh: Callable
  prefill_more: Callable
  take_rows: Callable
  put_rows: Callable
  empty_cache: Callable
  decode_step: Callable
  write_step: Callable
  resize: Callable
  move_row: Callable


def _unchecked(program: Callable) -> Callable:
  """program with the model's traced checks (``attention.check_room``'s
  ``checkify.debug_check``) discharged, as a jitted call without checkify
  drops them: left in, their effect sends every call through JAX's Python
  dispatch, about 6 ms a call (a third of a GPT-2 small decode step on 2
  cores). The engine sizes every request to its row before it joins."""
  checked = checkify.checkify(program, errors=checkify.user_checks)

  @functools.wraps(program)
  def run(*args, **kwargs):
    return checked(*args, **kwargs)[1]
  return run


def bind(graphdef, mesh=None) -> Programs:
  """The programs jitted with graphdef and mesh bound, not passed (a
  static argument is hashed on every call: a model's graphdef, a
  millisecond or more), each on JAX's fast dispatch path (those that run
  the model with its traced checks discharged)."""
  def jit(program, *bound, donate=(), static=(), checks=False):
    program = functools.partial(program, *bound, mesh=mesh)
    return jax.jit(_unchecked(program) if checks else program,
                   donate_argnames=donate, static_argnames=static)
  return Programs(
      prefill_fresh=jit(prefill_fresh, graphdef, checks=True),
      prefill_more=jit(prefill_more, graphdef, donate='part', checks=True),
      take_rows=jit(take_rows),
      put_rows=jit(put_rows, donate='cache', static='width'),
      empty_cache=jit(empty_cache, graphdef, static=('rows', 'length')),
      decode_step=jit(decode_step, graphdef, checks=True),
      write_step=jit(write_step, donate='cache'),
      resize=jit(resize, static='rows'),
      move_row=jit(move_row, donate='cache'))
