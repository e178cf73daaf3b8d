"""Beam search stops a sequence only when no live beam can still win, and
moves only the new tokens' cache slots when beams are reordered.

The stopping rule is tested on ``_beam_step`` driven by a Python loop (a
Markov chain small enough to reason about by hand, and tiny models through
full forwards) and through ``beam_search`` against the exhaustive search of
test_decoding.py.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_generate_and_beam_search import TINY, exhaustive, forward, hypothesis

import jax_transformer as jt
from jax_transformer.decoding import beam, beam_search, length_penalty

# One xdist worker for the module: its programs compile once, not once
# on each worker (one process ran it in about two thirds of its
# durations).
pytestmark = pytest.mark.xdist_group('beam_early_stop')


A, B, EOS = 0, 1, 2
# Markov chains: next-token probabilities of (a, b, EOS) by the previous
# token (None: the first). In CHAIN, EOS is the likeliest first token, but a
# long run of a's scores better once alpha rewards length.
CHAIN = {None: [0.45, 0.05, 0.50], A: [0.90, 0.01, 0.09],
         B: [0.10, 0.10, 0.80]}
# EOS is likely everywhere: hypotheses finish early and well.
EARLY = dict.fromkeys([None, A, B], [0.35, 0.05, 0.60])


def chain_logp(chain):
  """logp_of for run_steps: [B, K, t] tokens so far -> next-token
  log-probabilities [B, K, 3]."""
  def logp_of(prefixes):
    last = [[None if p.size == 0 else int(p[-1]) for p in row]
            for row in prefixes]
    return np.log(np.array([[chain[x] for x in row] for row in last],
                           np.float32))
  return logp_of


def chain_scores(chain, length, alpha):
  """Every hypothesis of at most `length` tokens, with its score."""
  scores = {}
  for seq in itertools.product(range(3), repeat=length):
    h = hypothesis(seq, EOS)
    logp = sum(np.log(chain[h[i - 1] if i else None][x])
               for i, x in enumerate(h))
    scores[h] = logp / float(length_penalty(len(h), alpha))
  return scores


def run_steps(logp_of, b, k, n, alpha, eos=EOS):
  """beam_search_jit's loop in Python: the beams after each step, until
  every sequence is done. logp_of([B, K, t] tokens) -> [B, K, V]."""
  beams = beam._empty_beams(b, k, n, jnp.int32(0))
  steps = []
  for t in range(n):
    logp = logp_of(np.asarray(beams.alive)[:, :, :t])
    beams, _ = beam._beam_step(t, jnp.asarray(logp), beams, beam_size=k,
                               alpha=alpha, max_len=n, eos_id=jnp.int32(eos))
    steps.append(beams)
    if bool(beams.done.all()):
      break
  return steps


def best(beams, row=0):
  """The best finished hypothesis of a row: (tokens, score)."""
  n = int(beams.finished_len[row, 0])
  tokens = tuple(np.asarray(beams.finished[row, 0, :n]).tolist())
  return tokens, float(beams.finished_score[row, 0])


def first_full(steps, k, row=0):
  """The first step's beams at which a row holds k finished hypotheses:
  where the old rule (stop at k finished) stopped."""
  return next(s for s in steps
              if (np.asarray(s.finished_score[row]) > -np.inf).sum() >= k)


def test_a_live_beam_that_can_still_win_is_kept():
  k, n, alpha = 2, 4, 2.0
  steps = run_steps(chain_logp(CHAIN), 1, k, n, alpha)
  scores = chain_scores(CHAIN, n, alpha)
  want = max(scores, key=scores.get)
  assert want == (A, A, A, A)
  # After step 1 the row holds 2 finished, (EOS) and (a, EOS), where the
  # old rule stopped and returned (EOS); but the live (a, a) may still reach
  # log P(a a) / penalty(4) (it does), above (a, EOS), so the row goes on.
  old = first_full(steps, k)
  assert old is steps[1] and not bool(old.done[0])
  assert best(old)[0] == (EOS,)
  got, score = best(steps[-1])
  assert got == want
  np.testing.assert_allclose(score, scores[want], rtol=1e-5)
  assert score > best(old)[1] + 0.1


@pytest.mark.parametrize('alpha,stop', [(0.0, 2), (1.0, 3)])
def test_a_sequence_stops_once_its_finished_are_out_of_reach(alpha, stop):
  # After step 1 the finished are (EOS) and (a, EOS) and the best live beam
  # is (a, a): with alpha 0 nothing it grows into beats (a, EOS), so the
  # search ends there, 4 slots early. With alpha 1 its bound, log P(a a) /
  # penalty(6) = -1.15, is above (a, EOS)'s -1.34, so one more step runs.
  steps = run_steps(chain_logp(EARLY), 1, 2, 6, alpha)
  scores = chain_scores(EARLY, 6, alpha)
  assert len(steps) == stop
  assert best(steps[-1])[0] == max(scores, key=scores.get)


def test_one_beam_stays_greedy_where_its_runner_up_would_win():
  steps = run_steps(chain_logp(CHAIN), 1, 1, 4, 2.0)
  # Greedy's first token is EOS (0.5): one beam stops there, although the
  # beam search of two (above) finds a better (a, a, a, a).
  assert len(steps) == 1 and best(steps[0])[0] == (EOS,)
  assert max(chain_scores(CHAIN, 4, 2.0).values()) > best(steps[0])[1]


# Tiny models where, at alpha 3 and two beams, some row holds 2 finished
# hypotheses before its last slot while a live beam later finishes better.
SEEDS = (6, 15, 25)
PROMPTS = np.array([[1, 3], [1, 4]])
K, LENGTH, ALPHA = 2, 5, 3.0


@functools.cache
def tiny(seed):
  return jt.DecoderLM(TINY.replace(num_encoder_layers=0), nnx.Rngs(seed))


def model_logp(m, prompt):
  """logp_of for run_steps: full forwards of one prompt and the prefixes
  (in a fixed-width buffer, so nothing recompiles)."""
  def logp_of(prefixes):
    _, k, t = prefixes.shape
    ids = np.zeros((k, len(prompt) + LENGTH), np.int32)
    ids[:, :len(prompt)] = prompt
    ids[:, len(prompt):len(prompt) + t] = prefixes[0]
    logits = forward(m, ids)[:, len(prompt) + t - 1]
    return np.asarray(jax.nn.log_softmax(logits, axis=-1))[None]
  return logp_of


@pytest.mark.parametrize('seed', SEEDS)
def test_beam_search_finds_the_exhaustive_best_where_the_old_rule_stopped(
    seed):
  m = tiny(seed)
  out = beam_search(m, PROMPTS, beam_size=K, alpha=ALPHA, max_len=LENGTH,
                    eos_id=EOS)
  old_wrong = []
  for i, prompt in enumerate(PROMPTS.tolist()):
    scores = exhaustive(m, prompt, 5, LENGTH, ALPHA, EOS)
    want = max(scores, key=scores.get)
    got = tuple(np.asarray(out.tokens[i, :int(out.lengths[i])]).tolist())
    assert got == want, (i, got, want)
    np.testing.assert_allclose(out.scores[i], scores[want], atol=1e-5)
    # The same search step by step, to see where the old rule stopped.
    steps = run_steps(model_logp(m, prompt), 1, K, LENGTH, ALPHA)
    assert best(steps[-1])[0] == got
    old, _ = best(first_full(steps, K))
    old_wrong.append(scores[old] < scores[want] - 1e-6)
  assert any(old_wrong)


@pytest.mark.parametrize('kind', ['lm', 'ed'])
def test_reordering_the_new_slots_equals_reordering_whole_rows(kind):
  """Prompt slots are the same in every beam of a sequence, so moving
  only the slots after them gives the whole-row reordering."""
  b, k, t, slots = 2, 3, 3, 6
  prompt = np.array([[1, 3, 4], [1, 4, 0]])
  if kind == 'lm':
    m = jt.DecoderLM(TINY.replace(num_encoder_layers=0), nnx.Rngs(1))
    empty = functools.partial(m.init_cache, b)
  else:
    m = jt.EncoderDecoder(TINY, nnx.Rngs(1))
    src = jnp.array([[3, 4, 3, 2], [4, 4, 2, 0]])
    memory = m.encode(src, src != 0)
    empty = functools.partial(m.init_cache, memory, src != 0)
  _, cache = m.extend(jnp.asarray(prompt), empty(slots),
                      jnp.asarray(prompt != 0))
  cache = jax.tree.map(
      lambda x: x if x.ndim == 0 else jnp.repeat(x, k, axis=0), cache)
  # Two new tokens that differ between the beams.
  new = np.random.RandomState(0).randint(3, 5, (b * k, 2))
  _, cache = m.extend(jnp.asarray(new), cache)
  parent = jnp.array([[2, 2, 0], [1, 0, 0]])
  axes = beam._slot_axes(empty, slots)
  got = beam._reorder_cache(cache, parent, t, axes)
  want = beam._reorder_cache(cache, parent, 0, axes)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(g, w)
  # The reordering moved something (the test can fail).
  assert not np.array_equal(got.keys[0], cache.keys[0])
