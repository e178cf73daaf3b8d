"""Attention masks as structure, and as dense arrays when a backend needs one.

A dense bool mask ``[B, 1, T, S]`` tells a fused attention kernel nothing
it can exploit: cuDNN turns it into a bias read from memory in the forward
and the backward pass, and nothing can skip the causal half. So the models
describe a mask by what it is (:class:`Mask`): causal or not, right-padded
rows of known lengths, packed segments, and only for what has no structure
(left-padded prompts, cache slots) a dense part. :func:`attention_args`
hands each part to ``jax.nn.dot_product_attention`` in the form it takes;
:meth:`Mask.dense` gives the same mask as one array (the explicit path and
the tests).

Dense masks follow ``jax.nn.dot_product_attention``: bool, True = may
attend, shaped to broadcast against ``[B, N, T, S]``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_transformer.model import balance

Array = jax.Array


def padding_mask(key_mask: Array) -> Array:
  """key_mask [B, S] bool (True = real token) -> [B, 1, 1, S]."""
  return key_mask[:, None, None, :]


def segment_mask(query_segments: Array, key_segments: Array) -> Array:
  """Packed sequences attend within their own segment; segment 0 is padding.

  query_segments [B, T], key_segments [B, S] int -> [B, 1, T, S].
  """
  same = query_segments[:, :, None] == key_segments[:, None, :]
  return (same & (key_segments[:, None, :] > 0))[:, None]


def causal_mask(query_slots: Array, key_slots: Array) -> Array:
  """Key slot <= query slot. query_slots [T] -> [1, 1, T, S], or [B, T]
  (each row's own slots) -> [B, 1, T, S]; key_slots [S]."""
  causal = key_slots <= query_slots[..., None]
  return causal[None, None] if causal.ndim == 2 else causal[:, None]


def length_mask(lengths: Array, num_keys: int) -> Array:
  """The first lengths[b] keys are real: lengths [B] -> [B, 1, 1, S]."""
  return padding_mask(jnp.arange(num_keys)[None, :] < lengths[:, None])


def combine(*masks: Array | None) -> Array | None:
  """Logical AND of the masks that are present (None = attend everywhere)."""
  present = [m for m in masks if m is not None]
  if not present:
    return None
  out = present[0]
  for m in present[1:]:
    out = out & m
  return out


@dataclasses.dataclass(frozen=True)
class Mask:
  """Which keys each query may attend to, by structure. Every part that is
  set applies (they AND together); an empty Mask attends everywhere.

  causal:          key position <= query position (queries and keys aligned
                   at position 0, as in training; not for cache slots).
  key_lengths:     [B] int32: row b's keys are real at positions
                   < key_lengths[b] (right padding).
  query_segments:  [B, T] and key_segments [B, S] int: packed rows; a query
                   sees keys of its own segment only, segment 0 is padding.
  dense:           bool, broadcastable to [B, N, T, S]: anything else.
  balanced:        n > 1: the queries are a row in the balanced order of n
                   'sequence' shards (:mod:`balance`), the keys the row in
                   its own order; causality compares their places in the
                   row. 0: queries and keys both in row order.
  """
  causal: bool = False
  key_lengths: Array | None = None
  query_segments: Array | None = None
  key_segments: Array | None = None
  dense_part: Array | None = None
  balanced: int = 0

  def query_positions(self, num_queries: int) -> Array:
    """Each query's place in the row, [T] int32."""
    if self.balanced:
      return jnp.asarray(balance.row_positions(num_queries, self.balanced))
    return jnp.arange(num_queries, dtype=jnp.int32)

  def causal_part(self, num_queries: int, num_keys: int) -> Array | None:
    """Causality as a bool array [1, 1, T, S] (None where not causal)."""
    if not self.causal:
      return None
    return causal_mask(self.query_positions(num_queries),
                       jnp.arange(num_keys))

  def balanced_rows(self, shards: int) -> Mask:
    """This causal self-attention mask with its queries in the balanced
    order of ``shards`` shards (:mod:`balance`): the query segments as
    given, the key segments put back in row order as the keys are."""
    if self.dense_part is not None:
      raise ValueError('Rows in balanced order take key lengths or packed '
                       'segments, not a dense mask.')
    keys = (None if self.key_segments is None
            else balance.in_row_order(self.key_segments, shards))
    return dataclasses.replace(self, key_segments=keys, balanced=shards)

  def unstructured(self) -> Array | None:
    """The parts no attention backend takes as structure, as one array
    broadcastable to [B, N, T, S] (None if there are none)."""
    segments = (None if self.key_segments is None
                else segment_mask(self.query_segments, self.key_segments))
    return combine(segments, self.dense_part)

  def dense(self, num_queries: int, num_keys: int) -> Array | None:
    """The whole mask as one bool array broadcastable to [B, N, T, S]."""
    lengths = (None if self.key_lengths is None
               else length_mask(self.key_lengths, num_keys))
    return combine(self.causal_part(num_queries, num_keys), lengths,
                   self.unstructured())


def as_mask(mask: Mask | Array | None) -> Mask:
  """A Mask from a Mask, a dense bool array or None (attend everywhere)."""
  return mask if isinstance(mask, Mask) else Mask(dense_part=mask)


def attention_args(mask: Mask, num_queries: int = 0,
                   num_keys: int = 0) -> dict:
  """Keyword arguments of ``jax.nn.dot_product_attention`` for ``mask``
  (num_queries and num_keys: T and S, needed for balanced rows).

  Causality and key lengths go as ``is_causal`` and
  ``key_value_seq_lengths``, which a fused kernel applies without reading a
  mask. Query lengths are never passed: that would zero the outputs of
  padding queries, which the dense path leaves as attention over the real
  keys (both are ignored downstream; keeping them equal keeps the paths
  comparable bit for bit). Balanced rows (queries and keys in different
  orders) are causal by their places in the row, which ``is_causal``
  cannot say: that goes into the mask.
  """
  lengths = mask.key_lengths
  causal = (mask.causal_part(num_queries, num_keys) if mask.balanced
            else None)
  return dict(mask=combine(causal, mask.unstructured()),
              is_causal=mask.causal and not mask.balanced,
              key_value_seq_lengths=(None if lengths is None
                                     else lengths.astype(jnp.int32)))
