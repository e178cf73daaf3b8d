"""storage.written_whole: what a command writes into a folder appears whole
or not at all; a failure leaves the folder as it was, locally (written
aside, moved into place at the end) and in a GCS bucket (written in place,
what was added removed)."""

import os

import pytest
from etils import epath

from jax_transformer.errors import UsageError
from jax_transformer.runtime import storage


class Refused(Exception):
  pass


def write_run(root):
  (root / 'tokenizer').mkdir()
  (root / 'tokenizer' / 'vocab.json').write_text('{}')
  (root / 'config.json').write_text('{}')


def tree(folder):
  """Every path under folder, relative to it."""
  return sorted(os.path.relpath(os.path.join(top, name), folder)
                for top, dirs, files in os.walk(folder)
                for name in dirs + files)


def test_a_new_folder_appears_whole_and_a_failure_leaves_nothing(tmp_path):
  target = tmp_path / 'runs' / 'new'
  with storage.written_whole(target) as partial:
    write_run(partial)
    assert not target.exists()  # until the end
  assert tree(target) == ['config.json', 'tokenizer', 'tokenizer/vocab.json']
  assert tree(tmp_path / 'runs') == ['new'] + [
      f'new/{p}' for p in tree(target)]

  with pytest.raises(Refused):
    with storage.written_whole(tmp_path / 'made' / 'for' / 'it') as partial:
      write_run(partial)
      raise Refused()
  with pytest.raises(KeyboardInterrupt):
    with storage.written_whole(tmp_path / 'runs' / 'other') as partial:
      write_run(partial)
      raise KeyboardInterrupt()
  # Neither the target, nor its temporary folder, nor the parents made for
  # it; what was there before stays.
  assert sorted(os.listdir(tmp_path)) == ['runs']
  assert os.listdir(tmp_path / 'runs') == ['new']


def test_an_existing_folder_keeps_what_it_held_whatever_happens(tmp_path):
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(Refused):
    with storage.written_whole(empty) as partial:
      write_run(partial)
      raise Refused()
  assert os.listdir(empty) == []
  with storage.written_whole(empty) as partial:
    write_run(partial)
  assert tree(empty) == ['config.json', 'tokenizer', 'tokenizer/vocab.json']

  # An earlier export: its namesakes are replaced at the end, the rest
  # kept; a failure replaces nothing.
  held = tmp_path / 'held'
  (held / 'tokenizer').mkdir(parents=True)
  (held / 'tokenizer' / 'old.model').write_text('old')
  (held / 'config.json').write_text('old')
  (held / 'README.md').write_text('mine')
  with pytest.raises(Refused):
    with storage.written_whole(held) as partial:
      write_run(partial)
      raise Refused()
  assert tree(held) == ['README.md', 'config.json', 'tokenizer',
                        'tokenizer/old.model']
  assert (held / 'config.json').read_text() == 'old'
  with storage.written_whole(held) as partial:
    write_run(partial)
  assert tree(held) == ['README.md', 'config.json', 'tokenizer',
                        'tokenizer/old.model', 'tokenizer/vocab.json']
  assert (held / 'config.json').read_text() == '{}'


def test_names_of_a_missing_folder_and_a_file(tmp_path):
  assert storage.names(tmp_path / 'absent') is None
  (tmp_path / 'file').write_text('x')
  with pytest.raises(UsageError, match='is a file, not a folder'):
    storage.names(tmp_path / 'file')


def test_in_a_bucket_a_failure_removes_what_was_written(gcs, gcs_bucket):
  target = epath.Path(f'gs://{gcs_bucket}/run')
  with pytest.raises(Refused):
    with storage.written_whole(target) as partial:
      assert partial == target  # a rename is a copy there: in place
      write_run(partial)
      assert gcs.objects(gcs_bucket)
      raise Refused()
  assert gcs.objects(gcs_bucket) == []

  epath.Path(f'gs://{gcs_bucket}/kept/notes.txt').write_text('mine')
  with pytest.raises(Refused):
    with storage.written_whole(f'gs://{gcs_bucket}/kept') as partial:
      write_run(partial)
      raise Refused()
  assert gcs.objects(gcs_bucket) == ['kept/notes.txt']
  with storage.written_whole(target) as partial:
    write_run(partial)
  assert sorted(gcs.objects(gcs_bucket, 'run/')) == [
      'run/config.json', 'run/tokenizer/vocab.json']
