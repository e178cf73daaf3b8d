"""A workdir is all inference needs, and a changed corpus is a decision
(issue 38, items 2 and 3): a run of your files trained from its own
folder with relative paths is evaluated, decoded and exported from
another directory, copied, with its corpus gone; a LoRA run's base is
read from the absolute init_from its config.json stores; a resume over a
corpus with a file added is refused in one line unless
config.data.accept_changed_corpus says to go on, which restarts the data
iterator."""

import json
import os
import random
import shutil
import subprocess
import sys

import pytest
import repo
import xla_flags
from script_helpers import load_script

from jax_transformer.experiment import Experiment
from jax_transformer.train import trainer

GENERATE, EXPORT, EVALUATE = (load_script(n) for n in
                              ('generate', 'export', 'evaluate'))
FILES = ['--config.data.name=files', '--config.data.files.train=corpus/*.txt',
         '--config.data.data_dir=tfds']
# The same, by the flat name of earlier versions.
FORMER_FILES = ['--config.data.name=files',
                '--config.data.train_files=corpus/*.txt',
                '--config.data.data_dir=tfds']

# One xdist worker for the module: home (a train.py run) is built once, not
# once per worker that runs one of its tests.
pytestmark = pytest.mark.xdist_group('self_contained_workdirs')


def train(home, workdir, *flags, steps=2, files=FILES):
  """train.py on lm_shakespeare:tiny, run from ``home`` with paths relative
  to it (your files: ``files``), on one CPU device; (exit status,
  output)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=xla_flags.cpu(1))
  cmd = [sys.executable, os.path.join(repo.ROOT, 'train.py'), '--config',
         'lm_shakespeare:tiny', '--workdir', workdir, *files,
         f'--config.num_steps={steps}', '--config.sample.enabled=False',
         '--config.batch_size=4', '--config.eval_batch_size=4', *flags]
  proc = subprocess.run(cmd, cwd=home, env=env, text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        timeout=600)
  return proc.returncode, proc.stdout


def write_corpus(folder, names, seed=0):
  r = random.Random(seed)
  words = 'the cat dog sat on a mat big red sun'.split()
  os.makedirs(folder, exist_ok=True)
  for name in names:
    with open(os.path.join(folder, name), 'w') as f:
      f.write('\n'.join(' '.join(r.choice(words) for _ in range(10))
                        for _ in range(100)))


@pytest.fixture(scope='module')
def home(tmp_path_factory):
  """A folder outside the repository holding corpus/ (a, b, c.txt) and
  runs/files, trained 2 steps from it with relative paths."""
  home = tmp_path_factory.mktemp('home')
  write_corpus(home / 'corpus', ['a.txt', 'b.txt', 'c.txt'])
  status, out = train(home, 'runs/files')
  assert status == 0, out[-3000:]
  return home


def test_the_workdir_records_absolute_paths_and_its_corpus(home):
  config = json.loads((home / 'runs/files/config.json').read_text())
  assert config['data']['files']['train'] == str(home / 'corpus/*.txt')
  assert config['data']['data_dir'] == str(home / 'tfds')
  record = json.loads((home / 'runs/files/data.json').read_text())
  assert record['kind'] == 'files'
  assert record['name'].startswith('your_files/')
  assert record['data_dir'] == str(home / 'tfds')
  assert sorted(record['files']['train_files']) == [
      str(home / 'corpus' / n) for n in ('a.txt', 'b.txt', 'c.txt')]


def test_inference_from_a_copy_without_the_corpus(home, tmp_path,
                                                  monkeypatch, capsys):
  copy = tmp_path / 'copied'
  shutil.copytree(home / 'runs/files', copy)
  away = home.parent / (home.name + '-corpus-away')
  os.rename(home / 'corpus', away)
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  try:
    assert GENERATE.main(['--workdir', str(copy), '--input', 'the cat',
                          '--max_new_tokens', '4']) == 0
    assert EXPORT.main(['--workdir', str(copy), '--format', 'safetensors',
                        '--out', str(tmp_path / 'model.safetensors')]) == 0
    # The prepared data is still there: evaluate scores it.
    capsys.readouterr()
    assert EVALUATE.main(['--workdir', str(copy), '--batch_size', '8']) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result['metrics']['tokens'] > 0
    # Gone too: one sentence saying so, exit status 2.
    os.rename(home / 'tfds', home / 'tfds-away')
    try:
      assert EVALUATE.main(['--workdir', str(copy), '--batch_size', '8']) == 2
      err = capsys.readouterr().err.strip()
      assert '\n' not in err
      assert err.startswith(f'evaluate.py: error: {copy} was trained on its '
                            'files, prepared as your_files/')
      assert f'under {home / "tfds"}, which no longer holds it' in err
      assert GENERATE.main(['--workdir', str(copy), '--input', 'the cat',
                            '--max_new_tokens', '4']) == 0
    finally:
      os.rename(home / 'tfds-away', home / 'tfds')
  finally:
    os.rename(away, home / 'corpus')


@pytest.mark.slow
def test_a_workdir_of_the_former_flat_names_serves_and_resumes(
    home, tmp_path, monkeypatch, capsys):
  """A config.json of the flat names of earlier versions (data.train_files
  and the others; no data.files or data.hf) is decoded, evaluated and
  exported from elsewhere, then resumed by the command of either names."""
  work = tmp_path / 'flat'
  shutil.copytree(home / 'runs/files', work)
  config = json.loads((work / 'config.json').read_text())
  data = config['data']
  files, hf = data.pop('files'), data.pop('hf')
  data.update(train_files=files['train'], eval_files=files['eval'],
              eval_fraction=files['eval_fraction'], hf_path=hf['path'],
              hf_config=hf['config'])
  (work / 'config.json').write_text(json.dumps(config))
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  assert GENERATE.main(['--workdir', str(work), '--input', 'the cat',
                        '--max_new_tokens', '4']) == 0
  capsys.readouterr()
  assert EVALUATE.main(['--workdir', str(work), '--batch_size', '8']) == 0
  result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert result['metrics']['tokens'] > 0
  assert EXPORT.main(['--workdir', str(work), '--format', 'safetensors',
                      '--out', str(tmp_path / 'model.safetensors')]) == 0
  status, out = train(home, str(work), steps=3)
  assert status == 0 and 'Resumed from step 2' in out, out[-3000:]
  status, out = train(home, str(work), steps=4, files=FORMER_FILES)
  assert status == 0 and 'Resumed from step 3' in out, out[-3000:]


@pytest.mark.slow
def test_a_lora_workdir_decodes_from_elsewhere(home, tmp_path, monkeypatch):
  status, out = train(home, 'runs/lora', '--config.init_from=runs/files',
                      '--config.lora.rank=2')
  assert status == 0, out[-3000:]
  config = json.loads((home / 'runs/lora/config.json').read_text())
  assert config['init_from'] == str(home / 'runs/files')
  monkeypatch.chdir(tmp_path)
  assert GENERATE.main(['--workdir', str(home / 'runs/lora'), '--input',
                        'the cat', '--max_new_tokens', '4']) == 0


@pytest.mark.slow
def test_a_resume_over_an_added_file_is_a_decision(home, tmp_path):
  work = tmp_path / 'resumed'
  shutil.copytree(home / 'runs/files', work)
  write_corpus(home / 'corpus', ['d.txt'], seed=1)
  try:
    status, out = train(home, str(work), steps=4)
    assert status == 2, out[-3000:]
    assert out.strip().splitlines()[-1] == (
        f'train.py: error: The corpus of {work} changed since this run '
        'started: config.data.files.train now matches 4 files (3 when this '
        'run started; added: d.txt); pass '
        '--config.data.accept_changed_corpus=true to go on with the new '
        'corpus, which restarts the data iterator.')
    status, out = train(home, str(work),
                        '--config.data.accept_changed_corpus=true', steps=4)
    assert status == 0, out[-3000:]
    assert ('The corpus changed since this run started: '
            'config.data.files.train now matches 4 files (3 when this run '
            'started; added: d.txt); going on with it '
            '(config.data.accept_changed_corpus): the data iterator starts '
            'afresh.') in out
    assert 'Resumed from step 2' in out
    record = json.loads((work / 'data.json').read_text())
    assert len(record['files']['train_files']) == 4
    # The new corpus is the run's now: a resume without the flag goes on.
    status, out = train(home, str(work), steps=6)
    assert status == 0, out[-3000:]
    assert 'Resumed from step 4' in out and 'corpus changed' not in out
  finally:
    os.remove(home / 'corpus' / 'd.txt')


def test_an_old_workdir_with_relative_paths_still_resumes(tmp_path,
                                                          monkeypatch):
  """A config.json written before paths were stored absolute (and without
  data.json): its relative paths are the current directory's, so the same
  command from the same place is the same run."""
  monkeypatch.chdir(tmp_path)
  write_corpus(tmp_path / 'corpus', ['a.txt'])
  exp = Experiment.of({'data': {'name': 'files', 'data_dir': 'tfds',
                                'train_files': 'corpus/*.txt'}})
  (tmp_path / 'old').mkdir()
  (tmp_path / 'old' / 'config.json').write_text(json.dumps(exp.to_dict()))
  assert not trainer.check_resumable(exp, 'old').data.accept_changed_corpus
  moved = exp.replace(**{'data.train_files': 'elsewhere/*.txt'})
  with pytest.raises(Exception, match='data \\(files\\)'):
    trainer.check_resumable(moved, 'old')
