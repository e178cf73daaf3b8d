"""Standard TFDS datasets by name, through tfds.testing.mock_data (no network).

mock_data replaces ``tfds.data_source`` with random examples that have the
dataset's real features, and ``download_and_prepare`` with a no-op; it needs
no TensorFlow on the data-source path used here (``tfds.load``/tf.data would).
So these tests cover names, registration, feature keys, the direction
mapping and the whole Grain pipeline, but not the download and generation of
the real corpora, which needs the network.
"""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from jax_transformer import data
from jax_transformer.data import datasets
from jax_transformer.data.tokenizers import EOS_ID, ByteTokenizer

TRANSLATION = ['wmt14_translate/de-en', 'wmt_t2t_translate/de-en']
LM = ['lm1b', 'tiny_shakespeare']
N = 12


@pytest.mark.parametrize('name', TRANSLATION)
@pytest.mark.parametrize('direction', ['en-de', 'de-en'])
def test_translation_by_name(tmp_path, name, direction):
  tok = ByteTokenizer()
  with tfds.testing.mock_data(num_examples=N):
    source = datasets.load_source(name, 'train', str(tmp_path))
    assert len(source) == N
    examples = [source[i] for i in range(N)]
    batches = list(data.make_iterator(
        {'name': name, 'data_dir': str(tmp_path), 'direction': direction},
        'train', tok, batch_size=4, seq_len=128, shuffle=False, num_epochs=1,
        process_index=0, process_count=1, num_threads=1))
  src_key, tgt_key = direction.split('-')
  assert len(batches) == N // 4
  b = batches[0]
  assert b['src'].shape == b['tgt_out'].shape == (4, 128)
  for row in range(4):
    ex = examples[row]
    n_src = int((b['src_segment_ids'][row] > 0).sum())
    n_tgt = int((b['tgt_segment_ids'][row] > 0).sum())
    # Source side is the direction's first language, target its second.
    assert tok.decode(b['src'][row, :n_src]) == datasets.as_text(ex[src_key])
    assert tok.decode(b['tgt_out'][row, :n_tgt]) == datasets.as_text(
        ex[tgt_key])
    assert b['tgt_out'][row, n_tgt - 1] == EOS_ID
  # The mock gives the two languages different text, so a swap would show.
  assert datasets.as_text(examples[0]['en']) != datasets.as_text(
      examples[0]['de'])


@pytest.mark.parametrize('name', LM)
def test_lm_by_name(tmp_path, name):
  tok = ByteTokenizer()
  with tfds.testing.mock_data(num_examples=N):
    spec = datasets.get_spec(name)
    source = datasets.load_source(name, spec.train_split, str(tmp_path))
    texts = [datasets.as_text(source[i]['text']) for i in range(N)]
    it = data.make_iterator(
        {'name': name, 'data_dir': str(tmp_path), 'pack': True}, 'train',
        tok, batch_size=2, seq_len=64, seed=0, process_index=0,
        process_count=1, num_threads=1)
    batch = next(it)
    state = it.get_state()
    following = next(it)
    it.set_state(state)
    again = next(it)
  assert batch['inputs'].shape == (2, 64)
  np.testing.assert_array_equal(following['inputs'], again['inputs'])
  if spec.lm_mode == 'examples':
    # lm1b: sentences packed several to a row, each its own segment.
    assert batch['segment_ids'].max() >= 2
    seg = batch['segment_ids'][0]
    first = tok.decode(batch['targets'][0][seg == 1])
    assert first in texts
  else:
    # tiny_shakespeare: one stream, no padding.
    assert (batch['segment_ids'] == 1).all()
    row = tok.decode(batch['inputs'][0])
    assert row in ''.join(texts)


def test_prepare_trains_joint_vocab_on_mocked_wmt(tmp_path):
  with tfds.testing.mock_data(num_examples=200):
    prepared = data.prepare('wmt14_translate/de-en', str(tmp_path),
                            vocab_size=300)
    again = data.prepare('wmt14_translate/de-en', str(tmp_path),
                         vocab_size=300)
  assert prepared.tokenizer.kind == 'sentencepiece'
  assert prepared.tokenizer_dir.endswith('tokenizer_spm_unigram_300')
  assert again.tokenizer.model_proto == prepared.tokenizer.model_proto
  text = 'abc def'
  assert prepared.tokenizer.decode(prepared.tokenizer.encode(text)) == text
