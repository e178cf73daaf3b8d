"""Multi-head and grouped-query attention, and the KV cache.

Masks are :class:`jax_transformer.model.masks.Mask` structures or dense bool
arrays broadcastable to ``[B, N, T, S]`` (True = may attend).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental import checkify

from jax_transformer.model import balance, sharding, splash, split_rows
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.layers import (
  dropout,
  param,
  rope_frequencies,
  rotate,
)
from jax_transformer.model.low_rank import project
from jax_transformer.model.masks import Mask, as_mask, attention_args
from jax_transformer.model.sharding import constrain

Array = jax.Array


def attention_weights(q: Array, k: Array, mask: Array | None = None) -> Array:
  """softmax(q k^T / sqrt(H)) over keys, blocked keys weighted 0.

  q [B, T, N, H], k [B, S, K, H], mask broadcastable to [B, N, T, S]
  -> weights [B, N, T, S] float32. With K < N, query head n reads key head
  n // (N / K), as jax.nn.dot_product_attention groups them.
  """
  k = jnp.repeat(k, q.shape[2] // k.shape[2], axis=2)
  scores = jnp.einsum('BTNH,BSNH->BNTS', q, k,
                      preferred_element_type=jnp.float32)
  scores = scores / jnp.sqrt(jnp.float32(q.shape[-1]))
  if mask is not None:
    # Finite, so a fully blocked row (a padding query) stays NaN-free.
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(scores, axis=-1)


# Head widths cuDNN's fused attention takes (multiples of 8 up to 128 run
# on every cuDNN 9 GPU; wider heads need Hopper or newer).
CUDNN_HEAD_DIMS = range(8, 129, 8)


# The platform compiled for when it is not the host's (a compile-only
# target: runtime/targets.py); None: jax.default_backend().
_TARGET_PLATFORM = contextvars.ContextVar('target_platform', default=None)


@contextlib.contextmanager
def compiling_for(platform: str) -> Iterator[None]:
  """Within, 'auto' chooses for platform ('gpu', 'tpu' or 'cpu')."""
  token = _TARGET_PLATFORM.set(platform)
  try:
    yield
  finally:
    _TARGET_PLATFORM.reset(token)


def _platform() -> str:
  """The platform compiled for (``compiling_for``), else JAX's."""
  return _TARGET_PLATFORM.get() or jax.default_backend()


def implementation(config: ModelConfig, dtype) -> str | None:
  """The attention backend for config and dtype: 'splash' (the Pallas TPU
  kernel, :mod:`splash`) or a ``jax.nn.dot_product_attention`` backend.

  'auto' picks splash on a TPU, cuDNN's fused kernel on a GPU when the
  dtype is 16-bit and the head width is one it takes, and XLA otherwise
  (CPU, float32 on a GPU). Masks splash does not take go to XLA.
  """
  chosen = config.attention_implementation
  if chosen != 'auto':
    return chosen
  platform = _platform()
  if platform == 'tpu':
    return 'splash'
  fused = (platform == 'gpu'
           and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
           and config.head_dim in CUDNN_HEAD_DIMS)
  return 'cudnn' if fused else 'xla'


def balanced_shards(config: ModelConfig, length: int) -> int:
  """Into how many 'sequence' shards causal rows of length are reordered
  for equal work (:mod:`balance`), under the mesh in context; 1 keeps row
  order. Only where it pays: rows split over the axis and attended by
  splash, which skips the blocks a causal mask empties (XLA's attention
  computes every block, and cuDNN's with a written-out mask too)."""
  shards = sharding.splits('length', length)
  if (implementation(config, config.compute_dtype) == 'splash'
      and splash.balances(length, shards)):
    return shards
  return 1


