"""Each kind of data source owns its options (issue 51, item 3): its own
fields of config.data (nested under it: data.files, data.hf) and which of
them are paths; what a mixture's part may set and what a workdir's
config.json stores absolute follow from them. The flat names of earlier
versions (train_files, hf_path...) are still read."""

import dataclasses
import importlib.util
import os

import hf_fixtures
import pytest

from jax_transformer import cli, data
from jax_transformer.data import sources
from jax_transformer.errors import UsageError
from jax_transformer.experiment import (
  DataConfig,
  Experiment,
  data_options,
  paths,
)


def test_every_kind_names_its_options_and_they_are_listed_in_its_order():
  assert [cls.options for cls in sources.KINDS.values()] == list(
      data_options.KINDS)
  for kind, cls in sources.KINDS.items():
    assert cls.options.kind == kind


def test_every_field_of_config_data_has_an_owner():
  owned = {f for o in (data_options.RUN, data_options.DATASET)
           + data_options.KINDS for f in o.fields} | set(data_options.FORMER)
  assert {f.name for f in dataclasses.fields(DataConfig)} == owned


def test_a_path_must_be_a_field_of_its_kind():
  with pytest.raises(ValueError, match=r"new: paths \['x'\] are not among"):
    data_options.Options('new', ('y',), {'x': data_options.GLOBS})


def test_paths_of_the_run_and_of_each_part_are_made_absolute(
    tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  (tmp_path / 'saved').mkdir()
  d = paths.absolute_data(DataConfig.of({
      'name': 'files', 'files': {'train': 'a/*.txt, b/*.txt'},
      'data_dir': 'tfds', 'hf': {'path': 'saved'},
      'tokenizer_path': 'org/name',
      'mixture': ({'name': 'huggingface', 'hf': {'path': 'saved'}},
                  {'name': 'files', 'eval_files': 'c/*.txt'})}))
  assert d.files.train == f'{tmp_path}/a/*.txt,{tmp_path}/b/*.txt'
  assert d.data_dir == str(tmp_path / 'tfds')  # made later: absolute now
  assert d.hf.path == str(tmp_path / 'saved')
  assert d.tokenizer_path == 'org/name'  # no such folder: a model id
  assert d.mixture[0]['hf'] == {'path': str(tmp_path / 'saved')}
  assert d.mixture[1]['eval_files'] == f'{tmp_path}/c/*.txt'  # former name


def test_the_former_flat_names_are_read_as_the_nested_ones():
  old = DataConfig.of({'name': 'files', 'train_files': 'a/*.txt',
                       'eval_files': 'b/*.txt', 'eval_fraction': 0.2,
                       'hf_path': 'saved', 'hf_config': 'small'})
  assert old == DataConfig.of({
      'name': 'files', 'files': {'train': 'a/*.txt', 'eval': 'b/*.txt',
                                 'eval_fraction': 0.2},
      'hf': {'path': 'saved', 'config': 'small'}})
  assert old.train_files is None and old.hf_path is None  # moved
  same = DataConfig.of({'train_files': 'a', 'files': {'train': 'a'}})
  assert same.files.train == 'a'


def test_a_former_name_replaces_its_nested_one():
  d = DataConfig.of({'files': {'train': 'b', 'eval': 'e'}})
  assert d.replace(train_files='a').files == data_options.FilesOptions(
      train='a', eval='e')
  exp = Experiment.of({'data': d})
  assert exp.replace(**{'data.hf_path': 'x'}).data.hf.path == 'x'
  # An old flag over a preset's nested value (finetune:llama_instruct).
  cfg, _, _ = cli.parse_config_flags(
      ['train.py', '--config', 'finetune:tiny',
       '--config.data.eval_fraction=0.2'])
  assert Experiment.of(cfg).data.files.eval_fraction == 0.2


@pytest.mark.parametrize('flags', [
    ['--config.data.train_files=a/*.txt', '--config.data.hf_path=saved',
     '--config.data.eval_fraction=0.2'],
    ['--config.data.files.train=a/*.txt', '--config.data.hf.path=saved',
     '--config.data.files.eval_fraction=0.2']])
def test_the_command_line_takes_either_name(flags):
  cfg, _, _ = cli.parse_config_flags(
      ['train.py', '--config', 'lm_shakespeare:tiny',
       '--config.data.name=files', *flags])
  d = Experiment.of(cfg).data
  assert d.files == data_options.FilesOptions(train='a/*.txt',
                                              eval_fraction=0.2)
  assert d.hf.path == 'saved'


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
                     {'name': 'huggingface', 'hf': {'path': folder},
                      'label': 'records'})}
  prepared = data.prepare_for(cfg, seq_len=16)
  part = data.source_for(cfg).parts[1]
  assert part.data.hf.path == folder and part.weight == 1.0
  store = sources.source_for(part.data).store('train', prepared.tokenizer)
  assert os.path.isdir(store.directory)
  it = data.make_iterator(cfg, 'train', prepared.tokenizer, batch_size=4,
                          seq_len=16, seed=0, process_index=0,
                          process_count=1)
  try:
    assert next(it)['inputs'].shape == (4, 16)
  finally:
    it.close()
