"""TPU flash attention: the Pallas splash kernel, for the masks it takes.

The kernel (``jax.experimental.pallas.ops.tpu.splash_attention``) walks
keys in blocks with an online softmax, so the [B, N, T, S] probabilities
never exist, and it skips blocks the mask empties (the causal half). It
takes a static mask per head and per-row segment ids; our :class:`Mask`
maps onto those when every query keeps at least one key (the kernel
divides by zero otherwise):

- causal self-attention, with or without packing or right padding;
- non-causal self-attention (an encoder) with right padding.

Key lengths become segment ids: every query is segment 1 and keys past a
row's length segment 2, so each query reads the same real keys as on
XLA's path. Packed rows use their own segment ids (padding, segment 0,
then attends other padding; those outputs are ignored downstream).
Anything else (cross-attention, dense masks, short or ragged lengths)
stays on XLA's path: :func:`takes` says which.

A Pallas call cannot be partitioned by the compiler, so under a mesh the
kernel runs per shard (``jax.shard_map``): batch over ('data', 'fsdp'),
heads over 'tensor', a row's queries over 'sequence' (each shard reading
the whole row's keys and values), as :func:`sharding.constrain` lays them
out. Split causal rows come reordered so that each shard does equal work
(:mod:`balance`); the kernel's mask then places each query in the row.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from jax_transformer.model import balance, sharding
from jax_transformer.model.masks import Mask

Array = jax.Array

# Sequence lengths must be whole blocks of this many tokens (a TPU vector
# register's 128 lanes); blocks grow to BLOCK tokens where lengths allow.
LANES = 128
BLOCK = 512


def balances(length: int, shards: int) -> bool:
  """Whether causal rows of length split into ``shards`` parts are worth
  reordering (:mod:`balance`) and the kernel takes them so: each of the
  2n chunks whole blocks of lanes, and the lazy causal mask's rule."""
  return (shards > 1 and length % (2 * shards * LANES) == 0
          and length % (shards * shards) == 0)


