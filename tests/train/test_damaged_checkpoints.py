"""A committed checkpoint damaged afterwards (a disk error, a partial copy,
an object store that lost a part) is moved aside with one line, and the run
goes on from the newest readable step to its last, equal to a run that
never stopped.

The workdir: lm_shakespeare:tiny trained 8 steps, a checkpoint every 2,
5 kept; it resumes to step 10.
"""

import os
import shutil

import jax
import numpy as np
import pytest
from checkpoint_damage import DAMAGES, truncate

from jax_transformer.cli import load_config
from jax_transformer.model.params import split
from jax_transformer.train import trainer
from jax_transformer.workdirs import restore

# One xdist worker for the module: the runs fixture (two trainings) is
# built once, not once per worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group('damaged_checkpoints')]


def _config(data_dir, num_steps, keep=5):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.data_dir = data_dir
  cfg.sample.enabled = False
  cfg.update(num_steps=num_steps, checkpoint_every=2, keep_checkpoints=keep,
             log_every=2, eval_every=10)
  return cfg


@pytest.fixture(scope='module')
def runs(tmp_path_factory, real_data_dir):
  """(a workdir trained to step 8, the final params of one trained to 10
  without stopping, the data dir)."""
  root = tmp_path_factory.mktemp('damage')
  trainer.train_and_evaluate(_config(real_data_dir, 8), str(root / 'at8'))
  trainer.train_and_evaluate(_config(real_data_dir, 10), str(root / 'whole'))
  return root / 'at8', _params(root / 'whole'), real_data_dir


def _params(workdir):
  model, _ = restore.load_for_inference(str(workdir))
  return jax.device_get(split(model)[1])


DAMAGE = list(DAMAGES.values())


@pytest.mark.parametrize('steps', [(8,), (8, 6)], ids=['latest', 'two'])
@pytest.mark.parametrize('damage', DAMAGE, ids=lambda f: f.__name__)
def test_a_damaged_step_is_moved_aside_and_the_run_goes_on(
    runs, tmp_path, capsys, damage, steps):
  at8, whole, data_dir = runs
  workdir = tmp_path / 'run'
  shutil.copytree(at8, workdir)
  for step in steps:
    damage(str(workdir / 'checkpoints' / str(step)))
  last = trainer.train_and_evaluate(_config(data_dir, 10), str(workdir))
  assert 'interrupted' not in last
  fallback = min(steps) - 2
  lines = [line for line in capsys.readouterr().err.splitlines()
           if 'could not be read' in line]
  assert len(lines) == len(steps), lines
  for step, line in zip(steps, lines):
    assert line.startswith(f'Checkpoint step {step} could not be read')
    assert f'{step}.unreadable and resumed from step {fallback}.' in line
  names = sorted(os.listdir(workdir / 'checkpoints'))
  assert names == sorted(['2', '4', '6', '8', '10'] +
                         [f'{s}.unreadable' for s in steps])
  # From the fallback on, the run is the one that never stopped.
  got = _params(workdir)
  for name in whole:
    np.testing.assert_array_equal(got[name], whole[name], err_msg=name)


def test_a_second_damage_of_the_same_step_keeps_the_first(runs, tmp_path):
  at8, whole, data_dir = runs
  workdir = tmp_path / 'run'
  shutil.copytree(at8, workdir)
  (workdir / 'checkpoints' / '8.unreadable').mkdir()
  truncate(str(workdir / 'checkpoints' / '8'))
  trainer.train_and_evaluate(_config(data_dir, 10), str(workdir))
  assert {'8.unreadable', '8.unreadable.1', '8', '10'} <= set(
      os.listdir(workdir / 'checkpoints'))


def test_an_older_damaged_step_is_never_read_and_rotates_away(
    runs, tmp_path, capfd):
  at8, whole, data_dir = runs
  workdir = tmp_path / 'run'
  shutil.copytree(at8, workdir)
  truncate(str(workdir / 'checkpoints' / '4'))
  trainer.train_and_evaluate(_config(data_dir, 10, keep=3), str(workdir))
  out = capfd.readouterr()
  # Nothing read it, so nothing (ours or Orbax's) speaks of it.
  assert 'could not be read' not in out.out + out.err
  assert 'step 4' not in out.err and 'json' not in out.err.lower(), out.err
  assert sorted(os.listdir(workdir / 'checkpoints'), key=int) == [
      '6', '8', '10']
  got = _params(workdir)
  for name in whole:
    np.testing.assert_array_equal(got[name], whole[name], err_msg=name)
