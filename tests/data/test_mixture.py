"""Mixtures (issue 30, item 4): sources sampled by weight, deterministically,
resumed exactly, scored per source; bad mixtures refused in one sentence."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from train_runs import finish, train

from jax_transformer import data
from jax_transformer.errors import UsageError
from jax_transformer.experiment import DataConfig
from jax_transformer.runtime import faults
from jax_transformer.train import scores


def write_texts(root, letter, n=4):
  """n documents of words spelt with one letter only."""
  folder = root / letter
  folder.mkdir(parents=True, exist_ok=True)
  for i in range(n):
    (folder / f'{i}.txt').write_text((letter * 30 + ' ') * 60)
  return str(folder / '*.txt')


@pytest.fixture(scope='module')
def two_sources(tmp_path_factory):
  """A run's data config mixing 'a' documents (weight 3) and 'b' ones
  (weight 1), prepared; and its tokenizer."""
  root = tmp_path_factory.mktemp('mixture')
  a, b = write_texts(root, 'a'), write_texts(root, 'b')
  cfg = {'name': 'files', 'train_files': a, 'data_dir': str(root / 'tfds'),
         'mixture': ({'name': 'files', 'train_files': a, 'label': 'a',
                      'weight': 3},
                     {'name': 'files', 'train_files': b, 'label': 'b'})}
  prepared = data.prepare_for(cfg, seq_len=16)
  return cfg, prepared.tokenizer


def iterator(cfg, tokenizer, workers=0):
  return data.make_iterator(cfg, 'train', tokenizer, batch_size=8,
                            seq_len=16, seed=1, process_index=0,
                            process_count=1, worker_count=workers)


def sources_of(batch, tokenizer):
  """Per row: 'a' or 'b', the letter it is spelt with."""
  a, b = tokenizer.encode('a')[0], tokenizer.encode('b')[0]
  return ['a' if (row == a).any() and not (row == b).any() else
          'b' if (row == b).any() and not (row == a).any() else '?'
          for row in batch['inputs']]


def test_rows_come_from_the_sources_in_their_weights_proportions(
    two_sources):
  cfg, tokenizer = two_sources
  first, again = iterator(cfg, tokenizer), iterator(cfg, tokenizer)
  rows = []
  for _ in range(10):
    batch = next(first)
    rows += sources_of(batch, tokenizer)
    for key, value in next(again).items():  # the same every time
      np.testing.assert_array_equal(batch[key], value)
  assert rows.count('a') == 60 and rows.count('b') == 20, rows
  assert {tuple(rows[i:i + 8]).count('b') for i in range(0, 80, 8)} == {2}


@pytest.mark.parametrize('workers', [0, pytest.param(2,
                                                     marks=pytest.mark.slow)])
def test_a_mixture_resumes_with_exactly_the_next_batch(two_sources, workers):
  cfg, tokenizer = two_sources
  it = iterator(cfg, tokenizer, workers)
  try:
    for _ in range(5):  # past the end of the 'b' documents (a new epoch)
      next(it)
    state = json.loads(json.dumps(it.get_state()))  # as a checkpoint holds
    want = [next(it) for _ in range(6)]
  finally:
    it.close()
  again = iterator(cfg, tokenizer, workers)
  try:
    again.set_state(state)
    got = [next(again) for _ in range(6)]
  finally:
    again.close()
  for g, w in zip(got, want):
    for key in w:
      np.testing.assert_array_equal(g[key], w[key])


def test_evaluation_scores_each_source_and_all_together(two_sources):
  cfg, tokenizer = two_sources
  a, b = tokenizer.encode('a')[0], tokenizer.encode('b')[0]

  def eval_step(params, batch):  # a 'loss' of 1 per 'a', 3 per 'b'
    del params
    scored = batch['segment_ids'] > 0
    nll = (jnp.sum(scored & (batch['targets'] == a))
           + 3.0 * jnp.sum(scored & (batch['targets'] == b)))
    return {'nll': nll, 'tokens': jnp.sum(scored)}

  mesh = jax.make_mesh((8, 1), ('data', 'fsdp'))
  row = scores.mixture_loss_metrics(
      eval_step, None, DataConfig.of(cfg), tokenizer, mesh, (8, 16))
  assert set(row) == {'eval_loss', 'eval_perplexity', 'eval_loss/a',
                      'eval_perplexity/a', 'eval_loss/b',
                      'eval_perplexity/b'}
  # Spaces and newlines score 0: 30 of every 31 characters are letters.
  assert row['eval_loss/a'] == pytest.approx(30 / 31, abs=0.02)
  assert row['eval_loss/b'] == pytest.approx(3 * 30 / 31, abs=0.06)
  assert row['eval_loss/a'] < row['eval_loss'] < row['eval_loss/b']


@pytest.mark.parametrize('entry,message', [
    ({'name': 'shakespeare', 'weight': 0},
     r'mixture\[1\]\.weight must be a positive number, got 0\.'),
    ({'name': 'shakespeare', 'weight': -2.5},
     r'mixture\[1\]\.weight must be a positive number, got -2\.5\.'),
    ({'name': 'shakespeare', 'weight': True},
     r'mixture\[1\]\.weight must be a positive number, got True\.'),
    ({'name': 'shakespeare', 'weight': 'lots'},
     r"weight must be a positive number, got 'lots'\."),
    ({'name': 'ding_en_de', 'direction': 'en-de'},
     r'mixes tasks: ding_en_de is translation and shakespeare '
     r'\(config.data.name\) is lm; every source must be of the run'),
    ({'name': 'shakespeare', 'wieght': 2},
     r"mixture\[1\] has no field 'wieght'"),
    ({'name': 'shakespeare'}, r"both labelled 'shakespeare'"),
    ({'weight': 1}, r'mixture\[1\] must be a dict with a dataset name'),
])
def test_bad_mixtures_are_refused_in_one_sentence(entry, message):
  cfg = {'name': 'shakespeare',
         'mixture': ({'name': 'shakespeare', 'weight': 3}, entry)}
  with pytest.raises(UsageError, match=message) as e:
    data.source_for(cfg).check()
  assert '\n' not in str(e.value)


def test_no_mixture_is_no_sources():
  assert data.source_for({'name': 'shakespeare', 'mixture': None}
                         ).parts == ()
  assert data.source_for('shakespeare').parts == ()


@pytest.mark.slow
def test_train_py_refuses_a_weight_that_is_not_positive(tmp_path):
  proc = train(tmp_path / 'w', tmp_path / 'data',
               "--config.data.mixture=[{'name': 'shakespeare', "
               "'weight': 0}]", wait=False)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 2, out[-3000:]
  assert ('train.py: error: config.data.mixture[0].weight must be a '
          'positive number, got 0.') in out
  assert not (tmp_path / 'data').exists()  # refused before preparing


def losses(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return {r['step']: r for r in map(json.loads, f)}


@pytest.mark.slow
def test_train_py_on_a_mixture_resumes_exactly_and_scores_each_source(
    tmp_path, real_data_dir):
  """Shakespeare (weight 3) and a folder of text files (weight 1): stopped
  by SIGTERM after step 2 and resumed, the run's losses are those of a run
  never stopped; each evaluation row has each source's loss."""
  data.prepare('shakespeare', real_data_dir)
  notes = write_texts(tmp_path / 'notes', 'n', n=6)
  flags = ['--config.num_steps=4', '--config.log_every=1',
           '--config.eval_every=2', '--config.checkpoint_every=2',
           '--config.eval_steps=2',
           "--config.data.mixture=[{'name': 'shakespeare', 'weight': 3}, "
           f"{{'name': 'files', 'train_files': '{notes}', 'label': 'notes', "
           "'weight': 1}]"]
  whole, stopped = tmp_path / 'whole', tmp_path / 'stopped'
  procs = [train(whole, real_data_dir, *flags, wait=False),
           train(stopped, real_data_dir, *flags, wait=False,
                 env={faults.ENV: 'SIGTERM@step:2'})]
  out_whole = finish(procs[0])
  out_stopped, _ = procs[1].communicate(timeout=600)
  assert procs[1].returncode == 75, out_stopped[-3000:]
  out = train(stopped, real_data_dir, *flags)
  assert 'Resumed from step 2' in out
  want, got = losses(whole), losses(stopped)
  for step in (1, 2, 3, 4):
    assert got[step]['loss'] == pytest.approx(want[step]['loss'], rel=1e-6)
  for step in (2, 4):
    row = want[step]
    assert {'eval_loss', 'eval_loss/shakespeare', 'eval_loss/notes'} <= set(
        row), out_whole[-2000:]
    assert row['eval_loss/notes'] != row['eval_loss/shakespeare']