def fused_context(q: Array, k: Array, v: Array, mask: Mask,
                  backend: str | None) -> Array:
  """softmax(q k^T / sqrt(H)) v by backend, without dropout.

  q [B, T, N, H], k and v [B, S, K, H] -> [B, T, N, H]. 'splash' runs
  where the kernel takes the mask (interpreted off a TPU), XLA elsewhere;
  where the mesh's 'sequence' axis splits the queries, splash and cuDNN
  run per shard over the whole row's keys (:mod:`split_rows`).
  """
  shards = sharding.splits('length', q.shape[1])
  if backend == 'splash':
    if splash.takes(mask, q.shape[1], k.shape[1], shards):
      return splash.attention(q, k, v, mask,
                              interpret=_platform() != 'tpu')
    backend = 'xla'
  if backend == 'cudnn' and shards > 1 and split_rows.takes(mask):
    return split_rows.attention(q, k, v, mask)
  if shards > 1:  # no other kernel is partitioned over split rows
    backend = 'xla'
  args = attention_args(mask, q.shape[1], k.shape[1])
  if backend == 'cudnn' and args['mask'] is not None:
    # cuDNN takes a mask only as long as the queries and keys: a padding
    # mask broadcast over the queries ([B, 1, 1, S]) is spread over them.
    dense = args['mask']
    args['mask'] = jnp.broadcast_to(
        dense, (*dense.shape[:-2], q.shape[1], k.shape[1]))
  return jax.nn.dot_product_attention(q, k, v, **args,
                                      implementation=backend)


def whole_rows(kv: Array) -> Array:
  """Keys or values [B, S, K, H] with all S positions on every device.

  Where the mesh splits a row's positions (its 'sequence' axis), each
  device keeps its queries and reads the whole row's keys and values: the
  compiler all-gathers them over the axis before attention and sums their
  gradients back over it after, and the scores [B, N, T, S] stay split
  over T (on 8 CPU devices these gathers are the step's only ones over
  the axis: tests/model/test_sequence_axis.py).

  XLA's attention (CPU, float32 on a GPU) is partitioned like any
  einsum: every shard computes its whole [T / n, S] block of scores,
  causal or not, so its causal work is even. Splash runs per shard with
  its block tables cut along the queries (:mod:`splash`), and cuDNN per
  shard with the shard's causal mask written out (:mod:`split_rows`);
  both skip or mask the blocks above the diagonal, so in row order the
  last shard of a causal row does the most work (2n - 1 blocks to the
  first's 1); splash's rows are reordered to even it (:mod:`balance`).
  """
  return constrain(kv, ('batch', 'kv_length', 'kv_heads', 'head_dim'))


class KVCache(NamedTuple):
  """Decoding state, passed into the model and returned (a plain pytree).

  keys, values:  per decoder layer, [B, K, S_max, H]: self-attention
                 keys/values written slot by slot (slots after heads, so
                 attention reads them without a transpose).
  valid:         [B, S_max] bool, True where a slot holds a real token (a
                 prompt's padding slots stay False and are never attended).
  index:         int32, the next slot to write: a scalar (the same slot for
                 every row, as one batch decodes), or [B] (each row at its
                 own slot, as a continuous-batching server's rows start and
                 end at different times).
  cross_keys, cross_values: per decoder layer, [B, K, S, H]: the encoder
                 memory projected once per source (empty for decoder-only).
  memory_mask:   [B, S] bool source padding mask (None for decoder-only).
  """
  keys: tuple[Array, ...]
  values: tuple[Array, ...]
  valid: Array
  index: Array
  cross_keys: tuple[Array, ...] = ()
  cross_values: tuple[Array, ...] = ()
  memory_mask: Array | None = None

  @property
  def max_len(self) -> int:
    return self.valid.shape[1]


class NewSlots(NamedTuple):
  """What ``extend(..., write=False)`` leaves to write into the cache: the
  new tokens' keys and values per decoder layer [B, T, K, H], their mask
  [B, T] (False: padding, or a row that runs masked) and the slot they go
  to (the cache's index: a scalar or [B])."""
  keys: tuple[Array, ...]
  values: tuple[Array, ...]
  mask: Array
  index: Array


