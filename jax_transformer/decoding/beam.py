"""Beam search with GNMT's length penalty, under one jit."""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from jax_transformer.decoding.inputs import Inputs, constrain
from jax_transformer.decoding.loop import chunk_size, in_chunks, within
from jax_transformer.decoding.prefill import prefill, start
from jax_transformer.decoding.results import BeamResult
from jax_transformer.model.attention import KVCache

Array = jax.Array


def length_penalty(length, alpha: float):
  """GNMT's ((5 + length) / 6) ** alpha (Wu et al., 2016, eq. 14)."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


class _Beams(NamedTuple):
  """Beam state for B sequences with K beams each, L new-token slots."""
  alive: Array           # [B, K, L] int32 tokens of the live hypotheses
  alive_logp: Array      # [B, K] float32 log-probabilities (-inf: empty)
  finished: Array        # [B, K, L] int32 the best finished, best first
  finished_score: Array  # [B, K] float32 penalised scores (-inf: empty)
  finished_len: Array    # [B, K] int32
  done: Array            # [B] bool: no more hypotheses accepted


def _gather_beams(x: Array, index: Array) -> Array:
  """x [B, K, ...] -> x[b, index[b, j], ...] for index [B, J]."""
  index = index.reshape(index.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1)


def _empty_beams(b: int, k: int, n: int, pad_id: Array) -> _Beams:
  """B sequences, each with one live beam of log-probability 0 (so the
  first step has no duplicates), K - 1 empty ones and nothing finished."""
  empty = jnp.full((b, k), -jnp.inf, jnp.float32)
  return _Beams(
      alive=jnp.full((b, k, n), pad_id, jnp.int32),
      alive_logp=empty.at[:, 0].set(0.0),
      finished=jnp.full((b, k, n), pad_id, jnp.int32),
      finished_score=empty, finished_len=jnp.zeros((b, k), jnp.int32),
      done=jnp.zeros((b,), bool))


def _settled(finished_score: Array, live_logp: Array, *, alpha: float,
             max_len: int) -> Array:
  """[B] bool: no live beam can still enter the K finished hypotheses.

  finished_score [B, K] best first, live_logp [B, K] best first. A live
  beam's log-probability only falls as it grows, and (alpha >= 0) the
  penalty only rises with length, so nothing it grows into scores above
  its log-probability over the penalty at max_len: once the worst of K
  finished scores reaches that bound for the best live beam, the finished
  set is final (the bound of T2T, T5X and Flax).
  """
  worst = finished_score[:, -1]
  if finished_score.shape[1] == 1:
    # One beam is greedy decoding: it ends with its first finished
    # hypothesis, though with alpha > 0 its runner-up could still win.
    return worst > -jnp.inf
  bound = live_logp[:, 0] / length_penalty(max_len, alpha)
  return (worst > -jnp.inf) & (worst >= bound)


def _beam_step(t: int | Array, logp: Array, beams: _Beams, *, beam_size: int,
               alpha: float, max_len: int, eos_id: Array):
  """Extends every live beam by every token and keeps the best.

  logp [B, K, V]: next-token log-probabilities of the live beams; t: the
  slot (0-based) the new token goes to. Of the 2K best extensions (by
  log-probability), those among the best K that end with EOS (or all of
  the best K at the last slot) enter the finished set, which keeps the K
  best by penalised score; the K best extensions not ending in EOS live on.
  A sequence is done once no live beam can enter its K finished (see
  ``_settled``), or at the last slot; a done sequence takes no more.
  Returns (new beams, parent beam of each live beam [B, K]).
  """
  b, k, v = logp.shape
  candidates = (beams.alive_logp[:, :, None] + logp).reshape(b, k * v)
  top_logp, top = jax.lax.top_k(candidates, min(2 * k, k * v))   # [B, 2K]
  parent, token = top // v, (top % v).astype(jnp.int32)
  seqs = _gather_beams(beams.alive, parent)                        # [B,2K,L]
  seqs = jax.lax.dynamic_update_slice_in_dim(seqs, token[:, :, None], t,
                                             axis=2)
  is_eos = token == eos_id
  best_k = jnp.arange(top.shape[1]) < k
  finishing = best_k & (is_eos | (t == max_len - 1)) & ~beams.done[:, None]
  length = t + 1
  new_score = jnp.where(finishing, top_logp / length_penalty(length, alpha),
                        -jnp.inf)
  pool_score = jnp.concatenate([beams.finished_score, new_score], axis=1)
  pool_seqs = jnp.concatenate([beams.finished, seqs], axis=1)
  pool_len = jnp.concatenate(
      [beams.finished_len, jnp.full(new_score.shape, length, jnp.int32)],
      axis=1)
  # On ties the finished hypotheses come first (lower index): a newcomer
  # only enters by scoring strictly better.
  finished_score, keep = jax.lax.top_k(pool_score, k)
  live_logp, live = jax.lax.top_k(jnp.where(is_eos, -jnp.inf, top_logp), k)
  settled = _settled(finished_score, live_logp, alpha=alpha, max_len=max_len)
  done = beams.done | settled | (t == max_len - 1)
  new = _Beams(
      alive=_gather_beams(seqs, live), alive_logp=live_logp,
      finished=_gather_beams(pool_seqs, keep), finished_score=finished_score,
      finished_len=jnp.take_along_axis(pool_len, keep, axis=1), done=done)
  return new, jnp.take_along_axis(parent, live, axis=1)


def _slot_axes(empty_cache: Callable[[int], KVCache], slots: int):
  """Per cache leaf, the axis that holds its slots, or -1 for a leaf
  without slots (the cross-attention keys/values, the index).

  empty_cache(slots) builds a cache; the axis is where one of a slot more
  differs in shape, so beam search follows the attention's cache layout
  instead of restating it.
  """
  short, longer = (jax.eval_shape(functools.partial(empty_cache, s))
                   for s in (slots, slots + 1))

  def differing(a, b):
    return next((i for i, (m, n) in enumerate(zip(a.shape, b.shape))
                 if m != n), -1)

  return jax.tree.map(differing, short, longer)


def _reorder_cache(cache: KVCache, parent: Array, first: int,
                   axes) -> KVCache:
  """Cache rows [B*K, ...] follow their parent beams [B, K] in the slots
  from ``first`` on (axes: each leaf's slot axis, from ``_slot_axes``).

  Slots before ``first`` hold the prompt, prefilled once per sequence and
  copied to each of its beams, so they are the same in every beam of a
  sequence, as are the leaves without slots (the cross-attention
  keys/values): moving only the new tokens' slots saves copying a long
  prompt's keys and values every step.
  """
  b, k = parent.shape

  def regroup(x, axis):
    if axis < 0:
      return x
    y = jax.lax.slice_in_dim(x, first, None, axis=axis)
    y = _gather_beams(y.reshape(b, k, *y.shape[1:]), parent).reshape(y.shape)
    return jax.lax.dynamic_update_slice_in_dim(x, y, first, axis=axis)

  return jax.tree.map(regroup, cache, axes)


@functools.partial(jax.jit, static_argnames=(
    'graphdef', 'beam_size', 'alpha', 'max_len', 'mesh'))
def beam_search_jit(graphdef, state, inputs: Inputs, eos_id: Array,
                     pad_id: Array, *, beam_size: int, alpha: float,
                     max_len: int, mesh: Mesh | None):
  model = nnx.merge(graphdef, state)
  b, t = inputs.prompt.shape
  k, n = beam_size, max_len
  # The prompt is run once per sequence, then its cache copied per beam
  # (cross-attention keys/values included: computed once, repeated).
  logits, cache = prefill(model, inputs, n - 1, mesh)
  axes = _slot_axes(functools.partial(start, model, inputs), t + n - 1)
  cache = jax.tree.map(
      lambda x: x if x.ndim == 0 else jnp.repeat(x, k, axis=0), cache)
  cache = constrain(cache, mesh)
  logp = jax.nn.log_softmax(logits, axis=-1)
  logp = jnp.broadcast_to(logp[:, None], (b, k, logp.shape[-1]))
  step = functools.partial(_beam_step, beam_size=k, alpha=alpha, max_len=n,
                           eos_id=eos_id)

  def advance(i, beams, parent, cache):
    """Feeds the live beams' tokens at slot i: next log-probs [B, K, V]."""
    cache = _reorder_cache(cache, parent, t, axes)
    newest = jax.lax.dynamic_slice_in_dim(beams.alive, i, 1, axis=2)
    logits, cache = model.extend(newest.reshape(b * k, 1), within(cache))
    logp = jax.nn.log_softmax(logits[:, 0], axis=-1).reshape(b, k, -1)
    return logp, constrain(cache, mesh)

  def body(i, carry):
    # Feeding comes before extending, so the loop's own condition decides
    # whether a step's extensions are fed back: the last step's never are,
    # and no lax.cond (a host round-trip per step on XLA:GPU) is needed.
    # Steps past the last slot (a chunk's overrun) find every row done,
    # and a done row takes no more hypotheses.
    beams, parent, cache = carry
    logp, cache = advance(i - 1, beams, parent, cache)
    beams, parent = step(i, logp, beams)
    return constrain(beams, mesh), parent, cache

  beams, parent = step(0, logp, _empty_beams(b, k, n, pad_id))
  beams, _, _ = in_chunks(body, (constrain(beams, mesh), parent, cache), 1,
                          n, chunk_size(n - 1),
                          lambda carry: ~jnp.all(carry[0].done))
  return BeamResult(beams.finished[:, 0], beams.finished_score[:, 0],
                    beams.finished_len[:, 0])
