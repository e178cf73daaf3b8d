"""Log-likelihoods of continuations under a DecoderLM, many at once.

What a log-likelihood request asks, once it is tokens: the ids the model
reads (``inputs``, at most ``max_len``) and how many of the last positions
predict the continuation (``count``); the answer is the continuation's
summed log-probability and whether every one of its tokens is the argmax.

Requests are sorted by length, longest first, and scored ``batch_size`` at a
time. Each batch is right-padded to a width from a short ladder of buckets
(powers of two from :data:`MIN_WIDTH`, and ``max_len``) and its
continuations to one of a few counts, so the number of compiled programs is
bounded by the ladder, whatever the task; the batch is split over the mesh's
batch axes (``'data'`` and ``'fsdp'``). The head runs at the continuation's
positions only: a multiple-choice context costs no ``[T, V]`` logits.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jax_transformer.model import sharding

MIN_WIDTH = 32


def ladder(limit: int, start: int = MIN_WIDTH) -> list[int]:
  """Powers of two from ``start`` below ``limit``, then ``limit``."""
  out, width = [], start
  while width < limit:
    out.append(width)
    width *= 2
  return [*out, limit]


def bucket(n: int, limit: int, start: int = MIN_WIDTH) -> int:
  """The smallest rung of ``ladder(limit, start)`` that holds n."""
  return next(w for w in ladder(limit, start) if w >= n)


def rows_for(n: int, batch_size: int, shards: int = 1) -> int:
  """Rows of a batch holding n requests: batch_size, or for a last, short
  batch the rung of ``ladder(batch_size, shards)`` that holds them (a
  multiple of the mesh's batch shards)."""
  return bucket(n, batch_size, shards)


@dataclasses.dataclass(frozen=True)
class Request:
  """inputs: the ids the model reads (left-truncated already); targets:
  the continuation, predicted by the last len(targets) positions."""
  inputs: tuple[int, ...]
  targets: tuple[int, ...]


@functools.partial(jax.jit, static_argnames=('graphdef',))
def _score(graphdef, state, ids, mask, where, targets, valid):
  """ids, mask [B, W]; where, targets, valid [B, C] (the positions that
  predict each target, the targets, which are real) -> (summed
  log-probability [B] float32, every target the argmax [B] bool)."""
  model = nnx.merge(graphdef, state)
  hidden = model(ids, mask, return_hidden=True)          # [B, W, D]
  picked = jnp.take_along_axis(hidden, where[..., None], axis=1)  # [B, C, D]
  dtype = model.config.compute_dtype
  logits = jnp.einsum('BCD,DV->BCV', picked.astype(dtype),
                      model.head_kernel().astype(dtype),
                      preferred_element_type=jnp.float32)
  norm = jax.nn.logsumexp(logits, axis=-1)
  chosen = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  logprob = jnp.where(valid, chosen - norm, 0.0).sum(axis=-1)
  greedy = jnp.where(valid, jnp.argmax(logits, axis=-1) == targets,
                     True).all(axis=-1)
  return logprob, greedy


class Scorer:
  """Scores :class:`Request` lists with one model.

  model: a DecoderLM (its parameters where they are: on ``mesh``, or one
    device); batch_size: rows per batch, rounded up to a multiple of the
    mesh's batch shards; max_len: the longest input (the model's).
  ``shapes`` holds every (batch, width, count) compiled so far.
  """

  def __init__(self, model, batch_size: int, mesh: Mesh | None = None):
    self.graphdef, self.state = nnx.split(model)
    self.max_len = model.config.max_len
    self.mesh = mesh
    shards = 1 if mesh is None else (
        mesh.shape['data'] * mesh.shape['fsdp'])
    self.shards = shards
    self.batch_size = -(-batch_size // shards) * shards
    self.shapes: set[tuple[int, int, int]] = set()

  def bound(self) -> int:
    """The most programs a run may compile: batch rows x widths x
    continuation counts."""
    widths = ladder(self.max_len)
    rows = len(ladder(self.batch_size, self.shards))
    return rows * sum(len(ladder(w, 1)) for w in widths)

  def score(self, requests: Sequence[Request], progress=None
            ) -> list[tuple[float, bool]]:
    """(log-probability, greedy) per request, in the given order.
    ``progress(n)`` is told how many were scored after each batch."""
    unique = list(dict.fromkeys(requests))  # a repeated request costs once
    order = sorted(range(len(unique)),
                   key=lambda i: -len(unique[i].inputs))
    answers: dict[Request, tuple[float, bool]] = {}
    for start in range(0, len(order), self.batch_size):
      rows = [unique[i] for i in order[start:start + self.batch_size]]
      for row, answer in zip(rows, self._batch(rows)):
        answers[row] = answer
      if progress is not None:
        progress(len(rows))
    return [answers[r] for r in requests]

  def _batch(self, rows: Sequence[Request]) -> list[tuple[float, bool]]:
    width = bucket(max(len(r.inputs) for r in rows), self.max_len)
    count = bucket(max(len(r.targets) for r in rows), width, 1)
    b = rows_for(len(rows), self.batch_size, self.shards)
    filled = [*rows, *rows[-1:] * (b - len(rows))]
    ids = np.zeros((b, width), np.int32)
    lengths = np.array([len(r.inputs) for r in filled])
    where = np.zeros((b, count), np.int32)
    targets = np.zeros((b, count), np.int32)
    for i, r in enumerate(filled):
      ids[i, :lengths[i]] = r.inputs
      n = len(r.targets)
      # Right-aligned: column count - n + j holds target j, predicted at
      # position lengths[i] - n + j.
      targets[i, count - n:] = r.targets
      where[i, count - n:] = lengths[i] - n + np.arange(n)
    valid = np.arange(count) >= count - np.array(
        [[len(r.targets)] for r in filled])
    mask = np.arange(width) < lengths[:, None]
    batch = (ids, mask, where, targets, valid)
    self.shapes.add((b, width, count))
    if self.mesh is None:
      logprob, greedy = _score(self.graphdef, self.state, *batch)
    else:
      placed = jax.device_put(batch, sharding.batch_sharding(self.mesh))
      with jax.set_mesh(self.mesh):
        logprob, greedy = _score(self.graphdef, self.state, *placed)
    logprob, greedy = jax.device_get((logprob, greedy))
    return [(float(logprob[i]), bool(greedy[i])) for i in range(len(rows))]
