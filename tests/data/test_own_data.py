"""The data door: any TFDS dataset by name and keys, your own files
(text, JSON lines, Parquet, TSV; compressed), one preparation per run
config, and bad input refused in one sentence (docs/data.md, "Your own
data")."""

import gzip
import hashlib
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow_datasets as tfds
import zstandard

from jax_transformer import data
from jax_transformer.data import files, token_store
from jax_transformer.errors import UsageError

DOCS = [f'Document {i}: the quick brown fox {"jumps " * (i % 7)}over it.'
        for i in range(40)]


def write_jsonl(path, records, opener=open):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with opener(path, 'wt') as f:
    for r in records:
      f.write(json.dumps(r) + '\n')


def zst_open(path, mode):
  del mode
  return zstandard.open(path, 'wt')


def lm_cfg(tmp_path, **fields):
  return {'name': 'files', 'data_dir': str(tmp_path / 'tfds'), **fields}


def batches(cfg, prepared, split, **kw):
  it = data.make_iterator(cfg, split, prepared.tokenizer, batch_size=2,
                          seq_len=16, seed=0, process_index=0,
                          process_count=1, **kw)
  try:
    return [next(it) for _ in range(3)]
  finally:
    it.close()


def texts_of(prepared, split):
  source = data.load_source(prepared.spec, split, prepared.data_dir)
  key = prepared.spec.text_key
  return sorted(data.datasets.as_text(source[i][key])
                for i in range(len(source)))


def test_jsonl_with_its_own_key_holds_out_documents_by_hash(tmp_path,
                                                           capsys):
  write_jsonl(str(tmp_path / 'c' / 'a.jsonl'),
              [{'body': d, 'id': i} for i, d in enumerate(DOCS[:20])])
  write_jsonl(str(tmp_path / 'c' / 'b.jsonl'),
              [{'body': d} for d in DOCS[20:]])
  cfg = lm_cfg(tmp_path, train_files=str(tmp_path / 'c' / '*.jsonl'),
               text_key='body', eval_fraction=0.3)
  prepared = data.prepare_for(cfg, seq_len=16)
  held = [d for d in DOCS if files.document_hash({'body': d}, ['body']) < 0.3]
  assert 4 <= len(held) <= 20
  assert (f'Evaluating on {len(held)} of 40 documents of '
          'config.data.files.train, chosen by a hash of each document'
          ) in capsys.readouterr().out
  assert prepared.num_examples == {'train': 40 - len(held),
                                   'validation': len(held)}
  assert texts_of(prepared, 'validation') == sorted(held)
  assert texts_of(prepared, 'train') == sorted(set(DOCS) - set(held))
  assert set(prepared.stores) == {'train', 'validation'}
  assert prepared.stores['train'].tokens > 0
  got = batches(cfg, prepared, 'train')
  again = batches(cfg, data.prepare_for(cfg), 'train')  # reused, same
  for a, b in zip(got, again):
    np.testing.assert_array_equal(a['inputs'], b['inputs'])
  assert not data.prepare_for(cfg).stores  # nothing written twice


@pytest.mark.parametrize('kind', ['txt', 'jsonl.gz', 'jsonl.zst',
                                  'parquet'])
def test_each_file_kind_reads_the_same_documents(tmp_path, kind):
  folder = tmp_path / 'c'
  folder.mkdir()
  docs = DOCS[:6]
  if kind == 'txt':
    for i, d in enumerate(docs):
      (folder / f'{i:02d}.txt').write_text(d)
  elif kind == 'parquet':
    pq.write_table(pa.table({'text': docs, 'n': list(range(6))}),
                   folder / 'part.parquet')
  else:
    write_jsonl(str(folder / f'part.{kind}'), [{'text': d} for d in docs],
                gzip.open if kind.endswith('gz') else zst_open)
  # A folder reads every file in it of a kind files knows.
  cfg = lm_cfg(tmp_path, train_files=str(folder), eval_files=str(folder),
               lm_mode='examples')
  prepared = data.prepare_for(cfg)
  assert texts_of(prepared, 'train') == sorted(docs)
  assert prepared.num_examples == {'train': 6, 'validation': 6}
  b = batches(cfg, prepared, 'train')[0]
  assert b['inputs'].shape == (2, 16)


