"""Each kind of data source owns its options (issue 51, item 3): its own
fields of config.data and which of them are paths; what a mixture's part
may set and what a workdir's config.json stores absolute follow from them."""

import dataclasses
import importlib.util
import os

import hf_fixtures
import pytest

from jax_transformer import data
from jax_transformer.data import sources
from jax_transformer.errors import UsageError
from jax_transformer.experiment import DataConfig, data_options, paths


def test_every_kind_names_its_options_and_they_are_listed_in_its_order():
  assert [cls.options for cls in sources.KINDS.values()] == list(
      data_options.KINDS)
  for kind, cls in sources.KINDS.items():
    assert cls.options.kind == kind


def test_every_field_of_config_data_has_an_owner():
  owned = {f for o in (data_options.RUN, data_options.DATASET)
           + data_options.KINDS for f in o.fields}
  assert {f.name for f in dataclasses.fields(DataConfig)} == owned


def test_a_path_must_be_a_field_of_its_kind():
  with pytest.raises(ValueError, match=r"new: paths \['x'\] are not among"):
    data_options.Options('new', ('y',), {'x': data_options.GLOBS})


def test_paths_of_the_run_and_of_each_part_are_made_absolute(
    tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'saved').mkdir()
  d = paths.absolute_data(DataConfig.of({
      'name': 'files', 'train_files': 'a/*.txt, b/*.txt',
      'data_dir': 'tfds', 'hf_path': 'saved', 'tokenizer_path': 'org/name',
      'mixture': ({'name': 'huggingface', 'hf_path': 'saved'},
                  {'name': 'files', 'eval_files': 'c/*.txt'})}))
  assert d.train_files == f'{tmp_path}/a/*.txt,{tmp_path}/b/*.txt'
  assert d.data_dir == str(tmp_path / 'tfds')  # made later: absolute now
  assert d.hf_path == str(tmp_path / 'saved')
  assert d.tokenizer_path == 'org/name'  # no such folder: a model id
  assert d.mixture[0]['hf_path'] == str(tmp_path / 'saved')
  assert d.mixture[1]['eval_files'] == f'{tmp_path}/c/*.txt'


def test_a_part_may_set_every_kinds_own_fields_and_no_run_field():
  for options in data_options.KINDS:
    if options is not data_options.MIXTURE:
      assert set(options.fields) <= set(sources.SOURCE_FIELDS)
  cfg = {'name': 'shakespeare', 'mixture': (
      {'name': 'shakespeare', 'label': 'a'},
      {'name': 'shakespeare', 'tokenizer_path': 'x.model'})}
  with pytest.raises(UsageError, match=r"mixture\[1\] has no field "
                     r"'tokenizer_path'; a source sets name, weight, label"):
    data.source_for(cfg).check()


@pytest.mark.skipif(importlib.util.find_spec('datasets') is None,
                    reason='the Hugging Face datasets library is not installed')
def test_a_hugging_face_folder_is_a_part_of_a_mixture(tmp_path):
  docs = [f'Record {i}: a brown fox over the dog.' for i in range(12)]
  folder = hf_fixtures.save_to_disk(tmp_path / 'saved', {
      'train': {'text': docs[:10]}, 'validation': {'text': docs[10:]}})
  cfg = {'name': 'shakespeare', 'data_dir': str(tmp_path / 'tfds'),
         'mixture': ({'name': 'shakespeare', 'weight': 3},
                     {'name': 'huggingface', 'hf_path': folder,
                      'label': 'records'})}
  prepared = data.prepare_for(cfg, seq_len=16)
  part = data.source_for(cfg).parts[1]
  assert part.data.hf_path == folder and part.weight == 1.0
  store = sources.source_for(part.data).store('train', prepared.tokenizer)
  assert os.path.isdir(store.directory)
  it = data.make_iterator(cfg, 'train', prepared.tokenizer, batch_size=4,
                          seq_len=16, seed=0, process_index=0,
                          process_count=1)
  try:
    assert next(it)['inputs'].shape == (4, 16)
  finally:
    it.close()
