"""Embeddings, positional encodings, norms, feed-forward and dropout.

Every parameter is created by :func:`param`, which records its logical axis
names (``('embed', 'mlp')``, ...) as the ``out_sharding`` metadata; the
trainer maps those names to mesh axes (see ``sharding.py``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_transformer.model.config import ModelConfig
from jax_transformer.model.low_rank import project
from jax_transformer.model.sharding import (
  constrain,
  from_token_rows,
  token_rows,
)

Array = jax.Array
Initializer = nnx.initializers.Initializer


def param(rngs: nnx.Rngs, init: Initializer, shape: tuple[int, ...],
          axes: tuple[str, ...], dtype) -> nnx.Param:
  """A parameter annotated with one logical axis name per dimension."""
  assert len(shape) == len(axes), (shape, axes)
  return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=axes,
                   eager_sharding=False)


def _mix32(x: Array) -> Array:
  """A bijective 32-bit integer hash (xorshift-multiply, two rounds)."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def _next_seeds(rngs: nnx.Rngs) -> tuple[Array, Array]:
  """Seed words for the next dropout call of the ``dropout`` stream: its key
  mixed with its call counter, which advances as ``rngs.dropout()`` would.
  Integer ops only: a threefry fold-in per call would cost each of a
  model's dropout sites a loop in the compiled step."""
  stream = rngs.dropout
  count = stream.count[...]
  stream.count[...] = count + 1
  words = jax.random.key_data(stream.key[...]).reshape(-1).astype(jnp.uint32)
  c = _mix32(count.astype(jnp.uint32) + jnp.uint32(0x9E3779B9))
  first = _mix32(words[0] ^ c)
  return first, _mix32(words[-1] ^ _mix32(c + first))


def hash_bits(rngs: nnx.Rngs, shape: tuple[int, ...]) -> Array:
  """uint32 bits of ``shape`` from a counter hash, the next draw of the
  ``dropout`` stream of ``rngs``.

  Each element hashes its flat index with two seed words. Unlike threefry
  over the whole shape, this is a few integer ops that fuse into the
  consumer: no [shape] buffer of bits, and a fraction of the compile time.
  Good enough for dropout masks, not for cryptography.
  """
  first, second = _next_seeds(rngs)
  count = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  return _mix32(_mix32(count ^ first) + second)


