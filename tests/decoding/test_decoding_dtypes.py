"""Decoding in bfloat16 and with int8 weights (``dtype=``, ``weights=`` and
generate.py's --dtype/--int8) against float32.

A random model's next-token logits are nearly flat, so any rounding flips
its greedy choices, which says nothing about a trained one. The model here
is a tiny LM trained (once per session, 100 Adam steps) to follow a fixed
cycle through its vocabulary: its logits are peaked like a trained model's,
and every setting must then give float32's tokens exactly.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import script_helpers
from flax import nnx
from test_generate_and_beam_search import LetterTokenizer  # a..z as ids 3..28

import jax_transformer as jt
from jax_transformer import decoding
from jax_transformer.decoding import quantize

V = 16
CONFIG = jt.ModelConfig(vocab_size=V, d_model=32, num_heads=2, num_kv_heads=1,
                        d_ff=64, num_encoder_layers=0, num_decoder_layers=2,
                        norm_first=True, positional='rotary',
                        activation='swiglu', norm='rmsnorm', use_bias=False,
                        scale_embeddings=False, tie_embeddings=False,
                        dropout_rate=0.0, attention_dropout_rate=0.0,
                        max_len=32)
# The successor of token t (ids 3..15; PAD, BOS and EOS never follow).
NEXT = np.roll(np.arange(3, V), -5)
N = 16


def chains(starts, length: int) -> np.ndarray:
  """[len(starts), length] int32: each row follows the cycle from starts."""
  rows = [np.asarray(starts)]
  for _ in range(length - 1):
    rows.append(NEXT[rows[-1] - 3])
  return np.stack(rows, axis=1).astype(np.int32)


PROMPTS = chains(np.arange(3, V), 3)  # 13 prompts, one per start

# One xdist worker for the module: peaked_model() is trained once, not once
# per worker that runs one of these tests.
pytestmark = pytest.mark.xdist_group('decoding_dtypes')


@functools.cache
def peaked_model() -> jt.DecoderLM:
  model = jt.DecoderLM(CONFIG, nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  optimizer = optax.adam(1e-2)

  @jax.jit
  def step(params, opt_state, ids):
    def loss(params):
      logits = nnx.merge(graphdef, params)(ids[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(
          logits, ids[:, 1:]).mean()
    grads = jax.grad(loss)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  opt_state = optimizer.init(params)
  starts = np.random.default_rng(0).integers(3, V, (100, 32))
  for batch in starts:
    params, opt_state = step(params, opt_state, chains(batch, 12))
  return nnx.merge(graphdef, params)


def greedy_tokens(**kwargs) -> np.ndarray:
  return np.asarray(decoding.generate(peaked_model(), PROMPTS,
                                      max_new_tokens=N, eos_id=None,
                                      **kwargs).tokens)


def test_the_reference_model_is_peaked():
  """The precondition of the agreement tests below."""
  np.testing.assert_array_equal(greedy_tokens(),
                                chains(NEXT[PROMPTS[:, -1] - 3], N))
  top2 = jnp.sort(peaked_model()(jnp.asarray(PROMPTS))[:, -1], axis=-1)
  assert float((top2[:, -1] - top2[:, -2]).min()) > 2.0


@pytest.mark.parametrize('dtype,weights', [
    ('bfloat16', None), (None, 'int8'), ('bfloat16', 'int8')])
def test_greedy_tokens_equal_float32_on_a_peaked_model(dtype, weights):
  np.testing.assert_array_equal(greedy_tokens(dtype=dtype, weights=weights),
                                greedy_tokens())


def test_bfloat16_decoding_caches_in_bfloat16_with_float32_logits():
  model = quantize.for_decoding(peaked_model(), 'bfloat16')
  cache = model.init_cache(2, 8)
  logits, cache = model.extend(jnp.asarray(PROMPTS[:2]), cache)
  assert logits.dtype == jnp.float32
  assert {x.dtype for x in cache.keys + cache.values} == {
      jnp.dtype('bfloat16')}
  # generate(dtype=...) decodes exactly that copy; the model stays float32.
  np.testing.assert_array_equal(
      greedy_tokens(dtype='bfloat16'),
      decoding.generate(model, PROMPTS, max_new_tokens=N, eos_id=None).tokens)
  assert peaked_model().config.dtype == 'float32'
  assert peaked_model().head[...].dtype == jnp.float32


def test_beam_search_takes_dtype_and_weights():
  def best(**kwargs):
    return np.asarray(decoding.beam_search(
        peaked_model(), PROMPTS[:4], beam_size=2, max_len=6, eos_id=None,
        **kwargs).tokens)

  np.testing.assert_array_equal(best(dtype='bfloat16', weights='int8'),
                                best())


def test_repeated_bfloat16_calls_do_not_recompile():
  greedy_tokens(dtype='bfloat16')
  before = decoding.loop.generate_jit._cache_size()
  greedy_tokens(dtype='bfloat16')
  greedy_tokens(dtype='bfloat16', weights='int8')
  after_int8 = decoding.loop.generate_jit._cache_size()
  greedy_tokens(dtype='bfloat16', weights='int8')
  assert decoding.loop.generate_jit._cache_size() == after_int8
  assert after_int8 - before <= 1


@pytest.mark.parametrize('kwargs,fragment', [
    ({'dtype': 'float16'}, 'dtype must be None or one of'),
    ({'weights': 'int4'}, 'weights must be None or one of')])
def test_bad_dtype_or_weights_is_refused_before_compiling(kwargs, fragment):
  sizes = (decoding.loop.generate_jit._cache_size(),
           decoding.beam.beam_search_jit._cache_size())
  with pytest.raises(ValueError, match=fragment):
    greedy_tokens(**kwargs)
  with pytest.raises(ValueError, match=fragment):
    decoding.beam_search(peaked_model(), PROMPTS, **kwargs)
  assert sizes == (decoding.loop.generate_jit._cache_size(),
                   decoding.beam.beam_search_jit._cache_size())


def test_generate_script_dtype_and_int8_flags(capsys):
  script = script_helpers.load_script('generate')

  def run(*flags):
    # a, f, k = ids 3, 8, 13: the cycle's own order.
    code = script.main(['--workdir', '.', '--input', 'afk',
                        '--max_new_tokens', '8', *flags],
                       load=lambda _: (peaked_model(), LetterTokenizer(),
                                       True))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out

  want = run()
  assert want.startswith('afk') and len(want) == len('afk') + 8 + 1
  assert run('--dtype', 'bfloat16', '--int8') == want
  assert run('--dtype', 'float32') == want
  with pytest.raises(SystemExit):   # argparse: exit code 2
    run('--dtype', 'float16')
