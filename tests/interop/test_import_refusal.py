"""scripts/import_params.py leaves nothing half-written: a refusal is one
line on stderr and exit status 2 with the workdir as it was (a process of
its own, so that nothing can print after it at exit), and the same command
with the fixed flag then succeeds; a failure while writing leaves no
workdir either (it is written aside and moved into place at the end)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import repo
from hf_models import save

from jax_transformer.cli import load_config
from jax_transformer.experiment import Experiment
from jax_transformer.train import checkpoint
from jax_transformer.workdirs import importer

IMPORT = os.path.join(repo.ROOT, 'scripts', 'import_params.py')
CONFIG = 'finetune:llama_instruct'


@pytest.fixture(scope='module')
def llama(tmp_path_factory):
  """A tiny random Llama 3 (max_position_embeddings 128) saved by
  transformers, and instruction data for finetune:llama_instruct."""
  root = tmp_path_factory.mktemp('llama')
  save('llama3', str(root / 'llama_hf'))
  data = root / 'chat.jsonl'
  data.write_text(''.join(
      json.dumps({'prompt': f'Question {i}?', 'completion': f'Answer {i}.'})
      + '\n' for i in range(20)))
  return str(root / 'llama_hf'), str(data)


def import_params(*argv):
  """The script run as a user runs it: (exit code, stdout, stderr)."""
  done = subprocess.run([sys.executable, IMPORT, *map(str, argv)],
                        cwd=repo.ROOT, capture_output=True, text=True,
                        env=dict(os.environ, JAX_PLATFORMS='cpu'))
  return done.returncode, done.stdout, done.stderr


def import_params_here(capsys, *argv):
  """The script's main() in this process (seconds sooner)."""
  spec = importlib.util.spec_from_file_location('import_params_script',
                                                IMPORT)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  capsys.readouterr()
  code = script.main([str(a) for a in argv])
  return (code, *capsys.readouterr())


def test_a_refused_import_writes_nothing_and_the_fixed_command_succeeds(
    tmp_path, capsys, llama):
  folder, data = llama
  work = tmp_path / 'W'
  command = ['--from', folder, '--config', CONFIG, '--workdir', work,
             '--config.seq_len=64']
  code, out, err = import_params(*command)
  assert code == 2, err
  assert err.splitlines() == [  # and no traceback at exit
      "import_params.py: error: config.data.name='files' reads "
      'config.data.files.train: set it to a glob of your files (.txt, '
      '.jsonl, .parquet, .tsv).']
  assert out == ''
  assert os.listdir(tmp_path) == []  # nor a temporary folder beside it

  code, out, err = import_params_here(
      capsys, *command, f'--config.data.train_files={data}')
  assert code == 0, err
  assert f'Imported {folder} into {work} at step 0' in out
  assert os.listdir(tmp_path) == ['W']
  assert sorted(os.listdir(work)) == ['checkpoints', 'config.json',
                                      'data.json', 'tokenizer',
                                      'tokenizer.sha256']
  assert os.listdir(work / 'checkpoints') == ['0']


def test_a_failed_write_leaves_the_workdir_as_it_was(tmp_path, monkeypatch,
                                                     llama):
  folder, data = llama
  cfg = load_config(CONFIG)
  cfg.seq_len = 64
  cfg.data.train_files = data

  def full_disk(self, state, data_state):
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(checkpoint.Checkpointer, 'save', full_disk)
  empty = tmp_path / 'empty'
  empty.mkdir()
  for work in (tmp_path / 'new' / 'W', empty):
    with pytest.raises(OSError, match='No space left'):
      importer.import_into(folder, Experiment.of(cfg.copy_and_resolve_references()),
                           str(work))
  assert sorted(os.listdir(tmp_path)) == ['empty']
  assert os.listdir(empty) == []

  # A workdir that holds anything is refused before any work, untouched.
  (empty / 'notes.txt').write_text('mine')
  with pytest.raises(Exception, match='is not empty'):
    importer.import_into(folder, Experiment.of(cfg), str(empty))
  assert os.listdir(empty) == ['notes.txt']
