"""Token choosers: pure functions of ``(logits [B, V], key) -> ids [B]``.

``greedy`` takes the argmax. :class:`Sampler` draws from the softmax after
three optional filters, applied in this order (as Hugging Face does):

1. temperature: logits / temperature (0 means greedy);
2. top-k: keep the k most likely tokens (ties go to the lower id);
3. top-p (nucleus): keep the smallest set of most likely tokens whose
   probability (after 1 and 2) reaches p.

Everything here is jit-able and deterministic for a given key. A sampler is a
hashable value, so the decoding loops take it as a static argument.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_transformer.errors import UsageError

Array = jax.Array

_BLOCKED = -jnp.inf


def greedy(logits: Array, key: Array | None = None) -> Array:
  """The most likely token (the lowest id among ties): [B, V] -> [B] int32."""
  del key  # Deterministic; the argument keeps the chooser signature.
  return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def allowed(logits: Array, k: int | None = None,
            p: float | None = None) -> Array:
  """The tokens top-k then top-p keep: [B, V] -> [B, V] bool.

  k: keep the k largest logits (ties to the lower id), exactly k per row;
  None keeps all. p: of those, the nucleus: a token is kept when the
  probability (renormalised over the k) of the strictly more likely ones,
  ties ordered by id, is below p, so the most likely token always stays;
  None keeps all. logits may hold -inf (blocked) entries.

  One ``lax.top_k`` gives the candidates already sorted, so with k set the
  nucleus is found among k values, not V. With p alone the candidates are
  the whole vocabulary (a full sort): an exact nucleus has no cheaper bound
  on how many tokens it holds. Leaving the other V - k tokens out of the
  softmax and the cumulative sum changes no mask: they would add exp(-inf)
  = 0 to the one and come after the k in the other (test_sampling checks
  the tokens against filtering all V logits, bit for bit).
  """
  v = logits.shape[-1]
  count = v if k is None else min(k, v)
  ordered, index = jax.lax.top_k(logits, count)          # descending [B, C]
  keep = jnp.ones(ordered.shape, bool)
  if p is not None:
    probs = jax.nn.softmax(ordered, axis=-1)
    keep = jnp.cumsum(probs, axis=-1) - probs < p
  rows = jnp.arange(logits.shape[0])[:, None]
  return jnp.zeros(logits.shape, bool).at[rows, index].set(keep)


def top_k_mask(logits: Array, k: int) -> Array:
  """True on the k largest logits of each row: [B, V] -> [B, V] bool.

  Exactly k per row (k clipped to V); among equal logits the lower id wins,
  so k = 1 keeps exactly the greedy token.
  """
  return allowed(logits, k=k)


def top_p_mask(logits: Array, p: float) -> Array:
  """The nucleus: True on the fewest most likely tokens with mass >= p.

  logits [B, V] (blocked entries -inf) -> [B, V] bool; see :func:`allowed`.
  """
  return allowed(logits, p=p)


@dataclasses.dataclass(frozen=True)
class Sampler:
  """Temperature, top-k and top-p sampling, composable.

  ``Sampler()`` samples from the model's distribution; ``Sampler(0.0)`` and
  ``Sampler(top_k=1)`` are greedy. ``top_k=None`` and ``top_p=None`` (or
  1.0) switch those filters off.
  """

  temperature: float = 1.0
  top_k: int | None = None
  top_p: float | None = None

  def __post_init__(self):
    t, k, p = self.temperature, self.top_k, self.top_p
    if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
      raise UsageError(f'Sampler: temperature must be a number >= 0, got '
                       f'{t!r}.')
    if k is not None and (isinstance(k, bool) or not isinstance(k, int)
                          or k < 1):
      raise UsageError(f'Sampler: top_k must be a positive integer or None, '
                       f'got {k!r}.')
    if p is not None and (isinstance(p, bool)
                          or not isinstance(p, (int, float))
                          or not 0.0 < p <= 1.0):
      raise UsageError(f'Sampler: top_p must be in (0, 1] or None, got {p!r}.')

  @property
  def is_greedy(self) -> bool:
    """True when the choice does not depend on the key."""
    return self.temperature == 0 or self.top_k == 1

  def filter_logits(self, logits: Array) -> Array:
    """Tempered float32 logits [B, V], -inf outside the allowed tokens."""
    logits = logits.astype(jnp.float32)
    if self.temperature != 1:
      logits = logits / jnp.float32(self.temperature)
    v = logits.shape[-1]
    k = self.top_k if self.top_k is not None and self.top_k < v else None
    p = self.top_p if self.top_p is not None and self.top_p < 1.0 else None
    if k is not None or p is not None:
      logits = jnp.where(allowed(logits, k, p), logits, _BLOCKED)
    return logits

  def __call__(self, logits: Array, key: Array) -> Array:
    """logits [B, V], key -> token ids [B] int32."""
    if self.is_greedy:
      return greedy(logits)
    return jax.random.categorical(key, self.filter_logits(logits),
                                  axis=-1).astype(jnp.int32)


def is_deterministic(sampler) -> bool:
  """Whether ``sampler`` ignores its key (greedy or a greedy Sampler)."""
  return sampler is greedy or bool(getattr(sampler, 'is_greedy', False))
