"""Encoder and decoder layers, post-norm (the paper) or pre-norm.

Post-norm: x = norm(x + dropout(sublayer(x)))      (norm_first=False)
Pre-norm:  x = x + dropout(sublayer(norm(x)))      (norm_first=True)
exactly as PyTorch's nn.TransformerEncoderLayer / DecoderLayer.
"""

from __future__ import annotations

from typing import Callable

import jax
from flax import nnx

from jax_transformer.model.attention import Attention, write_slots
from jax_transformer.model.config import ModelConfig
from jax_transformer.model.layers import FeedForward, dropout, make_norm
from jax_transformer.model.sharding import constrain

Array = jax.Array
# The residual stream [B, T, D].
ACTIVATION_AXES = ('batch', 'length', 'embed')


class _Layer(nnx.Module):
  """Shared residual wiring of every sublayer."""

  config: ModelConfig

  def _residual(self, x: Array, norm: nnx.Module, sublayer: Callable,
                rngs: nnx.Rngs | None, deterministic: bool) -> Array:
    rate, rng = self.config.dropout_rate, self.config.dropout_rng
    if self.config.norm_first:
      x = x + dropout(sublayer(norm(x)), rate, rngs, deterministic, rng)
    else:
      x = norm(x + dropout(sublayer(x), rate, rngs, deterministic, rng))
    return constrain(x, ACTIVATION_AXES)

  def _feed_forward(self, x, rngs, deterministic):
    return self._residual(
        x, self.ff_norm, lambda h: self.ff(h, rngs, deterministic), rngs,
        deterministic)


class EncoderLayer(_Layer):
  """Self-attention then feed-forward, each wrapped in a residual."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    self.config = config
    self.self_attn = Attention(config, rngs,
                               rotary=config.positional == 'rotary')
    self.self_attn_norm = make_norm(config, rngs)
    self.ff = FeedForward(config, rngs)
    self.ff_norm = make_norm(config, rngs)

  def __call__(self, x: Array, mask: Array | None, positions: Array,
               rngs: nnx.Rngs | None = None,
               deterministic: bool = True) -> Array:
    """x [B, S, D], mask [B|1, 1, S|1, S], positions [B, S] -> [B, S, D]."""
    x = self._residual(
        x, self.self_attn_norm,
        lambda h: self.self_attn(h, mask, positions, rngs, deterministic),
        rngs, deterministic)
    return self._feed_forward(x, rngs, deterministic)


class DecoderLayer(_Layer):
  """Masked self-attention, cross-attention (encoder-decoder only), FF.

  With ``cross_attention=False`` this is the GPT-style block.
  """

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs,
               cross_attention: bool):
    self.config = config
    rotary = config.positional == 'rotary'
    self.self_attn = Attention(config, rngs, rotary=rotary)
    self.self_attn_norm = make_norm(config, rngs)
    if cross_attention:
      # Cross-attention is never rotated: source and target positions live
      # in different sequences.
      self.cross_attn = Attention(config, rngs, rotary=False)
      self.cross_attn_norm = make_norm(config, rngs)
    else:
      self.cross_attn = None
    self.ff = FeedForward(config, rngs)
    self.ff_norm = make_norm(config, rngs)

  def __call__(self, x: Array, mask: Array | None, positions: Array, *,
               memory_kv: tuple[Array, Array] | None = None,
               memory_mask: Array | None = None,
               cache_kv: tuple[Array, Array] | None = None,
               cache_index: Array | None = None, write_cache: bool = True,
               rngs: nnx.Rngs | None = None, deterministic: bool = True):
    """One decoder layer.

    x [B, T, D]; mask [B|1, 1, T, T or S_max] for self-attention;
    positions [B, T]; memory_kv: cross-attention (keys, values), each
    [B, S, K, H] ([B, K, S, H] as the cache holds them when cache_kv is
    given); memory_mask [B|1, 1, T|1, S]; cache_kv: this layer's cached
    (keys, values) [B, K, S_max, H], written at slot cache_index;
    write_cache False: the cache is only read (mask is then a pair: the
    cache's slots' [B, 1, 1, S_max] and the new tokens' [B|1, 1, T, T]) and
    the new tokens' (keys, values) [B, T, K, H] are returned in its place.
    Returns (x [B, T, D], updated cache_kv or None).
    """
    new_cache = None
    cached = cache_kv is not None

    def self_attend(h):
      nonlocal new_cache
      q = self.self_attn.project_query(h, positions)
      k, v = self.self_attn.project_kv(h, positions)
      if not cached:
        return self.self_attn.attend(q, k, v, mask, rngs, deterministic)
      if not write_cache:  # mask: (the cache's, the new tokens')
        new_cache = (k, v)
        return self.self_attn.attend_extended(q, cache_kv, mask[0], (k, v),
                                              mask[1])
      new_cache = (write_slots(cache_kv[0], k, cache_index),
                   write_slots(cache_kv[1], v, cache_index))
      return self.self_attn.attend_cache(q, *new_cache, mask)

    x = self._residual(x, self.self_attn_norm, self_attend, rngs,
                       deterministic)
    if self.cross_attn is not None:
      def cross_attend(h):
        q = self.cross_attn.project_query(h)
        if cached:
          return self.cross_attn.attend_cache(q, *memory_kv, memory_mask)
        return self.cross_attn.attend(q, *memory_kv, memory_mask, rngs,
                                      deterministic)
      x = self._residual(x, self.cross_attn_norm, cross_attend, rngs,
                         deterministic)
    return self._feed_forward(x, rngs, deterministic), new_cache