@pytest.mark.parametrize('kind', ['jsonl', 'tsv'])
def test_translation_pairs_from_jsonl_or_tsv(tmp_path, kind):
  pairs = [(f'hello {i}', f'hallo {i}') for i in range(10)]
  path = tmp_path / f'pairs.{kind}'
  if kind == 'tsv':
    path.write_text(''.join(f'{en}\t{de}\n' for en, de in pairs))
  else:
    write_jsonl(str(path), [{'en': en, 'de': de} for en, de in pairs])
  cfg = lm_cfg(tmp_path, train_files=str(path), direction='en-de')
  prepared = data.prepare_for(cfg)
  assert prepared.spec.task == 'translation'
  assert prepared.spec.languages == ('en', 'de')
  source = data.load_source(prepared.spec, 'validation', prepared.data_dir)
  assert len(source) == 1  # 1% of 10: the pair of lowest hash
  en, de = (data.datasets.as_text(source[0][k]) for k in ('en', 'de'))
  assert (en, de) == min(pairs, key=lambda p: files.document_hash(
      dict(zip(('en', 'de'), p)), ('en', 'de')))
  b = batches(cfg, prepared, 'train')[0]
  assert {'src', 'tgt_in', 'tgt_out'} <= set(b)


def test_a_changed_corpus_is_prepared_again(tmp_path):
  path = tmp_path / 'c.jsonl'
  write_jsonl(str(path), [{'text': d} for d in DOCS[:10]])
  cfg = lm_cfg(tmp_path, train_files=str(path))
  first = data.prepare_for(cfg)
  write_jsonl(str(path), [{'text': d} for d in DOCS[:12]])
  os.utime(path, (1, 1))  # whatever the clock's resolution
  second = data.prepare_for(cfg)
  assert first.spec.name != second.spec.name
  assert second.num_examples['train'] + second.num_examples[
      'validation'] == 12


def test_added_files_keep_the_validation_documents(tmp_path):
  """Held-out documents are chosen by their hash, not their place: a file
  added to the corpus (sorting first) leaves every validation document in
  validation, and only its own documents may join them."""
  folder = tmp_path / 'c'
  write_jsonl(str(folder / 'b.jsonl'), [{'text': d} for d in DOCS[:30]])
  cfg = lm_cfg(tmp_path, train_files=str(folder / '*.jsonl'),
               eval_fraction=0.2)
  before = data.prepare_for(cfg)
  write_jsonl(str(folder / 'a.jsonl'), [{'text': d} for d in DOCS[30:]])
  after = data.prepare_for(cfg)
  assert before.spec.name != after.spec.name
  old, new = (set(texts_of(p, 'validation')) for p in (before, after))
  assert old and old <= new
  assert new - old <= set(DOCS[30:])
  assert not set(texts_of(after, 'train')) & old


def test_the_held_out_rule_is_in_the_fingerprint():
  """A corpus prepared with the old rule (the last documents held out) has
  another fingerprint, so its folder is never read as the new rule's."""
  old = hashlib.sha256(json.dumps(['lm', ['text'], 0.01]).encode())
  old.update(b'train')
  old.update(b'eval')
  assert files.fingerprint('lm', ('text',), [], [], 0.01) != (
      old.hexdigest()[:16])


def test_relative_globs_resolve_against_the_working_directory(tmp_path,
                                                              monkeypatch):
  (tmp_path / 'texts').mkdir()
  for i in range(3):
    (tmp_path / 'texts' / f'{i}.txt').write_text(DOCS[i])
  monkeypatch.chdir(tmp_path)
  spec = data.spec_for({'name': 'files', 'train_files': 'texts/*.txt'})
  assert spec.files[0] == tuple(str(tmp_path / 'texts' / f'{i}.txt')
                                for i in range(3))


BAD = {
    'no match': (None, 'matches no file'),
    'not json': ('{"text": "a"}\n{oops\n', 'line 2: not JSON (Expecting '
                 'property name enclosed in double quotes at column 2)'),
    'no key': ('{"text": "a"}\n{"body": "b"}\n', "line 2: the record has no "
               "key 'text'"),
    'not a string': ('{"text": 3}\n', "line 1: 'text' holds a int, not a "
                     'string'),
    'empty': ('\n\n', 'holds no document with text'),
    'corrupt gzip': (b'\x1f\x8b\x08\x00garbage-garbage', 'cannot be read'),
    'not utf-8': (b'{"text": "\xff\xfe"}\n', 'line 1: cannot be read (not '
                  'UTF-8'),
    'one document': ('{"text": "a"}\n', 'too few to hold some out'),
}


@pytest.mark.parametrize('case', sorted(BAD))
def test_bad_input_is_one_sentence_naming_file_and_line(tmp_path, case):
  content, expected = BAD[case]
  name = 'c.jsonl.gz' if case == 'corrupt gzip' else 'c.jsonl'
  path = tmp_path / name
  if isinstance(content, bytes):
    path.write_bytes(content)
  elif content is not None:
    path.write_text(content)
  cfg = lm_cfg(tmp_path, train_files=str(tmp_path / '*.jsonl*'))
  with pytest.raises(UsageError) as e:
    data.prepare_for(cfg)
  message = str(e.value)
  assert expected in message and '\n' not in message
  if content is not None and case not in ('empty', 'one document'):
    assert str(path) in message
  # Nothing that a later run would read as prepared.
  root = tmp_path / 'tfds' / files.BUILDER
  assert not list(root.glob('*/*/dataset_info.json')) if root.exists() \
      else True