def dropout(x: Array, rate: float, rngs: nnx.Rngs | None,
            deterministic: bool, rng: str = 'threefry') -> Array:
  """Inverted dropout; a no-op when ``deterministic`` or ``rate == 0``.

  rng: 'threefry' (``jax.random.bernoulli``) or 'hash' (:func:`hash_bits`).
  """
  if deterministic or rate == 0.0:
    return x
  if rngs is None:
    raise ValueError('Training mode (deterministic=False) needs '
                     'rngs=nnx.Rngs(dropout=key) for dropout.')
  if rng == 'hash':
    # keep with probability round((1 - rate) * 2^32) / 2^32.
    threshold = min(round((1.0 - rate) * 2.0 ** 32), 2 ** 32 - 1)
    keep = hash_bits(rngs, x.shape) < jnp.uint32(threshold)
  else:
    keep = jax.random.bernoulli(rngs.dropout(), 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


class Embed(nnx.Module):
  """Token embedding ``[V, D]``, optionally scaled by sqrt(D) (the paper)."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    self.config = config
    # Scaled embeddings start at d^-0.5 so embed * sqrt(d) has unit scale
    # (and a tied head starts with small logits).
    std = config.d_model ** -0.5 if config.scale_embeddings else 0.02
    init = nnx.initializers.normal(std)
    self.embedding = param(rngs, init, (config.vocab_size, config.d_model),
                           ('vocab', 'embed'), config.params_dtype)

  def __call__(self, ids: Array) -> Array:
    """ids [B, T] int -> [B, T, D] in the compute dtype."""
    table = self.embedding[...].astype(self.config.compute_dtype)
    x = jnp.take(table, ids, axis=0)
    if self.config.scale_embeddings:
      x = x * jnp.asarray(math.sqrt(self.config.d_model), x.dtype)
    return x

  def attend(self, x: Array) -> Array:
    """The tied output head: x [B, T, D] -> logits [B, T, V] in float32."""
    table = self.embedding[...].astype(self.config.compute_dtype)
    return jnp.einsum('BTD,VD->BTV', x.astype(table.dtype), table,
                      preferred_element_type=jnp.float32)


def sinusoidal(positions: Array, d_model: int) -> Array:
  """The paper's encoding, interleaved as the seed: even dims sin, odd cos.

  positions [..., T] int -> [..., T, D] float32.
  """
  # A constant correctly rounded to float32, divided (not multiplied by an
  # inverse): this rounds as the seed's torch code does.
  freq = (10000.0 ** (np.arange(0, d_model, 2) / d_model)).astype(np.float32)
  angle = positions.astype(jnp.float32)[..., None] / freq
  # Stack on a trailing axis then flatten: [sin0, cos0, sin1, cos1, ...].
  return jnp.stack([jnp.sin(angle), jnp.cos(angle)], -1).reshape(
      *angle.shape[:-1], d_model)


class LearnedPositions(nnx.Module):
  """A learned table ``[max_len, D]`` indexed by position (GPT-2's wpe)."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    self.config = config
    self.embedding = param(rngs, nnx.initializers.normal(0.02),
                           (config.max_len, config.d_model),
                           ('position', 'embed'), config.params_dtype)

  def __call__(self, positions: Array) -> Array:
    """positions [B, T] -> [B, T, D]."""
    return jnp.take(self.embedding[...], positions, axis=0)


def rope_frequencies(config: ModelConfig) -> Array | None:
  """The rotary inverse frequencies [H/2] of a scaled config (Llama 3's
  rope_scaling, as transformers computes them), or None: unscaled, which
  :func:`rotate` computes itself."""
  if config.rope_scaling == 'none':
    return None
  half = config.head_dim // 2
  inv_freq = config.rope_base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  factor, old_len = config.rope_scaling_factor, config.rope_original_max_len
  low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
  smooth = (old_len / wavelen - low) / (high - low)
  blended = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
  return jnp.where(medium, blended, scaled)


def rotate(x: Array, positions: Array, base: float,
           inv_freq: Array | None = None) -> Array:
  """Rotary position embedding (RoPE) of queries or keys.

  Rotates pairs (x[i], x[i + H/2]) by angle position * base^(-2i/H), the
  "rotate half" layout of GPT-NeoX and Llama (or by position * inv_freq[i]
  when given: :func:`rope_frequencies`).
  x [B, T, N, H], positions [B, T] -> [B, T, N, H].
  """
  half = x.shape[-1] // 2
  if inv_freq is None:
    inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = positions.astype(jnp.float32)[:, :, None, None] * inv_freq
  sin, cos = jnp.sin(angle), jnp.cos(angle)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


class LayerNorm(nnx.Module):
  """LayerNorm over the last axis with scale and bias, computed in float32."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    self.eps = config.layer_norm_eps
    d, dtype = config.d_model, config.params_dtype
    self.scale = param(rngs, nnx.initializers.ones, (d,), ('norm',), dtype)
    self.bias = param(rngs, nnx.initializers.zeros, (d,), ('norm',), dtype)

  def __call__(self, x: Array) -> Array:
    """x [..., D] -> [..., D] (same dtype)."""
    y = x.astype(jnp.float32)
    mean = y.mean(-1, keepdims=True)
    var = jnp.square(y - mean).mean(-1, keepdims=True)
    y = (y - mean) * jax.lax.rsqrt(var + self.eps)
    return (y * self.scale[...] + self.bias[...]).astype(x.dtype)


class RMSNorm(nnx.Module):
  """Root-mean-square norm with a learned scale (no centring, no bias)."""

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    self.eps = config.layer_norm_eps
    self.scale = param(rngs, nnx.initializers.ones, (config.d_model,),
                       ('norm',), config.params_dtype)

  def __call__(self, x: Array) -> Array:
    y = x.astype(jnp.float32)
    y = y * jax.lax.rsqrt(jnp.square(y).mean(-1, keepdims=True) + self.eps)
    return (y * self.scale[...]).astype(x.dtype)


def make_norm(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Module:
  return (RMSNorm if config.norm == 'rmsnorm' else LayerNorm)(config, rngs)


_ACTIVATIONS = {
    'relu': jax.nn.relu,
    'gelu': lambda x: jax.nn.gelu(x, approximate=False),
    'gelu_tanh': lambda x: jax.nn.gelu(x, approximate=True),
}


class FeedForward(nnx.Module):
  """Position-wise MLP: wo(dropout(act(wi x))), or SwiGLU's gated form.

  SwiGLU: wo(silu(wi_gate x) * wi x), biases off as in modern LMs.
  """

  def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
    self.config = config
    d, f, dtype = config.d_model, config.d_ff, config.params_dtype
    self.gated = config.activation == 'swiglu'
    self.use_bias = config.use_bias and not self.gated
    kernel = nnx.initializers.lecun_normal()
    self.wi = param(rngs, kernel, (d, f), ('embed', 'mlp'), dtype)
    self.wo = param(rngs, kernel, (f, d), ('mlp', 'embed'), dtype)
    if self.gated:
      self.wi_gate = param(rngs, kernel, (d, f), ('embed', 'mlp'), dtype)
    if self.use_bias:
      zeros = nnx.initializers.zeros
      self.bi = param(rngs, zeros, (f,), ('mlp',), dtype)
      self.bo = param(rngs, zeros, (d,), ('embed',), dtype)

  def __call__(self, x: Array, rngs: nnx.Rngs | None = None,
               deterministic: bool = True) -> Array:
    """x [B, T, D] -> [B, T, D].

    Both projections multiply rows ([B*T, D] and [B*T, F]): with B and T
    apart, XLA:CPU computes wi's weight gradient from a transposed copy of
    [B, T, F] that cost a third of the default job's step (the same
    products, bit for bit). The rows keep the activations' sharding, a
    split 'length' included (:func:`sharding.token_rows`)."""
    dtype = self.config.compute_dtype
    x = x.astype(dtype)
    b, t = x.shape[:2]
    rows = token_rows(x)  # [B*T, D]
    h = from_token_rows(project(rows, self.wi, 'MD,DF->MF', dtype), b, t)
    if self.use_bias:
      h = h + self.bi[...].astype(dtype)
    if self.gated:
      gate = project(rows, self.wi_gate, 'MD,DF->MF', dtype)
      h = jax.nn.silu(from_token_rows(gate, b, t)) * h
    else:
      h = _ACTIVATIONS[self.config.activation](h)
    h = constrain(h, ('batch', 'length', 'mlp'))
    h = dropout(h, self.config.dropout_rate, rngs, deterministic,
                self.config.dropout_rng)
    y = from_token_rows(
        project(token_rows(h), self.wo, 'MF,FD->MD', dtype), b, t)
    if self.use_bias:
      y = y + self.bo[...].astype(dtype)
    return y
