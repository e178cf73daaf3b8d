"""Hugging Face datasets through the data door, offline: a save_to_disk
folder (data.name='huggingface', data.hf.path) and a dataset of the Hub read
from datasets' cache by TFDS's own huggingface builder
(data.name='huggingface:OWNER/NAME'); docs/data.md, "Your own data"."""

import importlib.util
import os

import hf_fixtures
import numpy as np
import pytest

from jax_transformer import data
from jax_transformer.data import hf_datasets, token_store
from jax_transformer.errors import UsageError

needs_datasets = pytest.mark.skipif(
    importlib.util.find_spec('datasets') is None,
    reason="the Hugging Face datasets library is not installed (pip install "
           "'.[hf]')")

DOCS = [f'Record {i}: a brown fox {"leaps " * (i % 5)}over the dog.'
        for i in range(30)]


def texts_of(prepared, split):
  source = data.load_source(prepared.spec, split, prepared.data_dir)
  key = prepared.spec.text_key
  return [data.datasets.as_text(source[i][key]) for i in range(len(source))]


@pytest.fixture
def offline(monkeypatch, tmp_path):
  """datasets offline with its cache under tmp_path, and the Hub
  unreachable: any call to it fails the test."""
  import datasets
  import huggingface_hub
  cache = tmp_path / 'hf_cache'
  monkeypatch.setattr(datasets.config, 'HF_HUB_OFFLINE', True)
  monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', cache)

  def no_hub(*args, **kwargs):
    raise AssertionError('the Hub was asked')
  monkeypatch.setattr(huggingface_hub, 'dataset_info', no_hub)
  monkeypatch.setattr(huggingface_hub, 'list_datasets', no_hub)
  return cache


@needs_datasets
def test_a_save_to_disk_folder_prepares_once_and_batches(tmp_path):
  folder = hf_fixtures.save_to_disk(tmp_path / 'saved', {
      'train': {'body': DOCS[:26], 'n': list(range(26))},
      'validation': {'body': DOCS[26:], 'n': list(range(4))}})
  cfg = {'name': 'huggingface', 'hf_path': folder, 'text_key': 'body',
         'data_dir': str(tmp_path / 'tfds')}
  prepared = data.prepare_for(cfg, seq_len=16)
  assert prepared.spec.name.startswith('huggingface_disk/')
  assert prepared.num_examples == {'train': 26, 'validation': 4}
  assert texts_of(prepared, 'train') == DOCS[:26]
  assert texts_of(prepared, 'validation') == DOCS[26:]
  assert set(prepared.stores) == {'train', 'validation'}
  it = data.make_iterator(cfg, 'train', prepared.tokenizer, batch_size=2,
                          seq_len=16, seed=0, process_index=0,
                          process_count=1)
  try:
    assert next(it)['inputs'].shape == (2, 16)
  finally:
    it.close()
  assert not data.prepare_for(cfg).stores  # nothing written twice
  # Another text column is another dataset.
  assert data.spec_for(dict(cfg, text_key='n')).name != prepared.spec.name


@needs_datasets
def test_one_saved_dataset_is_the_train_split_read_with_slices(tmp_path):
  import datasets
  datasets.Dataset.from_dict({'text': DOCS}).save_to_disk(
      str(tmp_path / 'one'))
  cfg = {'name': 'huggingface', 'hf_path': str(tmp_path / 'one'),
         'data_dir': str(tmp_path / 'tfds')}
  with pytest.raises(UsageError, match=r"has no split 'validation' \(it has "
                     r"'train'\); set config.data.train_split/eval_split"):
    data.prepare_for(cfg)
  prepared = data.prepare_for(dict(cfg, train_split='train[:90%]',
                                   eval_split='train[90%:]'), seq_len=8)
  assert texts_of(prepared, 'train[90%:]') == DOCS[27:]