def takes(mask: Mask, num_queries: int, num_keys: int,
          shards: int = 1) -> bool:
  """Whether the kernel computes this self-attention exactly, its queries
  split into ``shards`` parts of the row (the mesh's 'sequence' axis)."""
  if mask.dense_part is not None or num_queries != num_keys:
    return False
  if mask.balanced and (mask.balanced != shards
                        or not balances(num_queries, shards)):
    return False
  if num_queries % shards or (num_queries // shards) % LANES:
    return False
  if shards > 1 and not mask.causal:
    # Split rows of a full mask have no partial blocks, which the
    # kernel's block tables cannot be cut from (jax 0.10).
    return False
  if mask.causal and num_queries % (shards * shards):
    return False  # the lazy causal mask's rule for a split row
  packed = mask.key_segments is not None
  # A balanced row's query segments are its key segments reordered.
  if packed and (mask.key_lengths is not None
                 or (mask.query_segments is not mask.key_segments
                     and not mask.balanced)):
    return False
  return True


def _block(length: int) -> int:
  """The largest block up to BLOCK that divides length (a multiple of 128)."""
  return max(b for b in range(LANES, BLOCK + 1, LANES) if length % b == 0)


class _BalancedCausalMask(splash.CausalMask):
  """Causal over a row in balanced order (:mod:`balance`) against keys in
  row order: the kernel compares each query's place in the row, which a
  lazy causal mask reads from its ``q_sequence``."""

  def __init__(self, length: int, shards: int):
    super().__init__((length, length), shard_count=shards)
    self.q_sequence = balance.row_positions(length, shards)


@functools.lru_cache(maxsize=64)
def _kernel(num_heads: int, length: int, causal: bool, grouped: bool,
            interpret: bool, shards: int = 1, balanced: bool = False):
  """The splash kernel for [num_heads, length, H] queries (one row), its
  block tables cut into ``shards`` parts along the queries: each shard of
  a row split over 'sequence' reads its own part (see :func:`attention`).
  balanced: the queries come in balanced order, blocks within chunks."""
  shape = (length, length)
  if balanced:
    head = _BalancedCausalMask(length, shards)
  elif causal:
    head = splash.CausalMask(shape, shard_count=shards)
  else:
    head = splash.FullMask(shape)
  b = _block(length // (2 * shards if balanced else shards))
  blocks = splash.BlockSizes(
      block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b,
      block_kv_dkv=b, block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
  make = splash.make_splash_mqa if grouped else splash.make_splash_mha
  # The kernel holds its mask's block tables as arrays and is cached: made
  # inside a trace (under shard_map, say) they would be that trace's
  # tracers, leaked into the next call. Made here, they are constants.
  with jax.ensure_compile_time_eval():
    return make(splash.MultiHeadMask([head] * num_heads),
                block_sizes=blocks, head_shards=1, q_seq_shards=shards,
                interpret=interpret)


def _segments(mask: Mask, batch: int, length: int) -> tuple[Array, Array]:
  """(query, key) segment ids, each [B, T] int32, for mask."""
  if mask.key_segments is not None:
    return (mask.query_segments.astype(jnp.int32),
            mask.key_segments.astype(jnp.int32))
  queries = jnp.ones((batch, length), jnp.int32)
  if mask.key_lengths is None:
    return queries, queries
  # An empty row (an evaluation batch's filler) keeps its first key, so
  # no query is left without one; its outputs are ignored downstream.
  lengths = jnp.maximum(mask.key_lengths, 1)
  past = jnp.arange(length)[None, :] >= lengths[:, None]
  return queries, jnp.where(past, 2, 1).astype(jnp.int32)


def _attend_local(kernel, q: Array, k: Array, v: Array, q_ids: Array,
                  kv_ids: Array) -> Array:
  """The kernel over one shard: q [B, T, N, H], k and v [B, S, K, H],
  q_ids [B, T], kv_ids [B, S] -> [B, T, N, H] (T = S, or T a part of the
  row S where the row is split)."""
  _, length, heads, width = q.shape
  groups = heads // k.shape[2]
  q = (q * (1.0 / math.sqrt(width))).astype(q.dtype)
  q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [B, heads, T, H]

  def one_row(q, k, v, q_ids, kv_ids):
    ids = splash.SegmentIds(q=q_ids, kv=kv_ids)
    if groups == 1:
      return kernel(q, k, v, segment_ids=ids)
    # Query head n reads key head n // groups: one MQA call per key head.
    q = q.reshape(k.shape[0], groups, length, width)
    out = jax.vmap(lambda q, k, v: kernel(q, k, v, segment_ids=ids))(q, k, v)
    return out.reshape(heads, length, width)

  out = jax.vmap(one_row)(q, k, v, q_ids, kv_ids)
  return jnp.swapaxes(out, 1, 2).astype(v.dtype)


def attention(q: Array, k: Array, v: Array, mask: Mask,
              interpret: bool = False) -> Array:
  """softmax(q k^T / sqrt(H)) v by the splash kernel (check :func:`takes`).

  q [B, T, N, H], k and v [B, T, K, H] (K divides N) -> [B, T, N, H].
  interpret runs the kernel in Pallas's interpreter (any host, slowly).
  """
  batch, length, heads = q.shape[:3]
  groups = heads // k.shape[2]
  shards = sharding.splits('length', length)
  q_ids, kv_ids = _segments(mask, batch, length)
  kernel = _kernel(groups if groups > 1 else heads, length, mask.causal,
                   groups > 1, interpret, shards, bool(mask.balanced))
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return _attend_local(kernel, q, k, v, q_ids, kv_ids)
  q_spec, kv_spec = sharding.attention_specs(mesh, q.shape, k.shape,
                                             shards > 1)
  # Each shard keeps its queries and reads the whole row's keys and values
  # (gathered over 'sequence' on the way in), and its part of the
  # kernel's block tables: which key blocks its query blocks visit.
  kernel_spec = kernel.manual_sharding_spec(jax.sharding.NamedSharding(
      mesh, PartitionSpec(None, q_spec[1])))
  return jax.shard_map(
      _attend_local, mesh=mesh,
      in_specs=(kernel_spec, q_spec, kv_spec, kv_spec,
                PartitionSpec(q_spec[0], q_spec[1]),
                PartitionSpec(kv_spec[0], None)),
      out_specs=q_spec, check_vma=False)(kernel, q, k, v, q_ids, kv_ids)
