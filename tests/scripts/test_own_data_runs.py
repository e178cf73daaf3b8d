"""Training on your own data, end to end, as docs/data.md ("Your own data")
says: from a folder outside the repository, with relative paths, on a
folder of text files and on a JSON-lines corpus with its own key, resumed
exactly after SIGTERM; and every command of that section as written."""

import gzip
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
import repo
import tensorflow_datasets as tfds
import xla_flags
import zstandard

pytestmark = pytest.mark.slow

STEPS = ('--config.log_every=1', '--config.eval_every=4',
         '--config.checkpoint_every=2', '--config.sample.enabled=False',
         '--config.data.data_dir=tfds')


def texts(n, seed=0):
  rng = np.random.default_rng(seed)
  words = 'the a fox dog runs over under quick lazy brown and then'.split()
  return [' '.join(rng.choice(words, rng.integers(30, 80))) + '.'
          for _ in range(n)]


def make_corpora(root: pathlib.Path):
  """The files the docs' commands name, under root."""
  (root / 'my_texts').mkdir()
  for i, t in enumerate(texts(12)):
    (root / 'my_texts' / f'{i:02d}.txt').write_text(t)
  (root / 'notes').mkdir()
  with gzip.open(root / 'notes' / 'a.jsonl.gz', 'wt') as f:
    for t in texts(30, 1):
      f.write(json.dumps({'body': t, 'id': 1}) + '\n')
  (root / 'notes_eval').mkdir()
  with zstandard.open(root / 'notes_eval' / 'a.jsonl.zst', 'wt') as f:
    for t in texts(4, 2):
      f.write(json.dumps({'body': t}) + '\n')
  (root / 'pairs').mkdir()
  (root / 'pairs' / 'p.tsv').write_text(''.join(
      f'the cat {i} sleeps.\tle chat {i} dort.\n' for i in range(40)))


class MyCorpus(tfds.core.GeneratorBasedBuilder):
  """'my_corpus/small:1.0.0', prepared here; train.py reads it by name
  from its files (the class lives only in this test process)."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'First.'}
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name='small')]

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features
                                 .FeaturesDict({'body': tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples()}

  def _generate_examples(self):
    for i, t in enumerate(texts(20, 3)):
      yield i, {'body': t}


def run(root, argv, env=None, check=True):
  """A documented command run from root: python and the repository's
  scripts as a user's shell finds them, a tiny preset, a few steps."""
  cmd = [sys.executable if a == 'python' else
         os.path.join(repo.ROOT, a) if a.endswith('.py') and '/' not in a
         or a.startswith('scripts/') else a for a in argv]
  cmd = [re.sub(r'^(lm_shakespeare|translate_ende)$', r'\1:tiny', a)
         for a in cmd]
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=xla_flags.cpu(8),
             **(env or {}))
  proc = subprocess.run(cmd + list(STEPS), cwd=root, env=env, text=True,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        timeout=900)
  if check:
    assert proc.returncode == 0, proc.stdout[-3000:]
  return proc


def documented_commands():
  doc = (pathlib.Path(repo.ROOT) / 'docs' / 'data.md').read_text()
  section = doc.split('## Your own data', 1)[1].split('\n## ', 1)[0]
  block = section.split('```bash\n', 1)[1].split('```', 1)[0]
  return [shlex.split(line) for line in block.splitlines() if line.strip()]


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  root = tmp_path_factory.mktemp('outside')
  assert not str(root).startswith(repo.ROOT)
  make_corpora(root)
  MyCorpus(data_dir=str(root / 'tfds'), config='small',
           file_format='array_record').download_and_prepare()
  return root


def test_every_documented_command_runs(root):
  commands = documented_commands()
  assert len(commands) == 5
  for argv in commands:
    if argv[1] == 'train.py':
      argv = [*argv, '--config.num_steps=2']
    out = run(root, argv).stdout
    held_out = not any(k in ' '.join(argv)
                       for k in ('eval_files', 'files.eval'))
    if '--config.data.name=files' in argv and held_out and (
        'train.py' in argv[1]):
      assert 'chosen by a hash of each document' in out
  for work in ('texts', 'notes', 'pairs', 'tfds'):
    rows = [json.loads(line) for line in
            (root / 'runs' / work / 'metrics.jsonl').read_text().splitlines()]
    assert rows[-1]['step'] == 2 and np.isfinite(rows[-1]['loss'])


def final_params(workdir):
  from jax_transformer.model.params import split
  from jax_transformer.workdirs.restore import load_for_inference
  model, _ = load_for_inference(str(workdir))
  return split(model)[1]


@pytest.mark.parametrize('corpus', [
    ('--config.data.train_files=my_texts/*.txt',),
    ('--config.data.train_files=notes/*.jsonl.gz',
     '--config.data.text_key=body')])
def test_sigterm_then_resume_is_exact(root, corpus):
  name = 'txt' if 'my_texts' in corpus[0] else 'jsonl'
  # The tiny model: what is under test is the files' reading and its
  # position, the same at any size.
  base = ['python', 'train.py', '--config', 'lm_shakespeare:tiny',
          '--config.data.name=files', *corpus, '--config.num_steps=4']
  run(root, [*base, '--workdir', f'straight_{name}'])
  stopped = run(root, [*base, '--workdir', f'stopped_{name}'],
                env={'JAX_TRANSFORMER_FAULT': 'SIGTERM@step:3'}, check=False)
  assert stopped.returncode == 75, stopped.stdout[-3000:]
  out = run(root, [*base, '--workdir', f'stopped_{name}']).stdout
  assert 'Resumed from step' in out
  a = final_params(root / f'straight_{name}')
  b = final_params(root / f'stopped_{name}')
  for key in a:
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_a_bad_corpus_is_one_line_and_exit_2(root):
  (root / 'bad').mkdir()
  (root / 'bad' / 'x.jsonl').write_text('{"text": "a"}\n{"text": 7}\n')
  proc = run(root, ['python', 'train.py', '--config', 'lm_shakespeare',
                    '--workdir', 'runs/bad', '--config.data.name=files',
                    '--config.data.train_files=bad/*.jsonl'], check=False)
  assert proc.returncode == 2
  last = proc.stdout.strip().splitlines()[-1]
  assert last.endswith("x.jsonl, line 2: 'text' holds a int, not a string.")
