"""The two models: the paper's encoder-decoder and a GPT-style decoder LM.

Conventions: ids are int [B, T]; a ``mask`` is bool [B, T] with True for real
tokens, or int [B] lengths when rows are right-padded (then a fused kernel
skips the padding without reading a mask); packed batches pass
``segment_ids`` (1, 2, ... per sequence, 0 for padding) instead, and
attention never crosses a segment boundary. Positions default to 0, 1, ...
over each sequence's real tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jax_transformer.model import attention as attn
from jax_transformer.model import masks, sharding, stack
from jax_transformer.model.attention import KVCache
from jax_transformer.model.blocks import (
  ACTIVATION_AXES,
  DecoderLayer,
  EncoderLayer,
)
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.layers import (
  Embed,
  LearnedPositions,
  dropout,
  make_norm,
  param,
  sinusoidal,
)
from jax_transformer.model.sharding import constrain

Array = jax.Array


def default_positions(ids: Array, mask: Array | None = None,
                      segment_ids: Array | None = None) -> Array:
  """Position of each token within its sequence (or packed segment) [B, T]."""
  b, t = ids.shape
  index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  if segment_ids is not None:
    starts = jnp.concatenate(
        [jnp.ones((b, 1), bool), segment_ids[:, 1:] != segment_ids[:, :-1]],
        axis=1)
    return index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)
  if mask is not None:
    # Counting real tokens also handles left padding.
    real = real_tokens(mask, t)
    return jnp.maximum(jnp.cumsum(real, axis=1, dtype=jnp.int32) - 1, 0)
  return index


def _write_valid(valid: Array, mask: Array, index: Array) -> Array:
  """valid [B, S_max] with mask [B, T] written at slot index (a scalar, or
  [B]: one slot per row)."""
  if jnp.ndim(index) == 0:
    return jax.lax.dynamic_update_slice_in_dim(valid, mask, index, axis=1)
  return attn.write_rows(valid, mask, index, axis=1)


def real_tokens(mask: Array, length: int) -> Array:
  """mask [B, T] bool, or [B] int lengths of right-padded rows -> [B, T]
  bool, True on real tokens."""
  if mask.ndim == 1:
    return jnp.arange(length)[None, :] < mask[:, None]
  return mask.astype(bool)


def key_mask(mask: Array | None, segments: Array | None,
             query_segments: Array | None = None,
             causal: bool = False) -> masks.Mask:
  """Which keys each query may see, as structure.

  mask: [B, S] bool (True = real token), or [B] int lengths of right-padded
  rows (a fused kernel then skips the padding without reading a mask);
  segments [B, S] for packed rows (queries see their own segment, given by
  query_segments [B, T] when the queries are another sequence).
  """
  if segments is not None:
    return masks.Mask(causal=causal, key_segments=segments,
                     query_segments=(segments if query_segments is None
                                     else query_segments))
  if mask is None:
    return masks.Mask(causal=causal)
  if mask.ndim == 1:
    return masks.Mask(causal=causal, key_lengths=mask)
  return masks.Mask(causal=causal, dense_part=masks.padding_mask(mask))


class _Transformer(nnx.Module):
  """Embedding, positions and output head shared by both models."""

  config: ModelConfig

  def _init_io(self, config: ModelConfig, rngs: nnx.Rngs):
    self.config = config
    self.embed = Embed(config, rngs)
    self.position_embed = (LearnedPositions(config, rngs)
                           if config.positional == 'learned' else None)
    self.head = None if config.tie_embeddings else param(
        rngs, nnx.initializers.lecun_normal(),
        (config.d_model, config.vocab_size), ('embed', 'vocab'),
        config.params_dtype)

  def _embed(self, ids: Array, positions: Array, rngs: nnx.Rngs | None,
             deterministic: bool) -> Array:
    """ids [B, T] -> embedded tokens plus positions, [B, T, D]."""
    x = self.embed(ids)
    if self.config.positional == 'sinusoidal':
      x = x + sinusoidal(positions, self.config.d_model).astype(x.dtype)
    elif self.config.positional == 'learned':
      x = x + self.position_embed(positions).astype(x.dtype)
    x = dropout(x, self.config.dropout_rate, rngs, deterministic,
                self.config.dropout_rng)
    return constrain(x, ACTIVATION_AXES)

  def head_kernel(self) -> Array:
    """The output projection as [D, V]: the head, or the embedding table
    transposed when tied (for a loss that applies the head itself)."""
    if self.head is None:
      return self.embed.embedding[...].T
    return self.head[...]

  def _logits(self, x: Array) -> Array:
    """x [B, T, D] -> logits [B, T, V] in float32."""
    if self.head is None:
      logits = self.embed.attend(x)
    else:
      dtype = self.config.compute_dtype
      logits = jnp.einsum('BTD,DV->BTV', x.astype(dtype),
                          self.head[...].astype(dtype),
                          preferred_element_type=jnp.float32)
    return constrain(logits, ('batch', 'length', 'vocab'))

  def _empty_cache(self, batch_size: int, max_len: int) -> KVCache:
    c = self.config
    shape = (batch_size, c.kv_heads, max_len, c.head_dim)
    zeros = tuple(jnp.zeros(shape, c.compute_dtype)
                  for _ in range(c.num_decoder_layers))
    return KVCache(keys=zeros, values=zeros,
                   valid=jnp.zeros((batch_size, max_len), bool),
                   index=jnp.zeros((), jnp.int32))

  def _decoder_layers(self):
    raise NotImplementedError

  def _decoder_norm(self):
    raise NotImplementedError

  def extend(self, ids: Array, cache: KVCache, mask: Array | None = None,
             positions: Array | None = None,
             logits_at: Array | None = None,
             return_hidden: bool = False, write: bool = True
             ) -> tuple[Array, KVCache | attn.NewSlots]:
    """Runs new tokens against the cache: a whole prompt, or one step.

    ids [B, T] go into cache slots [index, index + T); mask [B, T] marks real
    tokens (False for a short prompt's padding). Positions default to the
    number of real tokens already cached plus those before in ``ids``.
    logits_at [B] int: the head runs only at these positions of ``ids``
    (a prefill needs the last real token's logits, not T x V of them).
    Returns (logits [B, T, V] float32, or [B, 1, V] with logits_at; the
    updated cache). return_hidden: the final hidden states [B, T, D] (or
    [B, 1, D]) under the head instead of logits (see ``head_kernel``).
    write=False: the cache is only read, and the new tokens' keys and
    values come back in its place (:class:`attention.NewSlots`, for
    :func:`attention.write_new`): where one program read the cache and
    wrote it in place, XLA:CPU copied it (a layer's keys up to four times
    a step), so a server reads in one program and writes in another.

    Slots past the cache's last are refused (see
    :func:`jax_transformer.model.attention.check_room`): a ValueError when
    called eagerly; under jit, only inside ``checkify.checkify``.
    """
    b, t = ids.shape
    attn.check_room(cache, t)
    if mask is None:
      mask = jnp.ones((b, t), bool)
    if positions is None:
      done = cache.valid.sum(axis=1, dtype=jnp.int32)[:, None]
      positions = done + default_positions(ids, mask) * mask
    # Cache slots are not positions (a prompt's padding takes slots), so
    # these masks have no structure a kernel could use: they stay dense.
    if write:
      valid = _write_valid(cache.valid, mask, cache.index)
      slots = jnp.asarray(cache.index)[..., None] + jnp.arange(t)
      self_mask = masks.combine(
          masks.causal_mask(slots, jnp.arange(cache.max_len)),
          masks.padding_mask(valid))
    else:  # the valid slots before the new ones; those causally
      before = (jnp.arange(cache.max_len)
                < jnp.asarray(cache.index)[..., None])
      self_mask = (masks.padding_mask(cache.valid & before),
                   masks.combine(
                       masks.causal_mask(jnp.arange(t), jnp.arange(t)),
                       masks.padding_mask(mask)))
    memory_mask = (None if cache.memory_mask is None
                   else masks.padding_mask(cache.memory_mask))
    x = self._embed(ids, positions, None, True)
    keys, values = [], []
    for i, layer in enumerate(stack.unrolled(self._decoder_layers())):
      memory_kv = ((cache.cross_keys[i], cache.cross_values[i])
                   if cache.cross_keys else None)
      x, (k, v) = layer(x, self_mask, positions, memory_kv=memory_kv,
                        memory_mask=memory_mask,
                        cache_kv=(cache.keys[i], cache.values[i]),
                        cache_index=cache.index, write_cache=write)
      keys.append(k)
      values.append(v)
    if logits_at is not None:
      x = jnp.take_along_axis(x, logits_at[:, None, None], axis=1)
    norm = self._decoder_norm()
    if norm is not None:
      x = norm(x)
    out = x if return_hidden else self._logits(x)
    if not write:
      return out, attn.NewSlots(tuple(keys), tuple(values), mask,
                                cache.index)
    cache = cache._replace(keys=tuple(keys), values=tuple(values),
                           valid=valid, index=cache.index + t)
    return out, cache


class EncoderDecoder(_Transformer):
  """The paper's model: nn.Transformer plus embeddings, positions and head.

  One embedding is shared by source and target (a joint vocabulary), and by
  the output projection when ``tie_embeddings``.
  """

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    self._init_io(config, rngs)
    self.encoder_layers = stack.build(
        config, lambda: EncoderLayer(config, rngs), config.num_encoder_layers)
    self.encoder_norm = make_norm(config, rngs) if config.final_norm else None
    self.decoder_layers = stack.build(
        config, lambda: DecoderLayer(config, rngs, cross_attention=True),
        config.num_decoder_layers)
    self.decoder_norm = make_norm(config, rngs) if config.final_norm else None

  def _decoder_layers(self):
    return self.decoder_layers

  def _decoder_norm(self):
    return self.decoder_norm

  def __call__(self, src_ids: Array, tgt_ids: Array,
               src_mask: Array | None = None, tgt_mask: Array | None = None,
               deterministic: bool = True, *,
               src_segment_ids: Array | None = None,
               tgt_segment_ids: Array | None = None,
               src_positions: Array | None = None,
               tgt_positions: Array | None = None,
               rngs: nnx.Rngs | None = None,
               return_hidden: bool = False) -> Array:
    """src_ids [B, S], tgt_ids [B, T] -> logits [B, T, V] (float32).

    The causal mask on the target is applied inside. In training pass
    ``deterministic=False, rngs=nnx.Rngs(dropout=key)``. return_hidden:
    the decoder's final hidden states [B, T, D] instead of logits (see
    ``head_kernel``).
    """
    memory = self.encode(src_ids, src_mask, deterministic,
                         segment_ids=src_segment_ids, positions=src_positions,
                         rngs=rngs)
    return self.decode(tgt_ids, memory, src_mask, tgt_mask, deterministic,
                       src_segment_ids=src_segment_ids,
                       tgt_segment_ids=tgt_segment_ids,
                       tgt_positions=tgt_positions, rngs=rngs,
                       return_hidden=return_hidden)

  def encode(self, src_ids: Array, src_mask: Array | None = None,
             deterministic: bool = True, *, segment_ids: Array | None = None,
             positions: Array | None = None,
             rngs: nnx.Rngs | None = None) -> Array:
    """The encoder stack (BERT-style): src_ids [B, S] -> memory [B, S, D]."""
    if positions is None:
      positions = default_positions(src_ids, src_mask, segment_ids)
    mask = key_mask(src_mask, segment_ids)
    x = self._embed(src_ids, positions, rngs, deterministic)
    x = stack.run(
        self.encoder_layers, x,
        lambda layer, h, r: layer(h, mask, positions, r, deterministic),
        self.config, None if deterministic else rngs)
    return x if self.encoder_norm is None else self.encoder_norm(x)

  def decode(self, tgt_ids: Array, memory: Array,
             src_mask: Array | None = None, tgt_mask: Array | None = None,
             deterministic: bool = True, *,
             src_segment_ids: Array | None = None,
             tgt_segment_ids: Array | None = None,
             tgt_positions: Array | None = None,
             rngs: nnx.Rngs | None = None,
             return_hidden: bool = False) -> Array:
    """The decoder stack and head over a whole target (teacher forcing).

    tgt_ids [B, T], memory [B, S, D] -> logits [B, T, V] (float32), or
    the hidden states [B, T, D] under the head when return_hidden.
    """
    if (src_segment_ids is None) != (tgt_segment_ids is None):
      raise ValueError('Packed batches need both src_segment_ids and '
                       'tgt_segment_ids (or neither).')
    if tgt_positions is None:
      tgt_positions = default_positions(tgt_ids, tgt_mask, tgt_segment_ids)
    self_mask = key_mask(tgt_mask, tgt_segment_ids, causal=True)
    memory_mask = key_mask(src_mask, src_segment_ids, tgt_segment_ids)
    x = self._embed(tgt_ids, tgt_positions, rngs, deterministic)

    def body(layer, h, r):
      return layer(h, self_mask, tgt_positions,
                   memory_kv=layer.cross_attn.project_kv(memory),
                   memory_mask=memory_mask, rngs=r,
                   deterministic=deterministic)[0]

    x = stack.run(self.decoder_layers, x, body, self.config,
                  None if deterministic else rngs)
    if self.decoder_norm is not None:
      x = self.decoder_norm(x)
    return x if return_hidden else self._logits(x)

  def init_cache(self, memory: Array, src_mask: Array | None,
                 max_len: int) -> KVCache:
    """An empty target cache with the cross-attention keys/values of memory.

    memory [B, S, D] (from ``encode``), src_mask [B, S] bool or None;
    max_len is the number of target slots S_max.
    """
    b, s, _ = memory.shape
    cache = self._empty_cache(b, max_len)
    cross = [map(attn.cache_layout, layer.cross_attn.project_kv(memory))
             for layer in stack.unrolled(self.decoder_layers)]
    cross = [tuple(kv) for kv in cross]
    return cache._replace(
        cross_keys=tuple(k for k, _ in cross),
        cross_values=tuple(v for _, v in cross),
        memory_mask=(jnp.ones((b, s), bool) if src_mask is None
                     else real_tokens(src_mask, s)))


class DecoderLM(_Transformer):
  """A GPT-style language model: a stack of causal self-attention blocks."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    self._init_io(config, rngs)
    self.layers = stack.build(
        config, lambda: DecoderLayer(config, rngs, cross_attention=False),
        config.num_decoder_layers)
    self.norm = make_norm(config, rngs) if config.final_norm else None

  def _decoder_layers(self):
    return self.layers

  def _decoder_norm(self):
    return self.norm

  def __call__(self, ids: Array, mask: Array | masks.Mask | None = None,
               deterministic: bool = True, *,
               segment_ids: Array | None = None,
               positions: Array | None = None,
               rngs: nnx.Rngs | None = None,
               return_hidden: bool = False,
               balanced: bool = False) -> Array:
    """ids [B, T] -> next-token logits [B, T, V] (float32), causally masked;
    or the hidden states [B, T, D] under the head when return_hidden.

    mask: [B, T] bool (True = real token), [B] int lengths of right-padded
    rows, or a :class:`masks.Mask` used as given in place of the causal
    mask (for what packed segments cannot say, e.g. several continuations
    of one prefix in one row); positions are needed with a Mask.
    balanced: ids, segment_ids and positions (needed) are the rows in the
    balanced order of the mesh's 'sequence' shards (:mod:`balance`), and
    the outputs come in that order.
    """
    given = isinstance(mask, masks.Mask)
    if (balanced or given) and positions is None:
      raise ValueError('Rows in balanced order, or under a given Mask, need '
                       'their positions [B, T].')
    if positions is None:
      positions = default_positions(ids, mask, segment_ids)
    self_mask = mask if given else key_mask(mask, segment_ids, causal=True)
    shards = sharding.splits('length', ids.shape[1])
    if balanced and shards > 1:
      self_mask = self_mask.balanced_rows(shards)
    x = self._embed(ids, positions, rngs, deterministic)
    x = stack.run(
        self.layers, x,
        lambda layer, h, r: layer(h, self_mask, positions, rngs=r,
                                  deterministic=deterministic)[0],
        self.config, None if deterministic else rngs)
    if self.norm is not None:
      x = self.norm(x)
    return x if return_hidden else self._logits(x)

  def init_cache(self, batch_size: int, max_len: int) -> KVCache:
    """An empty cache of max_len slots for batch_size sequences."""
    return self._empty_cache(batch_size, max_len)


def count_params(model: nnx.Module) -> int:
  """Number of scalar parameters (a tied embedding counts once)."""
  state = nnx.state(model, nnx.Param)
  return sum(x.size for x in jax.tree.leaves(state))
