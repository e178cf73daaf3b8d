"""cuDNN's fused attention over rows split across the 'sequence' axis.

JAX's partitioning of cuDNN's kernel refuses a split sequence dimension,
so where the mesh splits a row's positions the kernel runs per shard
(``jax.shard_map``): each shard keeps its T / n queries and reads the
whole row's keys and values, gathered over the axis on the way in (their
gradients summed back on the way out). Causality then depends on where
the shard's queries sit in the row (from shard * T / n on, or the two
chunks of a balanced row), which the kernel's own causal flag cannot say
(it aligns queries and keys at position 0), so the shard's mask is
written out: causal by the queries' places in the row, key lengths and
packed segments, [B, 1, T / n, S] (cuDNN reads it as a bias; at 32,768
keys and 4,096 queries a shard that is 128 MiB, against 8 GiB for XLA's
float32 scores of 16 heads).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jax_transformer.model import sharding
from jax_transformer.model.masks import (
  Mask,
  causal_mask,
  combine,
  length_mask,
  segment_mask,
)

Array = jax.Array


def takes(mask: Mask) -> bool:
  """Whether :func:`attention` computes this mask (no dense part)."""
  return mask.dense_part is None


def _local(q: Array, k: Array, v: Array, places: Array, lengths: Array,
           q_segments: Array, k_segments: Array, *, causal: bool,
           packed: bool, implementation: str) -> Array:
  """One shard: q [B, t, N, H] at places [t] of the row, k and v
  [B, S, K, H] (the row in order), lengths [B], segments [B, t] and
  [B, S] -> [B, t, N, H]."""
  t, s = q.shape[1], k.shape[1]
  dense = combine(
      causal_mask(places, jnp.arange(s)) if causal else None,
      length_mask(lengths, s),
      segment_mask(q_segments, k_segments) if packed else None)
  dense = jnp.broadcast_to(dense, (q.shape[0], 1, t, s))
  return jax.nn.dot_product_attention(q, k, v, mask=dense,
                                      implementation=implementation)


def attention(q: Array, k: Array, v: Array, mask: Mask,
              implementation: str = 'cudnn') -> Array:
  """softmax(q k^T / sqrt(H)) v by cuDNN (or another backend of
  ``jax.nn.dot_product_attention``: the tests' XLA), per 'sequence' shard.

  q [B, T, N, H], k and v [B, S, K, H], mask without a dense part
  (:func:`takes`) -> [B, T, N, H], under a mesh whose 'sequence' axis
  splits T.
  """
  batch, length, num_keys = q.shape[0], q.shape[1], k.shape[1]
  mesh = jax.sharding.get_abstract_mesh()
  q_spec, kv_spec = sharding.attention_specs(mesh, q.shape, k.shape, True)
  lengths = (jnp.full((batch,), num_keys, jnp.int32)
             if mask.key_lengths is None else mask.key_lengths)
  packed = mask.key_segments is not None
  q_segments, k_segments = ((mask.query_segments, mask.key_segments)
                            if packed else
                            (jnp.ones((batch, length), jnp.int32),
                             jnp.ones((batch, num_keys), jnp.int32)))
  rows = PartitionSpec(q_spec[0], q_spec[1])
  local = functools.partial(_local, causal=mask.causal, packed=packed,
                            implementation=implementation)
  return jax.shard_map(
      local, mesh=mesh,
      in_specs=(q_spec, kv_spec, kv_spec, PartitionSpec(q_spec[1]),
                PartitionSpec(q_spec[0]), rows, PartitionSpec(q_spec[0], None)),
      out_specs=q_spec, check_vma=False)(
          q, k, v, mask.query_positions(length), lengths.astype(jnp.int32),
          q_segments, k_segments)
