"""Token-level cross-entropy with label smoothing and z-loss.

Losses return sums and the token count separately, so that values from
several devices, micro-batches or eval batches combine exactly.
``cross_entropy`` takes the logits (the reference, and the eval path);
``chunked_cross_entropy`` takes the head's input and kernel instead, so that
training never holds float32 [B, T, V] logits.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jax_transformer.model import sharding


def cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                  label_smoothing: float = 0.0,
                  z_loss: float = 0.0) -> dict[str, jax.Array]:
  """Weighted token losses.

  logits [B, T, V] (float32), targets [B, T] int, weights [B, T] (0 on
  padding). Returns sums over tokens: 'loss' (the training objective:
  smoothed cross-entropy plus z-loss), 'nll' (plain negative log-likelihood,
  for perplexity) and 'tokens' (the weight sum).
  """
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  if label_smoothing:
    labels = optax.smooth_labels(
        jax.nn.one_hot(targets, logits.shape[-1]), label_smoothing)
    loss = optax.softmax_cross_entropy(logits, labels)
  else:
    loss = nll
  if z_loss:
    # Keeps the softmax normaliser near 1 (PaLM): z_loss * log(Z)^2.
    loss = loss + z_loss * jnp.square(jax.nn.logsumexp(logits, axis=-1))
  return {'loss': (loss * weights).sum(), 'nll': (nll * weights).sum(),
          'tokens': weights.sum()}


def chunked_cross_entropy(hidden: jax.Array, kernel: jax.Array,
                          targets: jax.Array, weights: jax.Array,
                          label_smoothing: float = 0.0, z_loss: float = 0.0,
                          chunk_size: int = 1024,
                          compute_dtype=jnp.float32) -> dict[str, jax.Array]:
  """``cross_entropy`` of the output head, never holding all the logits.

  hidden [B, T, D] (after the final norm), kernel [D, V] (the output
  projection; for tied embeddings pass the table transposed, ``table.T``),
  targets [B, T] int, weights [B, T] (0 on padding). Returns the same sums as
  ``cross_entropy(einsum(hidden, kernel), ...)``.

  The B * T token rows go through the head ``chunk_size`` at a time (at most
  B * T); rows of weight 0 pad B * T up to a multiple of the chunk size, so
  any positive chunk size works. Each chunk's
  logits are float32 [chunk, V], computed as the model's head computes them
  (operands in ``compute_dtype``, float32 accumulation). Only one chunk's
  logits exist at a time in the forward pass and in the backward pass, which
  recomputes them. The gradient reaches hidden, kernel and weights.

  Traced under a mesh, the kernel is gathered over its FSDP shards once,
  before the loop (keeping its vocabulary split over ``tensor``), each
  chunk's rows and logits stay split over the batch axes, and the
  kernel's gradient is summed over the loop on each device and
  reduce-scattered once after it: no collective runs per chunk.
  """
  if chunk_size < 1:
    raise ValueError(f'chunk_size must be positive, got {chunk_size}')
  batch, length, width = hidden.shape
  rows = batch * length
  size = min(chunk_size, rows)
  num_chunks = -(-rows // size)
  # Rows in the order that keeps each device's tokens together, a row's
  # positions split over the mesh or not (the sums ignore the order).
  per_token = _token_losses(
      _to_chunks(sharding.token_rows(hidden), num_chunks, size), kernel,
      _to_chunks(sharding.token_rows(targets), num_chunks, size),
      float(label_smoothing), float(z_loss), jnp.dtype(compute_dtype))
  loss, nll = (sharding.from_token_rows(_from_chunks(x, rows), batch, length)
               for x in per_token)
  weights = weights.astype(jnp.float32)
  return {'loss': (loss * weights).sum(), 'nll': (nll * weights).sum(),
          'tokens': weights.sum()}


def _to_chunks(x: jax.Array, num_chunks: int, size: int) -> jax.Array:
  """x [R, ...] -> [num_chunks, size, ...], zero rows appended as padding.

  Chunk j holds rows j, j + num_chunks, j + 2 * num_chunks, ...: strided
  rather than contiguous, so that each chunk spans the whole batch and a
  batch-sharded x keeps every device busy on every chunk.
  """
  pad = num_chunks * size - x.shape[0]
  x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
  return x.reshape(size, num_chunks, *x.shape[1:]).swapaxes(0, 1)


def _from_chunks(x: jax.Array, rows: int) -> jax.Array:
  """Inverse of ``_to_chunks``: [num_chunks, size] -> [rows], padding
  dropped."""
  return x.swapaxes(0, 1).reshape(-1)[:rows]


def _chunk_logits(hidden: jax.Array, kernel: jax.Array, dtype) -> jax.Array:
  """hidden [C, D], kernel [D, V] (already in dtype) -> float32 [C, V].

  The same einsum as the model's head, so a chunk's logits are the model's.
  """
  return sharding.constrain(
      jnp.einsum('CD,DV->CV', _by_rows(hidden).astype(dtype), kernel,
                 preferred_element_type=jnp.float32), ('tokens', 'vocab'))


def _gathered(kernel: jax.Array) -> jax.Array:
  """kernel [D, V] whole on every device of a mesh's batch axes (its
  vocabulary still split over ``tensor``): read by every chunk of the
  loop, so gathered once before it rather than once per chunk.
  """
  return sharding.constrain(kernel, (None, 'vocab'))


def _batch_shards(rows: int) -> int:
  """How many ways the mesh in context splits a chunk of ``rows`` rows
  over its batch and position axes (1 without a mesh, or where they do
  not divide)."""
  return sharding.splits('tokens', rows)


def _split_rows(x: jax.Array, shards: int) -> jax.Array:
  """x [C, ...] -> [shards, C / shards, ...]: each batch shard's rows."""
  return x.reshape(shards, x.shape[0] // shards, *x.shape[1:])


def _per_shard(partial: jax.Array) -> jax.Array:
  """partial [shards, D, V]: one slot per batch shard, each on its shard
  (the vocabulary split over ``tensor``)."""
  return sharding.constrain(partial, ('tokens', None, 'vocab'))


def _by_rows(rows: jax.Array) -> jax.Array:
  """A chunk's rows [C, ...] split over the mesh's batch and position
  axes."""
  return sharding.constrain(rows, ('tokens',) + (None,) * (rows.ndim - 1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _token_losses(hidden: jax.Array, kernel: jax.Array, targets: jax.Array,
                  label_smoothing: float, z_loss: float,
                  dtype) -> tuple[jax.Array, jax.Array]:
  """hidden [N, C, D] (N chunks of C rows), kernel [D, V], targets [N, C].

  Returns unweighted per-token (loss, nll), each float32 [N, C].
  """
  return _token_losses_fwd(hidden, kernel, targets, label_smoothing, z_loss,
                           dtype)[0]


def _token_losses_fwd(hidden, kernel, targets, label_smoothing, z_loss,
                      dtype):
  """Scans the chunks; keeps each row's log-normaliser for the backward."""
  kernel_c = _gathered(kernel.astype(dtype))
  vocab = kernel.shape[-1]

  def chunk(_, xs):
    rows, ids = xs
    logits = _chunk_logits(rows, kernel_c, dtype)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target = jnp.take_along_axis(logits, ids[:, None], axis=-1)[:, 0]
    nll = lse - target
    loss = nll
    if label_smoothing:
      # -sum_v q_v log p_v for q = (1 - eps) onehot + eps / V, using
      # sum_v q_v = 1: no [C, V] label tensor is needed.
      loss = (lse - (1.0 - label_smoothing) * target
              - (label_smoothing / vocab) * logits.sum(-1))
    if z_loss:
      loss = loss + z_loss * jnp.square(lse)
    return None, (loss, nll, lse)

  _, (loss, nll, lse) = jax.lax.scan(chunk, None, (hidden, targets))
  return (loss, nll), (hidden, kernel, targets, lse)


def _token_losses_bwd(label_smoothing, z_loss, dtype, residuals, cotangents):
  """Recomputes each chunk's logits; accumulates d kernel in float32.

  d loss / d logits = p (1 + 2 z lse) - (1 - eps) onehot - eps / V and
  d nll / d logits = p - onehot, with p the softmax.
  """
  hidden, kernel, targets, lse = residuals
  g_loss, g_nll = cotangents
  kernel_c = _gathered(kernel.astype(dtype))
  vocab = kernel.shape[-1]

  def chunk(d_kernel, xs):
    rows, ids, row_lse, gl, gn = xs
    logits = _chunk_logits(rows, kernel_c, dtype)
    probs = jnp.exp(logits - row_lse[:, None])
    scale = gl * (1.0 + 2.0 * z_loss * row_lse) + gn
    at_target = gl * (1.0 - label_smoothing) + gn
    # The one-hot term as a select, which XLA fuses into this elementwise
    # pass: no one-hot is stored, and no scatter that would gather the rows
    # of a batch-sharded chunk.
    is_target = jnp.arange(vocab) == ids[:, None]
    d_logits = (scale[:, None] * probs
                - (gl * (label_smoothing / vocab))[:, None]
                - jnp.where(is_target, at_target[:, None], 0.0))
    # Backward matmuls in the compute dtype too, accumulating in float32.
    d_logits = d_logits.astype(dtype)
    d_rows = jnp.einsum('CV,DV->CD', d_logits, kernel_c,
                        preferred_element_type=jnp.float32)
    # Each device adds its own rows' share to its own partial sum, held
    # on a leading axis of one slot per batch shard; the sum over devices
    # waits for the loop's end (a reduce-scatter to the kernel's shards).
    d_kernel = d_kernel + _per_shard(jnp.einsum(
        'SCD,SCV->SDV', _split_rows(rows.astype(dtype), shards),
        _split_rows(d_logits, shards), preferred_element_type=jnp.float32))
    return d_kernel, _by_rows(d_rows.astype(hidden.dtype))

  shards = _batch_shards(hidden.shape[1])
  d_kernel, d_hidden = jax.lax.scan(
      chunk, _per_shard(jnp.zeros((shards, *kernel.shape), jnp.float32)),
      (hidden, targets, lse, g_loss, g_nll))
  d_kernel = d_kernel.sum(0)
  # Integer targets take a float0 cotangent, as custom_vjp requires.
  d_targets = np.zeros(targets.shape, jax.dtypes.float0)
  return d_hidden, d_kernel.astype(kernel.dtype), d_targets


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)
