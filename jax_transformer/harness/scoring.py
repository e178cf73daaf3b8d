"""Log-likelihoods of continuations under a DecoderLM, many at once.

What a log-likelihood request asks, once it is tokens: the ids the model
reads (``inputs``, at most ``max_len``) and the continuation (``targets``),
predicted by the last ``len(targets)`` positions; the answer is the
continuation's summed log-probability and whether every one of its tokens
is the argmax.

A request's inputs are a *prefix* (up to the position that predicts the
first target) and a *suffix* (the continuation but its last token).
Requests that share a prefix (a multiple-choice question's choices) share
its computation: a *unit* lays out the prefix once and then each
request's suffix, every suffix seeing the prefix and itself (a mask of
packed segments, causal, with the unit's other suffixes hidden), at its
own positions. Units are packed into rows, several to a row, at the row
width that makes the batch cheapest (padding against attention over
longer rows); the head runs at the continuations' positions only.
Requests are ordered so that equal prefixes meet in one batch, longest
first, ``batch_size`` requests at a time.

Every dimension is padded to a rung of a short ladder (widths: four
rungs per octave from :data:`MIN_WIDTH` up to ``max_len``; head positions
per row multiples of :data:`HEAD_CHUNK` up to twice the width; row
counts: doublings of the mesh's batch shards up to ``batch_size``), so the
number of compiled programs is bounded by the ladders, whatever the task;
the rows are split over the mesh's batch axes (``'data'`` and
``'fsdp'``).
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

from jax_transformer.model import masks, sharding

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


@functools.partial(jax.jit, static_argnames=('graphdef', 'requests'))
def _score(graphdef, state, ids, positions, units, branches, where, targets,
           owner, *, requests: int):
  """One packed batch (laid out by :func:`_lay_out`).

  ids, positions, units, branches [R, W]: packed rows (unit 0 is padding);
  where, targets, owner [R, K]: the column whose hidden state predicts each
  target, the target, and its request (``requests`` for padding).
  -> (summed log-probability [requests] float32, every target the argmax
  [requests]).
  """
  model = nnx.merge(graphdef, state)
  # A token sees its own unit, causally, except other continuations of
  # the unit's prefix.
  keys = branches[:, None, :]
  mask = masks.Mask(causal=True, query_segments=units, key_segments=units,
                    dense_part=((keys == 0) | (keys == branches[..., None])
                                )[:, None])
  hidden = model(ids, mask, positions=positions, return_hidden=True)
  picked = jnp.take_along_axis(hidden, where[..., None], axis=1)
  r, k = where.shape
  logprob, greedy = _per_token(model, picked.reshape(r * k, -1),
                               targets.reshape(-1))
  owner = owner.reshape(-1)
  total = jax.ops.segment_sum(logprob, owner, requests + 1)
  missed = jax.ops.segment_sum((~greedy).astype(jnp.int32), owner,
                               requests + 1)
  return total[:requests], missed[:requests] == 0


@dataclasses.dataclass
class Unit:
  """A prefix and the requests that continue it (indices into a batch),
  laid out in a row as the prefix and then each request's suffix."""
  prefix: tuple[int, ...]
  members: list[int]
  length: int


def units_of(rows: Sequence[Request], width: int) -> list[Unit]:
  """Requests with one prefix (adjacent in ``rows``) share a unit while
  it fits ``width`` tokens; a request alone always fits."""
  units: list[Unit] = []
  for i, r in enumerate(rows):
    prefix = r.inputs[:r.split]
    more = len(r.inputs) - len(prefix)
    last = units[-1] if units else None
    if last and last.prefix == prefix and last.length + more <= width:
      last.members.append(i)
      last.length += more
    else:
      units.append(Unit(prefix, [i], len(prefix) + more))
  return units


def fill(units: Sequence[Unit], width: int) -> list[list[Unit]]:
  """Units into as few rows of ``width`` as first fit, longest first,
  finds."""
  rows: list[list[Unit]] = []
  free: list[int] = []
  for unit in sorted(units, key=lambda u: -u.length):
    k = next((k for k, f in enumerate(free) if unit.length <= f), None)
    if k is None:
      rows.append([])
      free.append(width)
      k = len(rows) - 1
    rows[k].append(unit)
    free[k] -= unit.length
  return rows


