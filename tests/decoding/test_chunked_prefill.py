"""A prompt read into the cache a chunk at a time (``prefill_chunk``)
decodes to the same tokens as the prompt read at once: rows of different
lengths, left- and right-padded, chunks that divide the prompt and chunks
that do not; and a 32,768-token prompt decodes on host devices with the
chunked prefill's bounded memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_transformer as jt
from jax_transformer.decoding.api import generate
from jax_transformer.decoding.inputs import cache_spec, prepare
from jax_transformer.decoding.loop import generate_jit
from jax_transformer.decoding.sampling import greedy
from jax_transformer.errors import UsageError
from jax_transformer.model import sharding

LM = jt.ModelConfig(vocab_size=50, d_model=32, num_heads=4, num_kv_heads=2,
                    d_ff=64, num_encoder_layers=0, num_decoder_layers=2,
                    norm_first=True, positional='rotary',
                    tie_embeddings=False, max_len=256)


@pytest.fixture(scope='module')
def lm():
  return jt.DecoderLM(LM, nnx.Rngs(0))


def _prompts(left: bool):
  """Three rows of 37, 20 and 5 real tokens, padded to 37."""
  rs = np.random.RandomState(0)
  ids = np.zeros((3, 37), np.int32)
  for row, n in enumerate((37, 20, 5)):
    tokens = rs.randint(3, LM.vocab_size, n)
    if left:
      ids[row, 37 - n:] = tokens
    else:
      ids[row, :n] = tokens
  return jnp.asarray(ids), jnp.asarray(ids != 0)


@pytest.mark.parametrize('left', [True, False])
@pytest.mark.parametrize('chunk', [8, 16, 37])
def test_chunked_prefill_decodes_the_same_tokens(lm, left, chunk):
  ids, mask = _prompts(left)
  whole = generate(lm, ids, mask, max_new_tokens=12, eos_id=None)
  chunked = generate(lm, ids, mask, max_new_tokens=12, eos_id=None,
                     prefill_chunk=chunk)
  np.testing.assert_array_equal(np.asarray(chunked.tokens),
                                np.asarray(whole.tokens))


def test_a_chunk_below_one_token_is_refused(lm):
  ids, mask = _prompts(True)
  with pytest.raises(UsageError, match='prefill_chunk'):
    generate(lm, ids, mask, max_new_tokens=2, prefill_chunk=0)


LONG = 32768


def _long_lm():
  # One head and one layer: the prefill's cost is the [T, T] scores'
  # (a minute a head on two cores), whatever the model's width.
  config = jt.ModelConfig(vocab_size=50, d_model=16, num_heads=1,
                          num_kv_heads=1, d_ff=32, num_encoder_layers=0,
                          num_decoder_layers=1, norm_first=True,
                          positional='rotary', tie_embeddings=False,
                          max_len=LONG + 64)
  return jt.DecoderLM(config, nnx.Rngs(1))


def _sequence_mesh(n: int):
  return jax.make_mesh((1, 1, n, 1), sharding.MESH_AXES,
                       devices=jax.devices()[:n],
                       axis_types=(jax.sharding.AxisType.Auto,) * 4)


def _random_prompt(length: int):
  rs = np.random.RandomState(2)
  return jnp.asarray(rs.randint(3, 50, (1, length)).astype(np.int32))


def test_a_cache_split_over_sequence_decodes_like_one_device():
  lm = _long_lm()
  ids = _random_prompt(4096)
  one = generate(lm, ids, max_new_tokens=8, eos_id=None, prefill_chunk=512)
  split = generate(lm, ids, max_new_tokens=8, eos_id=None,
                   prefill_chunk=512, mesh=_sequence_mesh(8))
  np.testing.assert_array_equal(np.asarray(split.tokens),
                                np.asarray(one.tokens))


@pytest.mark.slow
def test_a_32k_token_prompt_decodes_on_host_devices():
  """Chunked, the prefill's temporaries are a few chunks' scores, not the
  prompt's [T, T]; the cache's slots split over 8 devices ('sequence')."""
  lm = _long_lm()
  ids = _random_prompt(LONG)
  inputs = prepare(lm, ids, None, None, None, pad_id=0, bos_id=1, eos_id=2)
  graphdef, state = nnx.split(lm)
  lowered = generate_jit.lower(graphdef, state, inputs, jax.random.key(0),
                               jnp.int32(-1), jnp.int32(0),
                               max_new_tokens=8, sampler=greedy, mesh=None,
                               prefill_chunk=1024)
  temporaries = lowered.compile().memory_analysis().temp_size_in_bytes
  # A chunk's scores [1, 1, 1024, slots] float32 a few times over (the
  # softmax's), where the whole prompt's [1, 1, T, T] are 4 GiB.
  chunk_scores = 1024 * (LONG + 64) * 4
  assert temporaries < 4 * chunk_scores, temporaries
  out = generate(lm, ids, max_new_tokens=8, eos_id=None, prefill_chunk=1024,
                 mesh=_sequence_mesh(8))
  tokens = np.asarray(out.tokens)
  assert tokens.shape == (1, 8) and (tokens >= 0).all() and (tokens < 50).all()


def test_the_cache_slots_are_laid_out_over_sequence():
  lm = _long_lm()
  cache = lm.init_cache(2, 64)
  spec = cache_spec(cache, _sequence_mesh(8))
  assert spec.keys[0][2] == 'sequence' and spec.valid[1] == 'sequence'
  # Slots the axis does not divide stay unconstrained.
  odd = cache_spec(lm.init_cache(2, 60), _sequence_mesh(8))
  assert odd.keys[0][2] != 'sequence'
