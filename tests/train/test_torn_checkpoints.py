"""Long runs lose nothing: torn checkpoints, side files, non-finite steps."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_transformer.cli import load_config
from jax_transformer.data.tokenizers import ByteTokenizer
from jax_transformer.experiment import Experiment
from jax_transformer.train import checkpoint, steps, trainer


def _state(step):
  return {'params': {'w': jnp.full((4, 3), float(step))},
          'opt_state': {'mu': jnp.full((4, 3), -float(step))},
          'step': jnp.int32(step), 'rng': jnp.zeros(2, jnp.uint32)}


def _save_steps(workdir, *numbers):
  saver = checkpoint.Checkpointer(str(workdir), async_save=False)
  for n in numbers:
    saver.save(_state(n), {'position': n})
  saver.close()


def _abstract():
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one),
      _state(0))


def _truncate(step_dir):
  for root, _, files in os.walk(step_dir / 'params'):
    for name in files:
      open(os.path.join(root, name), 'w').close()


def _empty(step_dir):
  for root, _, files in os.walk(step_dir):
    for name in files:
      os.remove(os.path.join(root, name))


@pytest.mark.parametrize('tear', [_truncate, _empty])
def test_resume_moves_a_torn_checkpoint_aside_and_says_so(tmp_path, capsys,
                                                          tear):
  _save_steps(tmp_path, 1, 2)
  tear(tmp_path / 'checkpoints' / '2')
  loader = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  state, data_state = loader.restore(_abstract())
  loader.close()
  assert int(state['step']) == 1 and data_state == {'position': 1}
  np.testing.assert_array_equal(state['params']['w'], 1.0)
  said = capsys.readouterr().err
  assert 'Checkpoint step 2 could not be read' in said, said
  assert '2.unreadable and resumed from step 1.' in said, said
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['1', '2.unreadable']


def test_no_readable_checkpoint_raises_the_newest_error(tmp_path):
  _save_steps(tmp_path, 1, 2)
  for n in (1, 2):
    _truncate(tmp_path / 'checkpoints' / str(n))
  loader = checkpoint.Checkpointer(str(tmp_path), async_save=False)
  with pytest.raises(Exception):
    loader.restore(_abstract())
  loader.close()
  # Nothing to fall back to: nothing is moved.
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['1', '2']


def test_side_files_are_written_whole(tmp_path):
  cfg = load_config('lm_shakespeare:tiny')
  # tokenizer/ without its fingerprint: a start killed while writing it.
  (tmp_path / 'tokenizer').mkdir()
  (tmp_path / 'tokenizer' / 'spm.model').write_bytes(b'torn')
  saved = Experiment.of(cfg)
  checkpoint.save_side_files(str(tmp_path), saved.saved_form(), saved.data,
                             ByteTokenizer())
  assert sorted(os.listdir(tmp_path)) == ['config.json', 'data.json',
                                          'tokenizer', 'tokenizer.sha256']
  assert os.listdir(tmp_path / 'tokenizer') == ['tokenizer.json']
  assert checkpoint.load_config(str(tmp_path)).seq_len == cfg.seq_len


@pytest.mark.slow
def test_a_non_finite_step_stops_training_and_is_never_saved(tmp_path,
                                                            real_data_dir,
                                                             monkeypatch):
  """Step 4's loss turns NaN: training stops naming step 4 and the last
  checkpoint (2); nothing from step 4 on is saved."""
  make = steps.make_train_step

  def poisoned(*args, **kwargs):
    step = make(*args, **kwargs)

    def run(state, batch):
      new_state, metrics = step(state, batch)
      bad = new_state['step'] >= 4
      return new_state, dict(metrics, loss=jnp.where(bad, jnp.nan,
                                                     metrics['loss']))
    return run

  monkeypatch.setattr(steps, 'make_train_step', poisoned)
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.data_dir = real_data_dir
  cfg.update(num_steps=8, checkpoint_every=2, log_every=2, eval_every=100)
  cfg.sample.enabled = False
  work = tmp_path / 'w'
  with pytest.raises(FloatingPointError,
                     match=r'^Step 4 .*the last checkpoint is step 2\)'):
    trainer.train_and_evaluate(cfg, str(work))
  assert sorted(os.listdir(work / 'checkpoints')) == ['2']