def _lay_out(rows: Sequence[Request], packed: list[list[Unit]], width: int,
             count: int, requests: int) -> tuple[np.ndarray, ...]:
  """Host arrays of :func:`_score` for ``packed`` (padded to ``count``
  rows, ``requests`` the padding owner)."""
  shape = (count, width)
  ids, positions = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
  units, branches = np.zeros(shape, np.int32), np.zeros(shape, np.int32)
  heads = [[] for _ in range(count)]  # (column, target, request) per row
  for row, members in enumerate(packed):
    col = 0
    for u, unit in enumerate(members, start=1):
      p = len(unit.prefix)
      ids[row, col:col + p] = unit.prefix
      positions[row, col:col + p] = np.arange(p)
      units[row, col:col + p] = u
      last = col + p - 1  # predicts every member's first target
      col += p
      for i in unit.members:
        r = rows[i]
        suffix = r.inputs[p:]
        n = len(suffix)
        ids[row, col:col + n] = suffix
        positions[row, col:col + n] = p + np.arange(n)
        units[row, col:col + n] = u
        branches[row, col:col + n] = i + 1
        where = [last, *range(col, col + n)][:len(r.targets)]
        heads[row].extend((w, t, i) for w, t in zip(where, r.targets))
        col += n
  # The head runs HEAD_CHUNK positions at a time: finer counts would add
  # programs, not save work. (A unit's members all read its prefix's last
  # column: a row may hold more targets than tokens, never twice as many.)
  k = HEAD_CHUNK * -(-max(1, *map(len, heads)) // HEAD_CHUNK)
  where = np.zeros((count, k), np.int32)
  targets = np.zeros((count, k), np.int32)
  owner = np.full((count, k), requests, np.int32)
  for row, entries in enumerate(heads):
    if entries:
      where[row, :len(entries)], targets[row, :len(entries)], \
          owner[row, :len(entries)] = zip(*entries)
  return ids, positions, units, branches, where, targets, owner


class Scorer:
  """Scores :class:`Request` lists with one model.

  model: a DecoderLM (its parameters where they are: on ``mesh``, or one
    device); batch_size: requests per batch, rounded up to a multiple of
    the mesh's batch shards. Inputs are at most the model's ``max_len``.
  ``shapes`` holds the shape of every program compiled so far: (rows,
  width, head positions per row).
  """

  def __init__(self, model, batch_size: int, mesh: Mesh | None = None):
    self.graphdef, self.state = nnx.split(model)
    self.max_len = model.config.max_len
    self.d_model = model.config.d_model
    self.mesh = mesh
    shards = 1 if mesh is None else (
        mesh.shape['data'] * mesh.shape['fsdp'])
    self.shards = shards
    self.batch_size = -(-batch_size // shards) * shards
    self.shapes: set[tuple] = set()

  def bound(self) -> int:
    """The most programs a run may compile: row counts x widths x head
    positions per row."""
    rows = len(ladder(self.batch_size, self.shards, fine=False))
    widths = ladder(self.max_len)
    return rows * sum(-(-2 * w // HEAD_CHUNK) for w in widths)

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

  def _run(self, fn, batch, **static):
    if self.mesh is None:
      out = fn(self.graphdef, self.state, *batch, **static)
    else:
      placed = jax.device_put(batch, sharding.batch_sharding(self.mesh))
      with jax.set_mesh(self.mesh):
        out = fn(self.graphdef, self.state, *placed, **static)
    return on_host(out)

  def _batch(self, rows: Sequence[Request]) -> list[tuple[float, bool]]:
    """One batch: its requests packed into rows (:func:`units_of`,
    :func:`fill`) at the width that costs least (:meth:`_cost`)."""
    longest = max(len(r.inputs) for r in rows)
    # From the rung that holds the longest request to the one that holds
    # them all in one row.
    widest = bucket(min(sum(len(r.inputs) for r in rows), self.max_len),
                    self.max_len)
    choices = []
    for width in ladder(self.max_len):
      if longest <= width <= widest:
        packed = fill(units_of(rows, width), width)
        count = rows_for(len(packed), self.batch_size, self.shards)
        choices.append((count, width, packed))
    count, width, packed = min(choices, key=lambda c: self._cost(*c[:2]))
    batch = _lay_out(rows, packed, width, count, self.batch_size)
    self.shapes.add((count, width, batch[-1].shape[1]))
    logprob, greedy = self._run(_score, batch, requests=self.batch_size)
    return [(float(logprob[i]), bool(greedy[i])) for i in range(len(rows))]

  def _cost(self, count: int, width: int) -> float:
    """A forward's cost over count rows of width, in token matmuls: each
    token's projections (24 d^2 multiply-adds a layer) and its attention
    over the row (4 d per key)."""
    return count * width * (1 + width / (6 * self.d_model))
