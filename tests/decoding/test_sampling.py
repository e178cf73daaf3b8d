"""Token choosers: greedy, temperature, top-k, top-p, and their composition."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_transformer.decoding.sampling import (
  Sampler,
  allowed,
  greedy,
  is_deterministic,
  top_k_mask,
  top_p_mask,
)

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


# ----------------------------------------------------------------------------
# The filters before top-k and top-p shared one lax.top_k: the reference is
# the earlier implementation, a top-k mask then a full sort for the nucleus.


def reference_filter(sampler, logits):
  """Sampler.filter_logits as it was: each filter on all V logits."""
  logits = logits.astype(jnp.float32)
  if sampler.temperature != 1:
    logits = logits / jnp.float32(sampler.temperature)
  v = logits.shape[-1]
  rows = jnp.arange(logits.shape[0])[:, None]
  if sampler.top_k is not None and sampler.top_k < v:
    _, index = jax.lax.top_k(logits, min(sampler.top_k, v))
    kept = jnp.zeros(logits.shape, bool).at[rows, index].set(True)
    logits = jnp.where(kept, logits, -jnp.inf)
  if sampler.top_p is not None and sampler.top_p < 1.0:
    ordered, index = jax.lax.top_k(logits, v)
    probs = jax.nn.softmax(ordered, axis=-1)
    keep = jnp.cumsum(probs, axis=-1) - probs < sampler.top_p
    kept = jnp.zeros(logits.shape, bool).at[rows, index].set(keep)
    logits = jnp.where(kept, logits, -jnp.inf)
  return logits


def random_logits(seed, shape, spread):
  """Normal logits; spread 0 rounds them to halves (many ties) and blocks
  a few (-inf), as an earlier filter would."""
  x = jax.random.normal(jax.random.key(seed), shape)
  if spread:
    return spread * x
  blocked = jax.random.bernoulli(jax.random.key(seed + 1), 0.05, shape)
  return jnp.where(blocked, -jnp.inf, jnp.round(2 * x) / 2)


# Each vocabulary size and each temperature once: the temperature divides
# the logits before any filter, whatever their width, so the 2 x 2 grid's
# other two cases checked no other path.
@pytest.mark.parametrize('v,temperature', [(50, 1.0), (1000, 0.7)])
def test_filters_and_samples_equal_the_reference_token_for_token(
    v, temperature):
  checked = 0
  for (k, p), (seed, spread) in itertools.product(
      [(5, None), (40, None), (None, 0.5), (None, 0.95), (3, 0.9),
       (40, 0.5), (40, 0.99), (v - 1, 0.9)],
      [(0, 1.0), (1, 4.0), (2, 0.0)]):
    sampler = Sampler(temperature, k, p)
    logits = random_logits(seed, (64, v), spread)
    np.testing.assert_array_equal(sampler.filter_logits(logits),
                                  reference_filter(sampler, logits))
    for draw_seed in range(3):
      key = jax.random.key(100 * seed + draw_seed)
      want = jax.random.categorical(key, reference_filter(sampler, logits))
      np.testing.assert_array_equal(sampler(logits, key), want)
      checked += 1
  assert checked == 8 * 3 * 3


def test_jitted_filters_equal_the_reference():
  logits = random_logits(3, (256, 1000), 2.0)
  for sampler in (Sampler(0.8, 40, 0.9), Sampler(top_p=0.9)):
    np.testing.assert_array_equal(
        jax.jit(sampler.filter_logits)(logits),
        jax.jit(functools.partial(reference_filter, sampler))(logits))


def test_allowed_with_both_filters_keeps_the_nucleus_of_the_top_k():
  # The test row renormalised over top-3 {1, 3, 4} (.30 .20 .20)/.70: the
  # mass before id 4 is 0.5/0.7 = 0.714 < 0.75, so all three stay; at
  # p = 0.7 id 4 goes.
  row = jnp.asarray(ROW)[None]
  np.testing.assert_array_equal(np.flatnonzero(allowed(row, 3, 0.75)[0]),
                                [1, 3, 4])
  np.testing.assert_array_equal(np.flatnonzero(allowed(row, 3, 0.7)[0]),
                                [1, 3])
  np.testing.assert_array_equal(allowed(row), np.ones((1, 8), bool))
