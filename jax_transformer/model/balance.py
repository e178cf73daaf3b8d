"""Causal rows reordered so that every 'sequence' shard does equal work.

Split into n contiguous parts, a causal row's first shard attends to its
own part of the row and its last shard to the whole row. A kernel that
skips the blocks a mask empties (splash) then gives shard i 2i + 1 units
of work, and the step waits for the last one (2n - 1 units). Cut into 2n
chunks instead, with shard i holding chunks i and 2n - 1 - i, every shard
does 2n + 1 units: the same total, spread evenly.

The reordering is of a step's integer inputs (token ids, targets, loss
weights, segment ids, positions) before the embedding: the loss is a sum
over tokens and does not depend on their order, so nothing is put back
afterwards. Attention reads the whole row's keys and values put back in
row order (:func:`in_row_order`, after they are gathered over the axis),
and its causal mask compares each query's place in the row
(:func:`row_positions`) with its key's (:class:`masks.Mask`'s
``balanced``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def chunk_order(shards: int) -> list[int]:
  """The row's 2n chunks in balanced order: 0, 2n-1, 1, 2n-2, ..."""
  return [c for i in range(shards) for c in (i, 2 * shards - 1 - i)]


def row_positions(length: int, shards: int) -> np.ndarray:
  """Where each place of a balanced row was in the row: [length] int32
  (shard i's places, length / n of them from i * length / n, hold the
  row's chunks i and 2n - 1 - i)."""
  chunk = length // (2 * shards)
  return np.concatenate([np.arange(c * chunk, (c + 1) * chunk)
                         for c in chunk_order(shards)]).astype(np.int32)


def _reorder(x: Array, shards: int, order: list[int]) -> Array:
  """x [B, T, ...] with its 2n chunks along T taken in ``order``."""
  chunks = jnp.split(x, 2 * shards, axis=1)
  return jnp.concatenate([chunks[c] for c in order], axis=1)


def balanced(x: Array, shards: int) -> Array:
  """x [B, T, ...] in row order -> in balanced order."""
  return _reorder(x, shards, chunk_order(shards))


def in_row_order(x: Array, shards: int) -> Array:
  """x [B, T, ...] in balanced order -> in row order (the inverse)."""
  inverse = np.argsort(chunk_order(shards)).tolist()
  return _reorder(x, shards, inverse)


def balanced_batch(batch: dict[str, Array], shards: int) -> dict[str, Array]:
  """Every [B, T] field of a decoder LM's batch in balanced order."""
  return {name: balanced(x, shards) for name, x in batch.items()}