def write_new(cache: KVCache, new: NewSlots) -> KVCache:
  """cache with new's keys, values and mask written at new.index, for the
  first rows of cache (as many as new has), and those rows' index moved
  past the T new slots, as ``extend`` moves it; a row whose mask is all
  False (it runs masked: no request) keeps its index."""
  rows = new.mask.shape[0]
  index = jnp.broadcast_to(new.index, (rows,))
  put = lambda whole, part: write_rows(  # noqa: E731
      whole, cache_layout(part).astype(whole.dtype), index, axis=2)
  moved = index + jnp.where(new.mask.any(axis=1), new.mask.shape[1], 0)
  return cache._replace(
      keys=tuple(put(w, n) for w, n in zip(cache.keys, new.keys)),
      values=tuple(put(w, n) for w, n in zip(cache.values, new.values)),
      valid=write_rows(cache.valid, new.mask, index, axis=1),
      index=jax.lax.dynamic_update_slice_in_dim(
          jnp.broadcast_to(cache.index, (cache.valid.shape[0],)), moved, 0,
          axis=0))


def cache_layout(kv: Array) -> Array:
  """Keys or values [B, S, K, H] as the cache holds them: [B, K, S, H]."""
  return kv.transpose(0, 2, 1, 3)


def check_room(cache: KVCache, new_tokens: int) -> None:
  """Refuses writing new_tokens into cache slots past its last one.

  The write itself (``dynamic_update_slice``) would clamp its start and
  silently overwrite the last slots. A concrete index (an eager call) is
  checked here, raising ValueError. A traced one (under jit) cannot be
  read while tracing: its check is a ``checkify.debug_check``, which
  raises only under ``jax.experimental.checkify.checkify`` and is dropped
  otherwise, leaving ``cache.index > cache.max_len`` in the returned cache
  for the next eager call to refuse.
  """
  room = cache.max_len
  traced = isinstance(cache.index, jax.core.Tracer)
  # 0 is the least a traced index can be: too many tokens fit from nowhere.
  start = 0 if traced else int(np.max(cache.index))
  if start + new_tokens > room:
    where = 'any slot' if traced else f'slot {start}'
    raise ValueError(f'{new_tokens} new tokens from {where} run past a KV '
                     f'cache of {room} slots; make the cache with max_len >= '
                     f'{start + new_tokens}.')
  if traced:
    checkify.debug_check(
        jnp.max(cache.index) + new_tokens <= room,
        f'{new_tokens} new tokens from slot {{}} run past a KV cache of '
        f'{room} slots.', jnp.max(cache.index))


def write_slots(cache_kv: Array, new: Array, index: Array) -> Array:
  """Writes new [B, T, K, H] into cache_kv [B, K, S_max, H] at slot index,
  a scalar or one slot per row [B] (only the T new rows move)."""
  new = cache_layout(new).astype(cache_kv.dtype)
  if jnp.ndim(index) == 0:
    return jax.lax.dynamic_update_slice_in_dim(cache_kv, new, index, axis=2)
  return write_rows(cache_kv, new, index, axis=2)


def write_rows(array: Array, new: Array, index: Array, axis: int) -> Array:
  """array [B, ...] with row b of new [R <= B, ...] written at index[b]
  along axis (rows past R as they were).

  One dynamic-update-slice per row (B of them, unrolled), not a scatter:
  XLA updates a donated cache in place through these, where a scatter (or
  a vmapped update, which becomes one) makes it copy the whole cache
  first, every decoding step.
  """
  zero = jnp.zeros((), jnp.int32)
  for b in range(new.shape[0]):
    start = [zero] * array.ndim
    start[0], start[axis] = jnp.int32(b), index[b].astype(jnp.int32)
    array = jax.lax.dynamic_update_slice(array, new[b:b + 1], start)
  return array


def cached_context(q: Array, k: Array, v: Array, mask: Array | None
                   ) -> Array:
  """softmax(q k^T / sqrt(H)) v over keys and values laid out as the cache
  holds them.

  q [B, T, N, H], k and v [B, K, S, H], mask bool broadcastable to
  [B, 1, T, S] -> [B, T, N, H]. With S after K, both products are plain
  batched matmuls over (B, K): a [B, S, K, H] cache costs XLA a transpose
  of every layer's whole cache per decoded token. The arithmetic is that
  of jax.nn.dot_product_attention's XLA path (scale after the product,
  softmax in float32, probabilities in the values' dtype).
  """
  probs = _probabilities(_scores(q, k), mask).astype(v.dtype)
  return _context(probs, v, q.shape)


