"""prepare_data.py's rough edges (issue 38): a stop signal while preparing
is one line and exit status 75, and the byte tokenizer's rate is not
compared with a "library" (UTF-8 encoding) billions of tokens a second
fast."""

import signal

import prepare_data
import pytest

from jax_transformer.runtime import exits


def args(tmp_path, path):
  return ['--config', 'lm_shakespeare:tiny', '--config.data.name=files',
          f'--config.data.train_files={path}', '--config.seq_len=8',
          f'--config.data.data_dir={tmp_path / "tfds"}', '--num_examples',
          '0', '--workers', '1']


@pytest.mark.parametrize('name', ['SIGINT', 'SIGTERM'])
def test_a_stop_signal_while_preparing_is_one_line_and_75(
    tmp_path, monkeypatch, capsys, name):
  def prepare(argv):
    del argv
    signal.raise_signal(getattr(signal, name))  # handled before it returns
    raise AssertionError('not stopped')
  monkeypatch.setattr(prepare_data, 'prepare', prepare)
  before = signal.getsignal(signal.SIGTERM)
  # Ctrl-C reaches a process in the foreground, where SIGINT is Python's
  # own; a session started in the background by a script inherits it
  # ignored (and keeps it so, as prepare_data.py does).
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    rc = prepare_data.main(args(tmp_path, tmp_path / 'a.txt'))
  finally:
    signal.signal(signal.SIGINT, previous)
  err = capsys.readouterr().err
  assert rc == exits.EXIT_INTERRUPTED == 75
  assert err.splitlines() == [
      f'prepare_data.py: {name} while preparing the data: stopped; nothing '
      'half-written is read as prepared, and what was finished is kept: '
      'rerun to go on.']
  assert signal.getsignal(signal.SIGTERM) is before


def test_the_byte_tokenizer_gets_a_truthful_rate(tmp_path, capsys):
  for i in range(3):
    (tmp_path / f'{i}.txt').write_text(f'document {i} ' * 20)
  assert prepare_data.main(args(tmp_path, tmp_path / '*.txt')) == 0
  lines = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith('tokenized:')]
  assert len(lines) == 3
  assert all('library' not in line for line in lines)
  tokens = sum(int(line.split(' tokens in ')[0].rsplit(' ', 1)[1])
               for line in lines[:2])
  assert lines[2].startswith(f'tokenized:  {tokens} tokens in ')
  assert 'of preparation' in lines[2]
