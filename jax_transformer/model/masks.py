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
  """
  causal: bool = False
  key_lengths: Array | None = None
  query_segments: Array | None = None
  key_segments: Array | None = None
  dense_part: Array | None = None

  def unstructured(self) -> Array | None:
    """The parts no attention backend takes as structure, as one array
    broadcastable to [B, N, T, S] (None if there are none)."""
    segments = (None if self.key_segments is None
                else segment_mask(self.query_segments, self.key_segments))
    return combine(segments, self.dense_part)

  def dense(self, num_queries: int, num_keys: int) -> Array | None:
    """The whole mask as one bool array broadcastable to [B, N, T, S]."""
    causal = (causal_mask(jnp.arange(num_queries), jnp.arange(num_keys))
              if self.causal else None)
    lengths = (None if self.key_lengths is None
               else length_mask(self.key_lengths, num_keys))
    return combine(causal, lengths, self.unstructured())


def as_mask(mask: Mask | Array | None) -> Mask:
  """A Mask from a Mask, a dense bool array or None (attend everywhere)."""
  return mask if isinstance(mask, Mask) else Mask(dense_part=mask)


def attention_args(mask: Mask) -> dict:
  """Keyword arguments of ``jax.nn.dot_product_attention`` for ``mask``.

  Causality and key lengths go as ``is_causal`` and
  ``key_value_seq_lengths``, which a fused kernel applies without reading a
  mask. Query lengths are never passed: that would zero the outputs of
  padding queries, which the dense path leaves as attention over the real
  keys (both are ignored downstream; keeping them equal keeps the paths
  comparable bit for bit).
  """
  lengths = mask.key_lengths
  return dict(mask=mask.unstructured(), is_causal=mask.causal,
              key_value_seq_lengths=(None if lengths is None
                                     else lengths.astype(jnp.int32)))