def test_bad_input_through_prepare_data_exits_2_in_one_line(tmp_path,
                                                            capsys):
  import prepare_data
  path = tmp_path / 'c.jsonl'
  path.write_text('{"text": "a"}\n[1, 2]\n')
  rc = prepare_data.main(['--config', 'lm_shakespeare:tiny',
                          '--config.data.name=files',
                          f'--config.data.files.train={path}',
                          f'--config.data.data_dir={tmp_path / "tfds"}'])
  err = capsys.readouterr().err.strip()
  assert rc == 2
  assert err == (f'prepare_data.py: error: {path}, line 2: not a JSON '
                 'object.')


def test_an_eval_split_too_small_for_one_window_is_refused(tmp_path):
  path = tmp_path / 'c.jsonl'
  write_jsonl(str(path), [{'text': d} for d in DOCS])
  cfg = lm_cfg(tmp_path, train_files=str(path))
  with pytest.raises(UsageError, match='too few for one window'):
    data.prepare_for(cfg, seq_len=512)


@pytest.mark.parametrize('fields,expected', [
    ({'task': 'classify'}, "config.data.task must be one of"),
    ({'lm_mode': 'windows'}, "config.data.lm_mode must be one of"),
    ({'eval_fraction': 1.5}, 'config.data.files.eval_fraction must be'),
    ({'train_files': None}, 'reads config.data.files.train'),
    ({'task': 'translation', 'direction': 'en'}, "direction='SRC-TGT'"),
])
def test_bad_data_fields_are_refused(tmp_path, fields, expected):
  path = tmp_path / 'c.jsonl'
  write_jsonl(str(path), [{'text': 'a'}])
  cfg = {**lm_cfg(tmp_path, train_files=str(path)), **fields}
  with pytest.raises(UsageError, match=expected):
    data.spec_for(cfg)


def test_files_from_a_bucket_prepare_to_a_local_data_dir(tmp_path, gcs,
                                                         gcs_bucket):
  """From a bucket of a GCS server (tests/gcs_server.py)."""
  write_jsonl(str(tmp_path / 'a.jsonl'), [{'text': d} for d in DOCS[:10]])
  gcs.write(gcs_bucket, 'corpus/a.jsonl', (tmp_path / 'a.jsonl').read_bytes())
  cfg = lm_cfg(tmp_path, train_files=f'gs://{gcs_bucket}/corpus/*.jsonl')
  prepared = data.prepare_for(cfg)
  assert prepared.spec.files[0] == (f'gs://{gcs_bucket}/corpus/a.jsonl',)
  held = min(DOCS[:10], key=lambda d: files.document_hash({'text': d},
                                                           ('text',)))
  assert texts_of(prepared, 'train') == sorted(set(DOCS[:10]) - {held})


def test_parallel_tokenizing_writes_the_serial_store(tmp_path, monkeypatch):
  """Two spawned workers write the same files as one process does."""
  path = tmp_path / 'c.jsonl'
  write_jsonl(str(path), [{'text': DOCS[i % 40] * (i % 3 + 1)}
                          for i in range(300)])
  cfg = lm_cfg(tmp_path, train_files=str(path))
  serial = data.prepare_for(cfg, workers=1)
  store = serial.stores['train']
  assert store.processes == 1
  monkeypatch.setattr(token_store, 'PARALLEL_MIN', 10)
  monkeypatch.setattr(token_store, 'BATCH', 32)
  spec = serial.spec
  other = str(tmp_path / 'other')
  built = token_store.open_or_build(
      other, spec.home, 'train', serial.tokenizer, spec.text_features,
      lambda: data.load_source(spec, 'train', serial.data_dir), workers=2)
  assert built.built.processes == 1  # a lambda cannot go to a worker
  import functools
  opener = functools.partial(data.load_source, spec, 'train',
                             serial.data_dir)
  parallel = token_store.open_or_build(
      str(tmp_path / 'third'), spec.home, 'train', serial.tokenizer,
      spec.text_features, opener, workers=2)
  assert parallel.built.processes == 2
  ref = token_store.TokenStore(token_store.store_dir(
      serial.data_dir, spec.home, 'train', serial.tokenizer), ['text'])
  for s in (built, parallel):
    np.testing.assert_array_equal(s.ids('text'), ref.ids('text'))
    np.testing.assert_array_equal(s.offsets('text'), ref.offsets('text'))


