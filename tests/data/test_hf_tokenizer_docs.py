"""The commands of docs/data.md ("Your own data": Hugging Face datasets and
your tokenizer) run as written, offline, from a folder outside the
repository: train.py on a dataset of the Hub read from datasets' cache, on
a save_to_disk folder, and with a SentencePiece .model and a BPE
tokenizer.json given by path (the workdir's tokenizer is that one)."""

import importlib.util
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

import hf_fixtures
import numpy as np
import pytest
import repo
import xla_flags

from jax_transformer.data import tokenizers as tok

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec('datasets') is None,
                       reason='the Hugging Face datasets library is not '
                              "installed (pip install '.[hf]')")]

STEPS = ('--config.num_steps=2', '--config.log_every=1',
         '--config.eval_every=2', '--config.checkpoint_every=2',
         '--config.sample.enabled=False', '--config.data.data_dir=tfds')


def texts(n, seed=0):
  rng = np.random.default_rng(seed)
  words = 'the a fox dog runs over under quick lazy brown and then'.split()
  return [' '.join(rng.choice(words, rng.integers(30, 80))) + '.'
          for _ in range(n)]


def documented_commands():
  doc = (pathlib.Path(repo.ROOT) / 'docs' / 'data.md').read_text()
  section = doc.split('## Your own data', 1)[1].split('\n## ', 1)[0]
  block = next(b for b in section.split('```bash\n')[1:]
               if 'huggingface' in b.split('```', 1)[0])
  return [shlex.split(line) for line in block.split('```', 1)[0].splitlines()
          if line.strip()]


@pytest.fixture(scope='module')
def root(tmp_path_factory):
  root = tmp_path_factory.mktemp('outside')
  assert not str(root).startswith(repo.ROOT)
  (root / 'my_texts').mkdir()
  for i, t in enumerate(texts(12)):
    (root / 'my_texts' / f'{i:02d}.txt').write_text(t)
  hf_fixtures.hub_cache(root / 'hf_cache', 'Salesforce/wikitext', {
      'train': [{'text': t} for t in texts(20, 1)],
      'validation': [{'text': t} for t in texts(4, 2)]},
      config='wikitext-2-raw-v1')
  hf_fixtures.save_to_disk(root / 'my_saved_dataset', {
      'train': {'body': texts(20, 3)}, 'validation': {'body': texts(4, 4)}})
  hf_fixtures.spm_model(root / 'my_spm.model', texts(50, 5))
  # The reserved layout's order, so that today's batching ids agree.
  hf_fixtures.bpe_tokenizer_json(root / 'my_bpe' / 'tokenizer.json',
                                 texts(50, 6), special_tokens=(
                                     '<pad>', '<s>', '</s>', '<unk>'))
  return root


def test_every_documented_command_runs_offline(root):
  commands = documented_commands()
  assert len(commands) == 4
  env = dict(os.environ, JAX_PLATFORMS='cpu', HF_HUB_OFFLINE='1',
             HF_DATASETS_CACHE=str(root / 'hf_cache'),
             XLA_FLAGS=xla_flags.cpu(8))
  for argv in commands:
    extra = {}
    while re.match(r'^[A-Z_]+=', argv[0]):
      key, value = argv.pop(0).split('=', 1)
      extra[key] = value
    cmd = [sys.executable if a == 'python' else
           os.path.join(repo.ROOT, a) if a == 'train.py' else
           f'{a}:tiny' if a == 'lm_shakespeare' else a for a in argv]
    proc = subprocess.run(cmd + list(STEPS), cwd=root, env={**env, **extra},
                          text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
  for work in ('wikitext', 'saved', 'spm', 'bpe'):
    rows = [json.loads(line) for line in
            (root / 'runs' / work / 'metrics.jsonl').read_text().splitlines()]
    assert rows[-1]['step'] == 2 and np.isfinite(rows[-1]['loss'])
  assert (root / 'tfds' / 'salesforce__wikitext' / 'wikitext_2_raw_v1'
          ).is_dir()
  # Each run trained with the tokenizer it was given.
  for work, path in (('spm', 'my_spm.model'),
                     ('bpe', 'my_bpe/tokenizer.json')):
    saved = tok.load_tokenizer(root / 'runs' / work / 'tokenizer')
    assert tok.fingerprint(saved) == tok.fingerprint(
        tok.from_path(str(root / path)))
