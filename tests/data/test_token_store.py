"""Token ids written once at preparation and read instead of text: the
same batches as tokenizing on the fly, a store per tokenizer, and a torn
store rebuilt, never read."""

import os

import numpy as np
import pytest

from jax_transformer import data
from jax_transformer.data import token_store

CASES = {
    'shakespeare': dict(name='shakespeare'),  # one token stream
    'ding_en_de': dict(name='ding_en_de', direction='de-en', pack=True),
}


def batches(cfg, tokenizer, source=None, n=3):
  it = data.make_iterator(cfg, 'train', tokenizer, batch_size=4, seq_len=32,
                          seed=1, source=source)
  return [next(it) for _ in range(n)]


def assert_same(got, want):
  for g, w in zip(got, want):
    assert g.keys() == w.keys()
    for key in g:
      np.testing.assert_array_equal(g[key], w[key])


@pytest.mark.parametrize('name', CASES)
def test_stored_ids_give_the_batches_text_gives(name, fake_data_dir):
  prepared = data.prepare(name, fake_data_dir)
  cfg = {**CASES[name], 'data_dir': fake_data_dir}
  store = token_store.store_dir(fake_data_dir, name, 'train',
                                prepared.tokenizer)
  assert token_store.is_whole(store)  # written by prepare
  text = data.load_source(name, 'train', fake_data_dir)
  assert_same(batches(cfg, prepared.tokenizer),
              batches(cfg, prepared.tokenizer, source=text))


def test_stored_batches_equal_text_batches_across_epochs(fake_data_dir):
  """The lazily read text path (cache_limit=0) against the store's
  chunked path, over enough batches to reshuffle a few epochs."""
  prepared = data.prepare('ding_en_de', fake_data_dir)
  cfg = {**CASES['ding_en_de'], 'data_dir': fake_data_dir}

  def many(source):
    it = data.make_iterator(cfg, 'train', prepared.tokenizer, batch_size=4,
                            seq_len=32, seed=3, cache_limit=0,
                            source=source)
    return [next(it) for _ in range(60)]

  text = data.load_source('ding_en_de', 'train', fake_data_dir)
  assert len(text) * 2 < 60 * 4 * 2  # more than two epochs of pairs
  assert_same(many(None), many(text))


def test_training_reads_ids_never_text(fake_data_dir, monkeypatch):
  prepared = data.prepare('ding_en_de', fake_data_dir)
  tokenizer = prepared.tokenizer

  def refuse(text):
    raise AssertionError('tokenized text at training time')

  monkeypatch.setattr(tokenizer, 'encode', refuse)
  cfg = {**CASES['ding_en_de'], 'data_dir': fake_data_dir}
  assert batches(cfg, tokenizer)[0]['src'].any()


def test_another_tokenizer_gets_its_own_store(fake_data_dir):
  prepared = data.prepare('shakespeare', fake_data_dir)
  other = data.SentencePieceTokenizer.train(
      ['to be or not to be that is the question'] * 50, vocab_size=300)
  mine = token_store.store_dir(fake_data_dir, 'shakespeare', 'train',
                               prepared.tokenizer)
  theirs = token_store.store_dir(fake_data_dir, 'shakespeare', 'train',
                                 other)
  assert mine != theirs and not os.path.exists(theirs)
  cfg = {'name': 'shakespeare', 'data_dir': fake_data_dir}
  batches(cfg, other, n=1)
  assert token_store.is_whole(theirs) and token_store.is_whole(mine)


def test_a_torn_store_is_rebuilt_never_read(tmp_path, fake_data_dir):
  prepared = data.prepare('ding_en_de', fake_data_dir)
  source = data.load_source('ding_en_de', 'train', fake_data_dir)
  features = ('en', 'de')
  root = str(tmp_path)
  store = token_store.open_or_build(root, 'ding_en_de', 'train',
                                    prepared.tokenizer, features,
                                    lambda: source)
  want = store[7]
  path = os.path.join(store.directory, 'de.tokens.npy')
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)
  assert not token_store.is_whole(store.directory)
  again = token_store.open_or_build(root, 'ding_en_de', 'train',
                                    prepared.tokenizer, features,
                                    lambda: source)
  assert token_store.is_whole(again.directory)
  for feature in features:
    np.testing.assert_array_equal(again[7][feature], want[feature])
  assert again[7]['de'].tolist() == prepared.tokenizer.encode(
      data.datasets.as_text(source[7]['de']))