@needs_datasets
def test_a_hub_dataset_from_the_cache_offline_through_tfds_builder(
    offline, tmp_path):
  hf_fixtures.hub_cache(offline, 'someone/tiny_corpus', {
      'train': [{'content': d, 'id': i} for i, d in enumerate(DOCS[:25])],
      'validation': [{'content': d, 'id': 0} for d in DOCS[25:]]})
  cfg = {'name': 'huggingface:someone/tiny_corpus', 'text_key': 'content',
         'data_dir': str(tmp_path / 'tfds')}
  prepared = data.prepare_for(cfg, seq_len=16)
  # TFDS's huggingface builder wrote it, under TFDS's name for the id.
  assert prepared.spec.name == 'someone__tiny_corpus'
  assert os.path.isdir(tmp_path / 'tfds' / 'someone__tiny_corpus' / '0.0.0')
  assert prepared.num_examples == {'train': 25, 'validation': 5}
  assert texts_of(prepared, 'train') == DOCS[:25]
  store = token_store.TokenStore(
      token_store.store_dir(prepared.data_dir, prepared.spec.home, 'train',
                            prepared.tokenizer), ('content',))
  np.testing.assert_array_equal(store[3]['content'],
                                prepared.tokenizer.encode(DOCS[3]))


@needs_datasets
def test_a_hub_dataset_config_and_one_not_in_the_cache(offline, tmp_path):
  hf_fixtures.hub_cache(offline, 'Salesforce/wikitext', {
      'train': [{'text': d} for d in DOCS[:20]],
      'validation': [{'text': d} for d in DOCS[20:]]},
      config='wikitext-2-raw-v1')
  cfg = {'name': 'huggingface:Salesforce/wikitext',
         'hf_config': 'wikitext-2-raw-v1', 'data_dir': str(tmp_path / 'tfds')}
  prepared = data.prepare_for(cfg, seq_len=8)
  assert prepared.spec.name == 'salesforce__wikitext/wikitext_2_raw_v1'
  assert texts_of(prepared, 'validation') == DOCS[20:]
  with pytest.raises(UsageError, match=r"^config.data.name="
                     r"'huggingface:someone/missing': someone/missing cannot "
                     r'be read, offline, and not in the datasets cache'):
    data.prepare_for({'name': 'huggingface:someone/missing',
                      'data_dir': str(tmp_path / 'tfds')})


@pytest.mark.parametrize('fields, message', [
    ({'name': 'huggingface'}, 'reads a folder written by save_to_disk, given '
     'by config.data.hf.path'),
    ({'name': 'huggingface:wikitext'}, "give the dataset's id as on the Hub, "
     "'huggingface:OWNER/NAME'"),
    ({'name': 'huggingface:a/b', 'hf_path': '.'}, 'Set one of them'),
    ({'name': 'huggingface', 'hf_path': '.'}, 'not a folder written by '
     "datasets' save_to_disk"),
])
def test_malformed_huggingface_fields_are_one_sentence(fields, message):
  with pytest.raises(UsageError, match=message):
    data.spec_for(fields)


@needs_datasets
def test_a_missing_text_column_names_the_folder_and_columns(tmp_path):
  folder = hf_fixtures.save_to_disk(tmp_path / 'saved', {
      'train': {'body': DOCS[:4]}, 'validation': {'body': DOCS[4:6]}})
  with pytest.raises(UsageError, match=r"\(split train\) has no column "
                     r"'text' \(it has 'body'\); set config.data.text_key"):
    data.prepare_for({'name': 'huggingface', 'hf_path': folder,
                      'data_dir': str(tmp_path / 'tfds')})


def test_without_the_datasets_library_preparing_names_the_extra(
    tmp_path, monkeypatch):
  folder = tmp_path / 'saved'
  folder.mkdir()
  (folder / 'state.json').write_text(
      '{"_data_files": [], "_fingerprint": "x"}')
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: (
      None if name == 'datasets' else real(name, *a)))
  with pytest.raises(UsageError, match=r"Hugging Face datasets library, "
                     r"which is not installed: pip install "
                     r"'jax_transformer\[hf\]'\.$"):
    data.prepare_for({'name': 'huggingface', 'hf_path': str(folder),
                      'data_dir': str(tmp_path / 'tfds')})
  assert not hf_datasets.is_prepared('huggingface_disk/x', str(tmp_path))
