"""model.extend refuses to write past its KV cache's last slot; the decode
loops, whose last chunk steps past the end on purpose, stay within it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental import checkify

import jax_transformer as jt
from jax_transformer.decoding.beam import beam_search_jit
from jax_transformer.decoding.inputs import prepare
from jax_transformer.decoding.loop import generate_jit
from jax_transformer.decoding.sampling import greedy

LM = jt.ModelConfig(vocab_size=23, d_model=16, num_heads=2, d_ff=32,
                    num_encoder_layers=0, num_decoder_layers=1,
                    norm_first=True, positional='rotary',
                    tie_embeddings=False, max_len=64)
SLOTS = 4


@pytest.fixture(scope='module')
def lm():
  return jt.DecoderLM(LM, nnx.Rngs(0))


def ids(n):
  return jnp.arange(1, n + 1, dtype=jnp.int32)[None, :]


def test_eager_extend_past_the_last_slot_is_refused(lm):
  _, cache = lm.extend(ids(3), lm.init_cache(1, SLOTS))
  before = jax.tree.map(np.asarray, cache)
  with pytest.raises(ValueError, match='2 new tokens from slot 3 run past a '
                     'KV cache of 4 slots; make the cache with max_len >= 5'):
    lm.extend(ids(2), cache)
  # Refused before writing: the cache passed in is untouched.
  jax.tree.map(np.testing.assert_array_equal, before, cache)
  _, full = lm.extend(ids(1), cache)  # the last slot is still usable
  assert int(full.index) == SLOTS


def test_more_tokens_than_slots_are_refused_while_tracing(lm):
  graphdef, state = nnx.split(lm)

  @jax.jit
  def run(state):
    return nnx.merge(graphdef, state).extend(ids(5), lm.init_cache(1, SLOTS))

  with pytest.raises(ValueError, match='5 new tokens from any slot run past'):
    run(state)


def _extend_twice(graphdef, first, second):
  """A user's jitted function: two extends of a fresh cache."""

  @jax.jit
  def run(state):
    model = nnx.merge(graphdef, state)
    _, cache = model.extend(ids(first), model.init_cache(1, SLOTS))
    return model.extend(ids(second), cache)[1]

  return run


def test_traced_overflow_raises_under_checkify(lm):
  graphdef, state = nnx.split(lm)
  error, _ = checkify.checkify(_extend_twice(graphdef, 3, 2))(state)
  assert '2 new tokens from slot 3 run past a KV cache of 4 slots' in (
      error.get() or '')
  error, _ = checkify.checkify(_extend_twice(graphdef, 3, 1))(state)
  assert error.get() is None


def test_traced_overflow_without_checkify_is_refused_next_eager_call(lm):
  graphdef, state = nnx.split(lm)
  cache = _extend_twice(graphdef, 3, 2)(state)
  assert int(cache.index) == 5 > cache.max_len
  with pytest.raises(ValueError, match='from slot 5 run past'):
    lm.extend(ids(1), cache)


def _generate(graphdef, inputs, n):
  return lambda state: generate_jit(
      graphdef, state, inputs, jax.random.key(0), jnp.int32(-1),
      jnp.int32(0), max_new_tokens=n, sampler=greedy, mesh=None)


def _beam_search(graphdef, inputs, n):
  return lambda state: beam_search_jit(
      graphdef, state, inputs, jnp.int32(-1), jnp.int32(0), beam_size=2,
      alpha=0.6, max_len=n, mesh=None)


@pytest.mark.parametrize('loop', [_generate, _beam_search])
def test_the_decode_loops_overrun_stays_within_the_cache(lm, loop):
  # 20 new tokens (no EOS) run two 16-step chunks: the second one's last 13
  # steps are past the cache's last slot, which no step may write past.
  graphdef, state = nnx.split(lm)
  inputs = prepare(lm, np.array([[1, 5, 9]]), None, None, None,
                   pad_id=0, bos_id=1, eos_id=None)
  run = loop(graphdef, inputs, 20)
  error, checked = checkify.checkify(run)(state)
  assert error.get() is None
  np.testing.assert_array_equal(checked.tokens, run(state).tokens)
  assert checked.tokens.shape == (1, 20)