class TinyCorpusForTests(tfds.core.GeneratorBasedBuilder):
  """A TFDS dataset with configs and two text features, built locally."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First.'}
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name='small')]

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict({
            'body': tfds.features.Text(), 'en': tfds.features.Text(),
            'fr': tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples(30),
            'test': self._generate_examples(5)}

  def _generate_examples(self, n):
    for i in range(n):
      yield i, {'body': DOCS[i], 'en': f'cat {i}', 'fr': f'chat {i}'}


@pytest.fixture
def tiny_tfds(tmp_path):
  data_dir = str(tmp_path / 'tfds')
  TinyCorpusForTests(data_dir=data_dir, config='small',
                     file_format='array_record').download_and_prepare()
  return data_dir


def test_a_tfds_dataset_by_name_and_keys(tiny_tfds):
  cfg = {'name': 'tiny_corpus_for_tests/small:1.0.0', 'text_key': 'body',
         'data_dir': tiny_tfds, 'eval_split': 'train[-5:]',
         'train_split': 'train[:25]'}
  prepared = data.prepare_for(cfg, seq_len=16)
  assert prepared.spec.task == 'lm' and prepared.spec.text_key == 'body'
  assert set(prepared.stores) == {'train[:25]', 'train[-5:]'}
  assert len(data.load_source(prepared.spec, 'train[-5:]', tiny_tfds)) == 5
  b = batches(cfg, prepared, 'train[:25]')[0]
  assert b['inputs'].shape == (2, 16)
  text = prepared.tokenizer.decode(b['inputs'][0])
  assert 'Document' in text or 'fox' in text or 'over' in text


def test_a_tfds_translation_dataset_by_name_and_direction(tiny_tfds):
  cfg = {'name': 'tiny_corpus_for_tests/small', 'direction': 'fr-en',
         'data_dir': tiny_tfds, 'eval_split': 'test'}
  prepared = data.prepare_for(cfg)
  assert prepared.spec.task == 'translation'
  assert prepared.spec.languages == ('fr', 'en')
  b = batches(cfg, prepared, 'train')[0]
  src = prepared.tokenizer.decode(b['src'][0])
  assert src.startswith('chat')


def test_unknown_tfds_names_and_missing_keys_are_one_sentence(tiny_tfds):
  with pytest.raises(UsageError, match='TFDS has no such dataset'):
    data.prepare_for({'name': 'no_such_dataset_here', 'data_dir': tiny_tfds})
  with pytest.raises(UsageError, match='no feature'):
    data.prepare_for({'name': 'tiny_corpus_for_tests/small',
                      'text_key': 'title', 'data_dir': tiny_tfds})


def test_built_ins_keep_their_rows():
  assert data.spec_for('lm1b') == data.get_spec('lm1b')
  assert data.spec_for({'name': 'shakespeare', 'text_key': None}) == (
      data.get_spec('shakespeare'))
  assert data.spec_for({'name': 'lm1b', 'lm_mode': 'stream'}).lm_mode == (
      'stream')


def test_the_trainer_refuses_a_store_made_with_another_tokenizer(tmp_path):
  path = tmp_path / 'c.jsonl'
  write_jsonl(str(path), [{'text': d} for d in DOCS])
  cfg = lm_cfg(tmp_path, train_files=str(path))
  data.prepare_for(cfg)  # byte
  with pytest.raises(UsageError, match='prepared with tokenizer_byte, not '
                     'the tokenizer_spm_unigram_300'):
    data.prepare_for(dict(cfg, tokenizer='sentencepiece', vocab_size=300),
                     refuse_other_tokenizer=True)


def test_prepare_data_from_a_config_reports_its_speed(tmp_path, capsys):
  import prepare_data
  path = tmp_path / 'c.jsonl'
  write_jsonl(str(path), [{'body': d} for d in DOCS])
  rc = prepare_data.main(['--config', 'lm_shakespeare:tiny',
                          '--config.data.name=files',
                          f'--config.data.train_files={path}',
                          '--config.data.text_key=body', '--workers', '1',
                          f'--config.data.data_dir={tmp_path / "tfds"}',
                          '--num_examples', '1'])
  out = capsys.readouterr().out
  assert rc == 0
  assert 'dataset:    your_files/' in out
  lines = [line for line in out.splitlines() if line.startswith('tokenized:')]
  assert len(lines) == 3 and 'tokens/s per core' in lines[0]
  # Bytes have no library to compare with (tests/scripts/
  # test_prepare_data_edges.py); the whole preparation's rate instead.
  assert 'the tokenizer library alone' not in lines[0]
  assert 'of preparation' in lines[2]
