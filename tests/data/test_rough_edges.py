"""Issue 38's rough edges of preparing data, each a test: an empty corpus
names its files, a NUL-only text and bad JSON or UTF-8 are refused with
file, line or offset and the parser's reason, TFDS says nothing before a
refusal, a refusal leaves no folder, and an unreachable download host is
refused at once."""

import logging
import os
import socket
import time

import pytest
import tensorflow_datasets as tfds

from jax_transformer import data
from jax_transformer.data import downloads
from jax_transformer.errors import UsageError


def cfg_for(tmp_path, pattern, **fields):
  return {'name': 'files', 'data_dir': str(tmp_path / 'tfds'),
          'train_files': str(pattern), **fields}


def refusal(tmp_path, pattern, **fields) -> str:
  with pytest.raises(UsageError) as e:
    data.prepare_for(cfg_for(tmp_path, pattern, **fields))
  message = str(e.value)
  assert '\n' not in message
  return message


@pytest.mark.parametrize('name,content', [('a.txt', '\n  \n'),
                                          ('a.jsonl', '\n\n')])
def test_an_empty_corpus_names_its_files(tmp_path, name, content):
  (tmp_path / 'c').mkdir()
  path = tmp_path / 'c' / name
  path.write_text(content)
  message = refusal(tmp_path, tmp_path / 'c' / '*')
  assert 'holds no document with text' in message
  assert str(path) in message


def test_a_nul_only_text_is_refused_naming_the_file(tmp_path):
  path = tmp_path / 'a.txt'
  path.write_bytes(b'\0' * 64)
  (tmp_path / 'b.txt').write_text('some text')
  message = refusal(tmp_path, tmp_path / '*.txt')
  assert message == f'{path}: holds no text, only NUL bytes; not a text file.'


def test_invalid_json_names_file_line_and_the_parsers_reason(tmp_path):
  path = tmp_path / 'a.jsonl'
  path.write_text('{"text": "a"}\n{"text": "b",}\n')
  message = refusal(tmp_path, path)
  assert message == (f'{path}, line 2: not JSON (Expecting property name '
                     'enclosed in double quotes at column 14).')


@pytest.mark.parametrize('name,content,where', [
    ('a.txt', b'hello caf\xe9 world', ': cannot be read (not UTF-8 text: '
     'byte 0xe9 at byte offset 9).'),
    ('a.jsonl', b'{"text": "a"}\n{"text": "\xff"}\n', ', line 2: cannot be '
     'read (not UTF-8 text: byte 0xff at byte offset 24).'),
])
def test_text_that_is_not_utf8_names_its_byte_offset(tmp_path, name,
                                                    content, where):
  path = tmp_path / name
  path.write_bytes(content)
  assert refusal(tmp_path, path) == f'{path}{where}'
  offset = int(where.split('offset ')[1][:-2])
  assert content[offset] in (0xe9, 0xff)  # the byte named, where named


def test_a_refusal_is_one_line_without_tfds_chatter(tmp_path, capfd, caplog):
  import prepare_data
  caplog.set_level(logging.DEBUG)
  path = tmp_path / 'a.jsonl'
  path.write_text('{"text": "a"}\n{"body": "b"}\n')
  rc = prepare_data.main(['--config', 'lm_shakespeare:tiny',
                          '--config.data.name=files',
                          f'--config.data.train_files={path}',
                          f'--config.data.data_dir={tmp_path / "tfds"}'])
  out, err = capfd.readouterr()
  assert rc == 2
  assert out == ''
  assert err.strip().splitlines() == [
      f"prepare_data.py: error: {path}, line 2: the record has no key "
      "'text' (it has 'body'); set config.data.text_key (or direction) to "
      'its text key.']
  assert not [r for r in caplog.records if 'tensorflow_datasets' in
              r.pathname and r.levelno >= logging.INFO], caplog.text
  assert tfds.core.utils.tqdm_utils._active  # pylint: disable=protected-access


def test_a_refused_preparation_leaves_no_folder(tmp_path):
  path = tmp_path / 'a.jsonl'
  path.write_text('{"text": "a"}\n{oops\n')
  (tmp_path / 'tfds').mkdir()
  (tmp_path / 'tfds' / 'mine').mkdir()  # the user's: kept
  for _ in range(2):
    refusal(tmp_path, path)
  assert os.listdir(tmp_path / 'tfds') == ['mine']
  refusal(tmp_path, path, data_dir=str(tmp_path / 'new'))
  assert not (tmp_path / 'new').exists()


def test_a_prepared_corpus_says_only_its_own_lines(tmp_path, capfd):
  for i in range(3):
    (tmp_path / f'{i}.txt').write_text(f'document {i} ' * 20)
  data.prepare_for(cfg_for(tmp_path, tmp_path / '*.txt'))
  out, err = capfd.readouterr()
  assert out.splitlines() == [
      line for line in out.splitlines() if line.startswith('Evaluating on')]
  assert 'Generating' not in err and 'Downloading' not in out + err


def tfds_manager(tmp_path):
  return tfds.download.DownloadManager(
      download_dir=tmp_path / 'downloads')


def test_an_unreachable_download_host_is_refused_at_once(tmp_path):
  manager = downloads.DownloadManager(tfds_manager(tmp_path))
  start = time.monotonic()
  with pytest.raises(UsageError) as e:  # nothing listens on port 9 here
    manager.download('http://127.0.0.1:9/corpus.tar.gz')
  assert time.monotonic() - start < 5
  message = str(e.value)
  assert message.startswith('Cannot download http://127.0.0.1:9/corpus.tar.'
                            'gz: 127.0.0.1:9 cannot be reached from this '
                            'machine (')
  assert '\n' not in message


def test_a_cached_download_does_not_try_the_host(tmp_path, monkeypatch):
  inner = tfds_manager(tmp_path)
  url = 'http://127.0.0.1:9/corpus.txt'
  resource = tfds.download.Resource(url=url)
  path = inner._get_dl_path(resource)  # pylint: disable=protected-access
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text('cached')
  tfds.core.download.resource.write_info_file(
      url=url, path=path, dataset_name='x', original_fname='corpus.txt',
      url_info=tfds.core.download.checksums.UrlInfo(
          size=6, checksum='0' * 64, filename='corpus.txt'))
  assert downloads.is_cached(inner, url)
  assert not downloads.is_cached(inner, 'http://127.0.0.1:9/other.txt')

  def no_network(*args, **kwargs):
    raise AssertionError('tried the network')
  monkeypatch.setattr(socket, 'create_connection', no_network)
  said = []
  manager = downloads.DownloadManager(inner, announce=lambda: said.append(1))
  assert os.fspath(manager.download(url)) == os.fspath(path)
  assert said == [1]


def test_a_proxy_is_tried_in_place_of_the_host(monkeypatch):
  tried = []

  def connect(address, timeout):
    tried.append(address)
    raise OSError('refused')
  monkeypatch.setattr(socket, 'create_connection', connect)
  monkeypatch.setenv('http_proxy', 'http://proxy.example:3128')
  monkeypatch.delenv('no_proxy', raising=False)
  with pytest.raises(UsageError, match='proxy.example:3128 cannot be '):
    downloads.check_reachable('http://www.statmt.org/x.tgz')
  assert tried == [('proxy.example', 3128)]