def extended_context(q: Array, cache_kv: tuple[Array, Array],
                     cache_mask: Array, new_kv: tuple[Array, Array],
                     new_mask: Array) -> Array:
  """:func:`cached_context` over a cache's slots and T new tokens beside
  them, not written into it.

  q [B, T, N, H]; cache_kv: keys and values [B, K, S, H]; cache_mask
  [B|1, 1, T|1, S]: the slots to attend; new_kv: the new tokens' keys and
  values [B, T, K, H]; new_mask [B|1, 1, T, T] -> [B, T, N, H]. The same
  softmax over S + T keys as attending a cache holding the new tokens (the
  sums in another order), for a program that only reads the cache.
  """
  b, t = q.shape[:2]
  new_k, new_v = (cache_layout(x).astype(cache_kv[1].dtype) for x in new_kv)
  slots = cache_kv[0].shape[2]
  scores = jnp.concatenate([_scores(q, cache_kv[0]), _scores(q, new_k)],
                           axis=-1)
  mask = jnp.concatenate(
      [jnp.broadcast_to(cache_mask, (b, 1, t, slots)),
       jnp.broadcast_to(new_mask, (b, 1, t, t))], axis=-1)
  probs = _probabilities(scores, mask).astype(new_v.dtype)
  return (_context(probs[..., :slots], cache_kv[1], q.shape)
          + _context(probs[..., slots:], new_v, q.shape))


def _scores(q: Array, k: Array) -> Array:
  """q [B, T, N, H], k [B, K, S, H] -> scaled scores [B, K, G, T, S]
  float32 (G = N / K query heads per key head)."""
  b, t, n, h = q.shape
  groups = n // k.shape[1]
  q = q.reshape(b, t, k.shape[1], groups, h)
  scores = jnp.einsum('BTKGH,BKSH->BKGTS', q, k,
                      preferred_element_type=jnp.float32)
  return scores * jnp.float32(1.0 / np.sqrt(h))


