"""Beam search with GNMT's length penalty, under one jit."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from jax_transformer.attention import KVCache
from jax_transformer.decoding.inputs import Inputs, constrain
from jax_transformer.decoding.prefill import prefill
from jax_transformer.decoding.results import BeamResult

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


def _beam_step(t: int | Array, logp: Array, beams: _Beams, *, beam_size: int,
               alpha: float, max_len: int, eos_id: Array):
  """Extends every live beam by every token and keeps the best.

  logp [B, K, V]: next-token log-probabilities of the live beams; t: the
  slot (0-based) the new token goes to. Of the 2K best extensions (by
  log-probability), those among the best K that end with EOS (or all of
  the best K at the last slot) enter the finished set, which keeps the K
  best by penalised score; the K best extensions not ending in EOS live on.
  A sequence is done once it holds K finished hypotheses (or at the last
  slot). Returns (new beams, parent beam of each live beam [B, K]).
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
  finished_score, keep = jax.lax.top_k(pool_score, k)
  live_logp, live = jax.lax.top_k(jnp.where(is_eos, -jnp.inf, top_logp), k)
  done = (beams.done | (jnp.sum(finished_score > -jnp.inf, axis=1) >= k)
          | (t == max_len - 1))
  new = _Beams(
      alive=_gather_beams(seqs, live), alive_logp=live_logp,
      finished=_gather_beams(pool_seqs, keep), finished_score=finished_score,
      finished_len=jnp.take_along_axis(pool_len, keep, axis=1), done=done)
  return new, jnp.take_along_axis(parent, live, axis=1)


def _reorder_cache(cache: KVCache, parent: Array) -> KVCache:
  """Self-attention rows [B*K, ...] follow their parent beams [B, K].

  The cross-attention keys/values are the same for every beam of a
  sequence, so they are not moved.
  """
  b, k = parent.shape

  def regroup(x):
    y = _gather_beams(x.reshape(b, k, *x.shape[1:]), parent)
    return y.reshape(x.shape)

  return cache._replace(keys=tuple(map(regroup, cache.keys)),
                        values=tuple(map(regroup, cache.values)),
                        valid=regroup(cache.valid))


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
  logits, cache = prefill(model, inputs, t + n - 1, mesh)
  cache = jax.tree.map(
      lambda x: x if x.ndim == 0 else jnp.repeat(x, k, axis=0), cache)
  cache = constrain(cache, mesh)
  logp = jax.nn.log_softmax(logits, axis=-1)
  logp = jnp.broadcast_to(logp[:, None], (b, k, logp.shape[-1]))
  empty = jnp.full((b, k), -jnp.inf, jnp.float32)
  beams = _Beams(
      alive=jnp.full((b, k, n), pad_id, jnp.int32),
      # One live beam to start from, so the first step has no duplicates.
      alive_logp=empty.at[:, 0].set(0.0),
      finished=jnp.full((b, k, n), pad_id, jnp.int32),
      finished_score=empty, finished_len=jnp.zeros((b, k), jnp.int32),
      done=jnp.zeros((b,), bool))
  step = functools.partial(_beam_step, beam_size=k, alpha=alpha, max_len=n,
                           eos_id=eos_id)

  def advance(i, beams, parent, cache):
    """Feeds the live beams' newest tokens: next log-probs [B, K, V]."""
    cache = _reorder_cache(cache, parent)
    newest = jax.lax.dynamic_slice_in_dim(beams.alive, i, 1, axis=2)
    logits, cache = model.extend(newest.reshape(b * k, 1), cache)
    logp = jax.nn.log_softmax(logits[:, 0], axis=-1).reshape(b, k, -1)
    return logp, constrain(cache, mesh)

  def cond(carry):
    i, beams, _, _ = carry
    return (i < n) & ~jnp.all(beams.done)

  def body(carry):
    i, beams, logp, cache = carry
    beams, parent = step(i, logp, beams)
    beams = constrain(beams, mesh)
    # The last step's extensions are never fed back.
    logp, cache = jax.lax.cond(
        (i + 1 < n) & ~jnp.all(beams.done),
        lambda: advance(i, beams, parent, cache), lambda: (logp, cache))
    return i + 1, beams, logp, cache

  _, beams, _, _ = jax.lax.while_loop(
      cond, body, (jnp.int32(0), constrain(beams, mesh), logp, cache))
  return BeamResult(beams.finished[:, 0], beams.finished_score[:, 0],
                    beams.finished_len[:, 0])
