"""Log-likelihoods of continuations under a DecoderLM, many at once.

What a log-likelihood request asks, once it is tokens: the ids the model
reads (``inputs``, at most ``max_len``) and the continuation (``targets``),
predicted by the last ``len(targets)`` positions; the answer is the
continuation's summed log-probability and whether every one of its tokens
is the argmax.

A request's inputs are a *prefix* (up to the position that predicts the
first target) and a *suffix* (the continuation but its last token).
Requests that share a prefix (a multiple-choice question's choices) share
its computation: each batch prefills its distinct prefixes once into a KV
cache (``model.extend``), gives every request its prefix's cache rows, and
extends them with its suffix; the head runs at the continuation's positions
only. Requests are ordered so that equal prefixes meet in one batch,
longest first, ``batch_size`` requests at a time.

Every dimension is padded to a rung of a short ladder (widths: four
rungs per octave from :data:`MIN_WIDTH` up to ``max_len``; suffixes the
same from 1; row counts: doublings of the mesh's batch shards up to
``batch_size``), so the number of compiled programs is bounded by the
ladders, whatever the task; both stages' batches are split over the
mesh's batch axes (``'data'`` and ``'fsdp'``). A batch that sharing would
not save :data:`SHARING_PAYS` of its tokens takes one plain forward per
request instead.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from jax_transformer.model import sharding

MIN_WIDTH = 32


def ladder(limit: int, start: int = MIN_WIDTH, fine: bool = True
           ) -> list[int]:
  """Rungs up to ``limit``: powers of two from ``start``, four per octave
  from 16 on where ``fine`` (16, 20, 24, 28, 32, 40, ...: padding wastes
  under a quarter), then ``limit``."""
  out, width = [], start
  while width < limit:
    out.append(width)
    octave = 1 << (width.bit_length() - 1)
    width += octave // 4 if fine and width >= 16 else width
  return [*out, limit]


def bucket(n: int, limit: int, start: int = MIN_WIDTH,
           fine: bool = True) -> int:
  """The smallest rung of ``ladder(limit, start, fine)`` that holds n."""
  return next(w for w in ladder(limit, start, fine) if w >= n)


def on_host(tree):
  """Host copies of arrays that may span other processes' devices (a
  multi-host run's batch): every process gets the whole."""
  if jax.process_count() > 1:
    return multihost_utils.process_allgather(tree, tiled=True)
  return jax.device_get(tree)


def rows_for(n: int, batch_size: int, shards: int = 1) -> int:
  """Rows of a batch holding n requests: batch_size, or for a last, short
  batch the rung of ``ladder(batch_size, shards)`` that holds them (a
  multiple of the mesh's batch shards)."""
  return bucket(n, batch_size, shards, fine=False)


@dataclasses.dataclass(frozen=True)
class Request:
  """inputs: the ids the model reads (left-truncated already); targets:
  the continuation, predicted by the last len(targets) positions."""
  inputs: tuple[int, ...]
  targets: tuple[int, ...]

  @property
  def split(self) -> int:
    """Inputs before the suffix: the prefix's length."""
    return len(self.inputs) - len(self.targets) + 1


# Positions whose logits exist at once: [HEAD_CHUNK, V] float32 and its
# reductions stay near the cache, where the whole [B, C, V] would make
# three passes through memory (GPT-2's head over 16 x 256 positions on 2
# CPU cores: 2.2 s chunked against 3.1 s and more whole).
HEAD_CHUNK = 64