def _probabilities(scores: Array, mask: Array | None) -> Array:
  """softmax over S of scores [B, K, G, T, S] (float32) where mask
  [B, 1, T, S] (broadcastable) allows."""
  if mask is not None:
    scores = jnp.where(mask[:, :, None], scores,
                       jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(scores, axis=-1)


def _context(probs: Array, v: Array, q_shape: tuple[int, ...]) -> Array:
  """probs [B, K, G, T, S] times v [B, K, S, H] -> [B, T, N, H]."""
  return jnp.einsum('BKGTS,BKSH->BTKGH', probs, v).reshape(q_shape)


class Attention(nnx.Module):
  """Multi-head attention with K <= N key/value heads (GQA when K < N).

  Kernels: query [D, N, H], key/value [D, K, H], out [N, H, D]; biases as
  nn.MultiheadAttention's in_proj_bias/out_proj.bias when config.use_bias.
  """

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs, rotary: bool):
    self.config = config
    self.rotary = rotary
    d, n, k, h = (config.d_model, config.num_heads, config.kv_heads,
                  config.head_dim)
    dtype = config.params_dtype
    init = nnx.initializers.xavier_uniform(in_axis=0, out_axis=(1, 2))
    self.query = param(rngs, init, (d, n, h), ('embed', 'heads', 'head_dim'),
                       dtype)
    self.key = param(rngs, init, (d, k, h), ('embed', 'kv_heads', 'head_dim'),
                     dtype)
    self.value = param(rngs, init, (d, k, h),
                       ('embed', 'kv_heads', 'head_dim'), dtype)
    out_init = nnx.initializers.xavier_uniform(in_axis=(0, 1), out_axis=2)
    self.out = param(rngs, out_init, (n, h, d),
                     ('heads', 'head_dim', 'embed'), dtype)
    zeros = nnx.initializers.zeros
    if config.has_qkv_bias:
      self.query_bias = param(rngs, zeros, (n, h), ('heads', 'head_dim'),
                              dtype)
      self.key_bias = param(rngs, zeros, (k, h), ('kv_heads', 'head_dim'),
                            dtype)
      self.value_bias = param(rngs, zeros, (k, h), ('kv_heads', 'head_dim'),
                              dtype)
    if config.use_bias:
      self.out_bias = param(rngs, zeros, (d,), ('embed',), dtype)

  def _project(self, x: Array, kernel: str, positions: Array | None):
    dtype = self.config.compute_dtype
    y = project(x, getattr(self, kernel), 'BTD,DNH->BTNH', dtype)
    if self.config.has_qkv_bias:
      y = y + getattr(self, kernel + '_bias')[...].astype(dtype)
    if self.rotary and kernel != 'value':
      if positions is None:
        raise ValueError('Rotary attention needs positions [B, T].')
      y = rotate(y, positions, self.config.rope_base,
                 rope_frequencies(self.config))
    heads = 'heads' if kernel == 'query' else 'kv_heads'
    return constrain(y, ('batch', 'length', heads, 'head_dim'))

  def project_query(self, x: Array, positions: Array | None = None) -> Array:
    """x [B, T, D] -> queries [B, T, N, H] (rotated when rotary)."""
    return self._project(x, 'query', positions)

  def project_kv(self, x: Array, positions: Array | None = None):
    """x [B, S, D] -> (keys, values), each [B, S, K, H]."""
    return (self._project(x, 'key', positions),
            self._project(x, 'value', positions))

  def attend(self, q: Array, k: Array, v: Array, mask: Mask | Array | None,
             rngs: nnx.Rngs | None = None, deterministic: bool = True):
    """softmax(q k^T / sqrt(H)) v, then the output projection.

    q [B, T, N, H], k and v [B, S, K, H], mask a Mask or a bool array
    broadcastable to [B, N, T, S] -> [B, T, D].
    """
    rate = self.config.attention_dropout_rate
    mask = as_mask(mask)
    backend = implementation(self.config, q.dtype)
    if sharding.splits('length', q.shape[1]) > 1:
      k, v = whole_rows(k), whole_rows(v)
    if mask.balanced:
      k, v = (balance.in_row_order(x, mask.balanced) for x in (k, v))
    if deterministic or rate == 0.0:
      ctx = fused_context(q, k, v, mask, backend)
    else:
      ctx = self._attend_with_dropout(
          q, k, v, mask.dense(q.shape[1], k.shape[1]), rate, rngs)
    return self._output(ctx)

  def attend_cache(self, q: Array, k: Array, v: Array,
                   mask: Array | None) -> Array:
    """Like :meth:`attend` (deterministic) over a cache's keys and values
    [B, K, S, H] (see :func:`cached_context`) -> [B, T, D]."""
    return self._output(cached_context(q, k, v, mask))

  def attend_extended(self, q: Array, cache_kv: tuple[Array, Array],
                      cache_mask: Array, new_kv: tuple[Array, Array],
                      new_mask: Array) -> Array:
    """Like :meth:`attend_cache` over a cache and new tokens beside it
    (see :func:`extended_context`) -> [B, T, D]."""
    return self._output(extended_context(q, cache_kv, cache_mask, new_kv,
                                         new_mask))

  def _output(self, ctx: Array) -> Array:
    """The output projection: ctx [B, T, N, H] -> [B, T, D]."""
    ctx = constrain(ctx, ('batch', 'length', 'heads', 'head_dim'))
    dtype = self.config.compute_dtype
    y = project(ctx, self.out, 'BTNH,NHD->BTD', dtype)
    if self.config.use_bias:
      y = y + self.out_bias[...].astype(dtype)
    return y

  def _attend_with_dropout(self, q, k, v, mask, rate, rngs):
    """The explicit path, needed because the fused kernel has no dropout."""
    weights = dropout(attention_weights(q, k, mask), rate, rngs, False,
                      self.config.dropout_rng)
    v = jnp.repeat(v, q.shape[2] // v.shape[2], axis=2)
    return jnp.einsum('BNTS,BSNH->BTNH', weights.astype(v.dtype), v)

  def __call__(self, x: Array, mask: Array | None = None,
               positions: Array | None = None, rngs: nnx.Rngs | None = None,
               deterministic: bool = True) -> Array:
    """Self-attention without a cache: x [B, T, D] -> [B, T, D]."""
    k, v = self.project_kv(x, positions)
    return self.attend(self.project_query(x, positions), k, v, mask, rngs,
                       deterministic)
