"""Token choosers: greedy, temperature, top-k, top-p, and their composition."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_transformer.sampling import (Sampler, greedy, is_deterministic,
                                      top_k_mask, top_p_mask)

# One row of logits with clearly different probabilities, and a tie.
ROW = np.log(np.array([0.02, 0.30, 0.05, 0.20, 0.20, 0.13, 0.08, 0.02]))
DRAWS = 4000


def softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


def draw(sampler, row=ROW, n=DRAWS, seed=0):
  """n samples from one row (repeated n times) with one key."""
  logits = jnp.asarray(np.tile(row, (n, 1)), jnp.float32)
  return np.asarray(sampler(logits, jax.random.key(seed)))


def frequencies(ids, v=len(ROW)):
  return np.bincount(ids, minlength=v) / len(ids)


def test_greedy_takes_the_argmax_and_the_lower_id_on_ties():
  logits = jnp.array([[0.0, 3.0, 3.0, 1.0], [5.0, -1.0, 2.0, 5.0]])
  np.testing.assert_array_equal(greedy(logits), [1, 0])
  assert greedy(logits).dtype == jnp.int32


@pytest.mark.parametrize('sampler', [Sampler(top_k=1), Sampler(0.0),
                                     Sampler(0.0, top_k=5, top_p=0.5)])
def test_greedy_samplers_equal_greedy(sampler):
  logits = jax.random.normal(jax.random.key(1), (64, 50))
  logits = logits.at[:, 7].set(10.0).at[:, 3].set(10.0)  # ties -> id 3
  assert sampler.is_greedy and is_deterministic(sampler)
  np.testing.assert_array_equal(sampler(logits, jax.random.key(2)),
                                greedy(logits))
  np.testing.assert_array_equal(sampler(logits, jax.random.key(2)), 3)


def test_same_key_same_samples_other_key_other_samples():
  sampler = Sampler(temperature=1.3, top_k=6, top_p=0.95)
  logits = jax.random.normal(jax.random.key(0), (256, 40))
  a = sampler(logits, jax.random.key(7))
  np.testing.assert_array_equal(a, sampler(logits, jax.random.key(7)))
  np.testing.assert_array_equal(a, jax.jit(sampler)(logits,
                                                    jax.random.key(7)))
  assert (np.asarray(a) != np.asarray(sampler(logits, jax.random.key(8)))
          ).mean() > 0.3
  assert not is_deterministic(sampler)


def test_plain_sampling_follows_the_softmax():
  freq = frequencies(draw(Sampler()))
  np.testing.assert_allclose(freq, softmax(ROW), atol=0.03)


def test_temperature_sharpens_and_flattens():
  for t in (0.5, 2.0):
    freq = frequencies(draw(Sampler(temperature=t)))
    np.testing.assert_allclose(freq, softmax(ROW / t), atol=0.03)


def test_top_k_samples_only_the_k_most_likely():
  ids = draw(Sampler(top_k=3))
  # 0.30 then the tie 0.20/0.20: ids 1, 3, 4.
  assert set(ids) == {1, 3, 4}
  np.testing.assert_allclose(frequencies(ids)[[1, 3, 4]],
                             np.array([0.3, 0.2, 0.2]) / 0.7, atol=0.03)


def test_top_k_mask_keeps_exactly_k_with_ties_to_the_lower_id():
  mask = top_k_mask(jnp.array([[1.0, 2.0, 2.0, 2.0, 0.0]]), 2)
  np.testing.assert_array_equal(mask, [[False, True, True, False, False]])


def nucleus(probs, p):
  """Reference nucleus: sorted by probability (then id), mass before < p."""
  order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
  kept, mass = set(), 0.0
  for i in order:
    if mass >= p:
      break
    kept.add(i)
    mass += probs[i]
  return kept


@pytest.mark.parametrize('p', [0.25, 0.45, 0.55, 0.85])  # off boundaries
def test_top_p_samples_only_the_nucleus(p):
  allowed = nucleus(softmax(ROW), p)
  ids = draw(Sampler(top_p=p), seed=int(p * 100))
  assert set(ids) == allowed
  np.testing.assert_array_equal(
      np.flatnonzero(top_p_mask(jnp.asarray(ROW)[None], p)[0]),
      sorted(allowed))


def test_top_p_keeps_the_most_likely_token_even_for_tiny_p():
  ids = draw(Sampler(top_p=1e-6), n=200)
  np.testing.assert_array_equal(ids, 1)


def test_top_k_then_top_p_compose():
  # top-k 4 keeps {1, 3, 4, 5}; renormalised (.30 .20 .20 .13)/.83 the
  # nucleus of 0.6 is {1, 3} (mass before 4 is .5/.83 = 0.602 >= 0.6).
  sampler = Sampler(temperature=1.0, top_k=4, top_p=0.6)
  assert set(draw(sampler)) == {1, 3}
  filtered = np.asarray(sampler.filter_logits(jnp.asarray(ROW)[None]))[0]
  assert np.isinf(filtered[[0, 2, 4, 5, 6, 7]]).all()


@pytest.mark.parametrize('kwargs', [
    dict(temperature=-0.1), dict(temperature='hot'), dict(top_k=0),
    dict(top_k=2.5), dict(top_p=0.0), dict(top_p=1.5),
])
def test_bad_settings_are_one_clear_sentence(kwargs):
  with pytest.raises(ValueError, match=r'^Sampler: .* must be .*\.$'):
    Sampler(**kwargs)


def test_samplers_are_hashable_values():
  assert Sampler(0.7, 5) == Sampler(0.7, 5)
  assert hash(Sampler(0.7, 5)) == hash(Sampler(0.7, 5))
  assert Sampler(0.7, 5) != Sampler(0.7, 6)