def _per_token(model, hidden, targets):
  """hidden [N, D], targets [N] -> (log P(target) [N], target is the
  argmax [N]), the head applied HEAD_CHUNK rows at a time."""
  n = hidden.shape[0]
  chunks = -(-n // HEAD_CHUNK)
  pad = chunks * HEAD_CHUNK - n
  hidden = jnp.pad(hidden, ((0, pad), (0, 0))).reshape(
      chunks, HEAD_CHUNK, -1)
  targets = jnp.pad(targets, (0, pad)).reshape(chunks, HEAD_CHUNK)
  dtype = model.config.compute_dtype
  kernel = model.head_kernel().astype(dtype)

  def chunk(args):
    h, t = args
    logits = jnp.einsum('ND,DV->NV', h.astype(dtype), kernel,
                        preferred_element_type=jnp.float32)
    chosen = jnp.take_along_axis(logits, t[:, None], axis=-1)[:, 0]
    return (chosen - jax.nn.logsumexp(logits, axis=-1),
            jnp.argmax(logits, axis=-1) == t)

  logprob, greedy = jax.lax.map(chunk, (hidden, targets))
  return logprob.reshape(-1)[:n], greedy.reshape(-1)[:n]


def _per_request(model, hidden, targets, valid):
  """hidden [B, C, D] at the positions predicting targets [B, C], of which
  valid [B, C] are real -> (summed log-probability [B], every real target
  the argmax [B])."""
  b, c = targets.shape
  logprob, greedy = _per_token(model, hidden.reshape(b * c, -1),
                               targets.reshape(-1))
  logprob = jnp.where(valid, logprob.reshape(b, c), 0.0).sum(axis=-1)
  greedy = jnp.where(valid, greedy.reshape(b, c), True).all(axis=-1)
  return logprob, greedy


@functools.partial(jax.jit, static_argnames=('graphdef',))
def _score(graphdef, state, prefix, prefix_mask, owner, suffix, suffix_mask,
           targets, valid):
  """prefix, prefix_mask [P, Wp]: the batch's distinct prefixes; owner [B]:
  each request's prefix; suffix, suffix_mask [B, Ws] (Ws may be 0);
  targets, valid [B, Ws + 1], left-aligned: target 0 is predicted at the
  prefix's last position, target j at suffix position j - 1.
  -> (summed log-probability [B] float32, every target the argmax [B])."""
  model = nnx.merge(graphdef, state)
  p, wp = prefix.shape
  ws = suffix.shape[1]
  cache = model.init_cache(p, wp + ws)
  last = prefix_mask.sum(axis=1) - 1
  first, cache = model.extend(prefix, cache, prefix_mask, logits_at=last,
                              return_hidden=True)
  hidden = first[owner]                                      # [B, 1, D]
  if ws:
    cache = cache._replace(
        keys=tuple(k[owner] for k in cache.keys),
        values=tuple(v[owner] for v in cache.values),
        valid=cache.valid[owner])
    rest, _ = model.extend(suffix, cache, suffix_mask, return_hidden=True)
    hidden = jnp.concatenate([hidden, rest], axis=1)         # [B, C, D]
  return _per_request(model, hidden, targets, valid)


@functools.partial(jax.jit, static_argnames=('graphdef',))
def _score_whole(graphdef, state, ids, mask, where, targets, valid):
  """ids, mask [B, W]: each request's inputs; where, targets, valid
  [B, C]: the positions predicting its targets, the targets, which are
  real. -> as ``_score``."""
  model = nnx.merge(graphdef, state)
  hidden = model(ids, mask, return_hidden=True)              # [B, W, D]
  picked = jnp.take_along_axis(hidden, where[..., None], axis=1)
  return _per_request(model, picked, targets, valid)


# A batch shares its prefixes' computation when that saves at least this
# share of its tokens; otherwise one plain forward per request is cheaper
# (no cache to gather, attention of structure the kernel knows).
SHARING_PAYS = 0.25


class Scorer:
  """Scores :class:`Request` lists with one model.

  model: a DecoderLM (its parameters where they are: on ``mesh``, or one
    device); batch_size: rows per batch, rounded up to a multiple of the
    mesh's batch shards. Inputs are at most the model's ``max_len``.
  ``shapes`` holds the shape of every program compiled so far.
  """

  def __init__(self, model, batch_size: int, mesh: Mesh | None = None):
    self.graphdef, self.state = nnx.split(model)
    self.max_len = model.config.max_len
    self.mesh = mesh
    shards = 1 if mesh is None else (
        mesh.shape['data'] * mesh.shape['fsdp'])
    self.shards = shards
    self.batch_size = -(-batch_size // shards) * shards
    self.shapes: set[tuple] = set()

  def bound(self) -> int:
    """The most programs a run may compile: shared, prefix rows x prefix
    widths x request rows x suffix widths; whole, request rows x widths x
    continuation counts."""
    rows = len(ladder(self.batch_size, self.shards, fine=False))
    widths, counts = len(ladder(self.max_len)), len(ladder(self.max_len, 1))
    return rows * rows * widths * counts + rows * widths * counts

  def score(self, requests: Sequence[Request], progress=None
            ) -> list[tuple[float, bool]]:
    """(log-probability, greedy) per request, in the given order.
    ``progress(n)`` is told how many were scored after each batch."""
    unique = list(dict.fromkeys(requests))  # a repeated request costs once
    # Longest prefixes first; equal prefixes side by side.
    unique.sort(key=lambda r: (-r.split, r.inputs[:r.split],
                               -len(r.targets)))
    answers: dict[Request, tuple[float, bool]] = {}
    for start in range(0, len(unique), self.batch_size):
      rows = unique[start:start + self.batch_size]
      for row, answer in zip(rows, self._batch(rows)):
        answers[row] = answer
      if progress is not None:
        progress(len(rows))
    if progress is not None and len(requests) > len(unique):
      progress(len(requests) - len(unique))  # the repeats, answered too
    return [answers[r] for r in requests]

  def _run(self, fn, batch):
    if self.mesh is None:
      out = fn(self.graphdef, self.state, *batch)
    else:
      placed = jax.device_put(batch, sharding.batch_sharding(self.mesh))
      with jax.set_mesh(self.mesh):
        out = fn(self.graphdef, self.state, *placed)
    return on_host(out)

  def _batch(self, rows: Sequence[Request]) -> list[tuple[float, bool]]:
    prefixes = list(dict.fromkeys(r.inputs[:r.split] for r in rows))
    whole = sum(len(r.inputs) for r in rows)
    shared = sum(map(len, prefixes)) + whole - sum(r.split for r in rows)
    if shared > (1 - SHARING_PAYS) * whole:
      return self._batch_whole(rows)
    return self._batch_shared(rows, prefixes)

  def _batch_whole(self, rows: Sequence[Request]
                   ) -> list[tuple[float, bool]]:
    b = rows_for(len(rows), self.batch_size, self.shards)
    width = bucket(max(len(r.inputs) for r in rows), self.max_len)
    count = bucket(max(len(r.targets) for r in rows), width, 1)
    filled = [*rows, *rows[-1:] * (b - len(rows))]
    ids = np.zeros((b, width), np.int32)
    mask = np.zeros((b, width), bool)
    where = np.zeros((b, count), np.int32)
    targets = np.zeros((b, count), np.int32)
    valid = np.zeros((b, count), bool)
    for i, r in enumerate(filled):
      n, m = len(r.inputs), len(r.targets)
      ids[i, :n] = r.inputs
      mask[i, :n] = True
      where[i, :m] = n - m + np.arange(m)
      targets[i, :m] = r.targets
      valid[i, :m] = True
    self.shapes.add(('whole', b, width, count))
    logprob, greedy = self._run(
        _score_whole, (ids, mask, where, targets, valid))
    return [(float(logprob[i]), bool(greedy[i])) for i in range(len(rows))]

  def _batch_shared(self, rows: Sequence[Request], prefixes
                    ) -> list[tuple[float, bool]]:
    index = {p: i for i, p in enumerate(prefixes)}
    p = rows_for(len(prefixes), self.batch_size, self.shards)
    b = rows_for(len(rows), self.batch_size, self.shards)
    wp = bucket(max(map(len, prefixes)), self.max_len)
    longest = max(len(r.targets) for r in rows) - 1
    ws = 0 if longest == 0 else bucket(longest, self.max_len, 1)
    prefix = np.zeros((p, wp), np.int32)
    prefix_mask = np.zeros((p, wp), bool)
    for i, ids in enumerate([*prefixes, *prefixes[-1:] * (p - len(prefixes))]):
      prefix[i, :len(ids)] = ids
      prefix_mask[i, :len(ids)] = True
    filled = [*rows, *rows[-1:] * (b - len(rows))]
    owner = np.array([index[r.inputs[:r.split]] for r in filled], np.int32)
    suffix = np.zeros((b, ws), np.int32)
    suffix_mask = np.zeros((b, ws), bool)
    targets = np.zeros((b, ws + 1), np.int32)
    valid = np.zeros((b, ws + 1), bool)
    for i, r in enumerate(filled):
      rest = r.inputs[r.split:]
      suffix[i, :len(rest)] = rest
      suffix_mask[i, :len(rest)] = True
      targets[i, :len(r.targets)] = r.targets
      valid[i, :len(r.targets)] = True
    self.shapes.add(('shared', p, wp, b, ws))
    logprob, greedy = self._run(_score, (
        prefix, prefix_mask, owner, suffix, suffix_mask, targets, valid))
    return [(float(logprob[i]), bool(greedy[i])) for i in range(len(rows))]
