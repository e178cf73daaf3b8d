"""Batched, bucketed scoring equals the log-softmax of one full forward per
request, on one device and split over the mesh's batch axes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_transformer as jt
from jax_transformer.harness import scoring
from jax_transformer.model import sharding


@pytest.fixture(scope='module')
def model():
  config = jt.gpt2_small(vocab_size=97, num_decoder_layers=2, d_model=32,
                         num_heads=4, d_ff=64, max_len=80)
  return jt.DecoderLM(config, rngs=nnx.Rngs(0))


def requests(n=13, seed=0, max_len=80):
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(n):
    length = rng.randint(2, max_len + 1)
    count = rng.randint(1, min(length, 12) + 1)
    ids = tuple(int(x) for x in rng.randint(3, 97, length))
    targets = tuple(int(x) for x in rng.randint(3, 97, count))
    out.append(scoring.Request(ids, targets))
  return out


def one_by_one(model, request):
  """log P(targets | inputs) from a full forward of the request alone."""
  ids = jnp.array([request.inputs])
  logp = jax.nn.log_softmax(model(ids), axis=-1)[0]
  n = len(request.targets)
  rows = logp[len(request.inputs) - n:]
  picked = rows[jnp.arange(n), jnp.array(request.targets)]
  greedy = bool((rows.argmax(-1) == jnp.array(request.targets)).all())
  return float(picked.sum()), greedy


def test_the_ladder_is_short_and_holds_every_length():
  assert scoring.ladder(2048)[:9] == [32, 40, 48, 56, 64, 80, 96, 112, 128]
  assert len(scoring.ladder(2048)) == 25
  assert scoring.ladder(80) == [32, 40, 48, 56, 64, 80]
  assert scoring.ladder(16, 1) == [1, 2, 4, 8, 16]
  assert scoring.ladder(96, 8, fine=False) == [8, 16, 32, 64, 96]
  assert [scoring.bucket(n, 80) for n in (1, 32, 33, 65, 80)] == [
      32, 32, 40, 80, 80]
  # Rows of a short batch: powers of two, multiples of the shards.
  assert [scoring.rows_for(n, 16, 8) for n in (1, 9, 16)] == [8, 16, 16]
  with pytest.raises(StopIteration):
    scoring.bucket(81, 80)


def test_batched_scores_equal_one_forward_each(model):
  reqs = requests()
  # A repeated request is scored once and answered twice.
  reqs.append(reqs[3])
  scorer = scoring.Scorer(model, batch_size=4)
  got = scorer.score(reqs)
  for request, (logprob, greedy) in zip(reqs, got):
    want, want_greedy = one_by_one(model, request)
    np.testing.assert_allclose(logprob, want, rtol=2e-5, atol=2e-5)
    assert greedy == want_greedy
  assert got[-1] == got[3]
  # Widths and counts come from the ladders: at most their product.
  assert 1 <= len(scorer.shapes) <= scorer.bound()
  widths = {s[1] for s in scorer.shapes}
  assert widths <= set(scoring.ladder(80))
  assert all(k % scoring.HEAD_CHUNK == 0 and k < 2 * w + scoring.HEAD_CHUNK
             for _, w, k in scorer.shapes)


def test_choices_of_one_context_share_its_prefix(model):
  """Four choices after one context: the context once, then each choice
  (seeing the context and itself only); each answer as if scored alone (a
  single-token choice included)."""
  context = tuple(range(3, 40))
  choices = [(50,), (51, 52, 53), (60, 61), (70, 71, 72, 73, 74)]
  reqs = [scoring.Request(context + c[:-1], c) for c in choices]
  (unit,) = scoring.units_of(reqs, 80)
  assert unit.length == len(context) + sum(len(c) - 1 for c in choices)
  scorer = scoring.Scorer(model, batch_size=4)
  got = scorer.score(reqs)
  assert {s[0] for s in scorer.shapes} == {1}
  for request, (logprob, greedy) in zip(reqs, got):
    want, want_greedy = one_by_one(model, request)
    np.testing.assert_allclose(logprob, want, rtol=2e-5, atol=2e-5)
    assert greedy == want_greedy


def test_short_requests_share_a_row_and_a_long_unit_splits(model):
  """Eight short requests of different contexts fill one row; choices
  that overflow the row's width take two units, each with the context."""
  short = requests(n=8, seed=2, max_len=9)
  assert len(scoring.fill(scoring.units_of(short, 80), 80)) == 1
  context = tuple(range(3, 63))
  long = [scoring.Request(context + (c,) * 7, (c,) * 8)
          for c in range(70, 74)]
  assert [u.members for u in scoring.units_of(long, 80)] == [[0, 1], [2, 3]]
  reqs = short + long
  got = scoring.Scorer(model, batch_size=16).score(reqs)
  for request, (logprob, greedy) in zip(reqs, got):
    want, want_greedy = one_by_one(model, request)
    np.testing.assert_allclose(logprob, want, rtol=2e-5, atol=2e-5)
    assert greedy == want_greedy


def test_a_greedy_continuation_is_flagged(model):
  prompt = (5, 9, 14, 20)
  ids = jnp.array([prompt])
  best = int(model(ids)[0, -1].argmax())
  worst = int(model(ids)[0, -1].argmin())
  (_, yes), (_, no) = scoring.Scorer(model, 2).score(
      [scoring.Request(prompt, (best,)), scoring.Request(prompt, (worst,))])
  assert yes and not no


@pytest.mark.parametrize('shared', [False, True])
def test_split_over_data_and_fsdp_equals_one_device(model, shared):
  """Requests alone or sharing a prefix, on a mesh of 2 x 4 host devices,
  get the answers of one device."""
  context = tuple(range(3, 40))
  reqs = ([scoring.Request(context + (c,) * k, (c,) * (k + 1))
           for k, c in enumerate(range(50, 58))] if shared
          else requests(n=9, seed=1))
  alone = scoring.Scorer(model, batch_size=8).score(reqs)
  mesh = sharding.make_mesh({'data': 2, 'fsdp': 4, 'tensor': 1},
                            jax.devices()[:8])
  scorer = scoring.Scorer(model, batch_size=6, mesh=mesh)
  assert scorer.batch_size == 8  # rounded up to the 8 batch shards
  split = scorer.score(reqs)
  assert all(s[0] % 8 == 0 for s in scorer.shapes)
  for (a, ga), (b, gb) in zip(alone, split):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert ga == gb
