"""jax_transformer.decoding.inference: texts laid out, batched, decoded,
put back.

The CLI over it (scripts/generate.py --input_file) is tested in
test_decoding.py, batch against one text at a time for both model kinds.
"""

import numpy as np
import pytest
from test_generate_and_beam_search import LetterTokenizer, model

from jax_transformer import decoding
from jax_transformer.decoding import inference
from jax_transformer.decoding.inference import TextError

TOK = LetterTokenizer()


def test_encode_batch_lays_out_and_right_pads_as_in_training():
  ed, lm = model('ed-post'), model('lm-pre')
  np.testing.assert_array_equal(
      inference.encode_batch(['abc', 'd'], TOK, ed),
      [[3, 4, 5, 2], [6, 2, 0, 0]])
  np.testing.assert_array_equal(
      inference.encode_batch(['abc', 'd'], TOK, lm), [[1, 3, 4, 5],
                                                      [1, 6, 0, 0]])
  np.testing.assert_array_equal(
      inference.encode_batch(['abc'], TOK, lm, stream=True, width=5),
      [[3, 4, 5, 0, 0]])
  with pytest.raises(TextError, match='Text 2 is blank') as e:
    inference.encode_batch(['abc', ' '], TOK, lm)
  assert e.value.index == 1
  with pytest.raises(TextError, match='Text 1 encodes to no tokens'):
    inference.encode_batch(['12'], TOK, lm)


def test_new_token_limit_is_length_plus_50_capped_by_learned_positions():
  ed, lm = model('ed-post'), model('lm-post')  # lm-post: learned, max_len 16
  assert inference.new_token_limit(ed, 7) == 57
  assert inference.new_token_limit(ed, 7, 3) == 3
  assert inference.new_token_limit(lm, 3) == 13
  assert inference.new_token_limit(lm, 12, 4) == 4
  for length, n, fragment in ((17, None, 'more than'), (16, None, 'no room'),
                              (13, 4, 'with 4 new tokens')):
    with pytest.raises(ValueError, match=fragment):
      inference.new_token_limit(lm, length, n)


def test_plan_batches_groups_longest_first_within_size_and_fit():
  lengths = [3, 0, 5, 4, 5, 2]
  limits = [10, 0, 1, 1, 1, 10]
  fits = lambda width, n: width + n <= 13  # noqa: E731
  assert inference.plan_batches(lengths, limits, 2, fits) == [[2, 4], [3],
                                                               [0, 5]]
  assert inference.plan_batches(lengths, limits, 9, lambda *_: True) == [
      [2, 4, 3, 0, 5]]


@pytest.mark.parametrize('texts,kwargs,fragment', [
    (['ab', '7'], {}, 'Text 2 encodes to no tokens'),
    (['ab', 'a' * 15], {}, 'Text 2 is 16 tokens long'),
    (['ab'], {'batch_size': 0}, 'batch_size must be'),
    (['ab'], {'beam_size': 2, 'sampler': decoding.Sampler(0.5)},
     'does not sample'),
    (['ab'], {'sampler': decoding.Sampler(0.5)}, 'needs a key'),
])
def test_bad_texts_are_refused_before_compiling(texts, kwargs, fragment):
  sizes = (decoding.loop.generate_jit._cache_size(),
           decoding.beam.beam_search_jit._cache_size())
  with pytest.raises(ValueError, match=fragment):
    inference.decode_texts(model('lm-post'), TOK, texts, **kwargs)
  assert sizes == (decoding.loop.generate_jit._cache_size(),
                   decoding.beam.beam_search_jit._cache_size())


def test_batches_share_one_program_and_match_unpadded_rows():
  lm, texts = model('lm-pre'), ['abc', '', 'abcd', 'ab']
  before = decoding.loop.generate_jit._cache_size()
  got = inference.decode_texts(lm, TOK, texts, batch_size=2,
                               max_new_tokens=4)
  # [abcd, abc] and [ab, ab (filler)]: both padded to [2, 8].
  assert decoding.loop.generate_jit._cache_size() - before <= 1
  assert got[1] == ''
  for text, out in zip(texts, got):
    if text:
      ids = [[1, *TOK.encode(text)]]
      tokens = decoding.row_tokens(
          decoding.generate(lm, ids, max_new_tokens=4), 0)
      assert out == TOK.decode(t for t in tokens if t != 2)
  assert inference.decode_texts(lm, TOK, ['', ' ']) == ['', '']
