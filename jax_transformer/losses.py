"""Token-level cross-entropy with label smoothing and z-loss.

Losses return sums and the token count separately, so that values from
several devices, micro-batches or eval batches combine exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


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
