"""scripts/soak.py: training killed at random moments and resumed ends bit
for bit where an uninterrupted run does; its comparisons catch one bit."""

import random

import jax
import numpy as np
import pytest
import script_helpers

from jax_transformer import data


@pytest.fixture(scope='module')
def soak():
  return script_helpers.load_script('soak')


def _state(flip: bool = False):
  w = np.linspace(-1, 1, 6, dtype=np.float32)
  if flip:
    w.view(np.uint32)[2] ^= 1  # the last bit of one weight
  return {'params': {'w': w}, 'step': np.int32(4)}


def test_one_flipped_bit_or_other_data_position_is_caught(soak):
  reference = (_state(), {'position': 4})
  soak.compare_states(reference, (_state(), {'position': 4}), 'run')
  with pytest.raises(soak.SoakFailure,
                     match=r"run: \['params'\]\['w'\] differs"):
    soak.compare_states(reference, (_state(flip=True), {'position': 4}),
                        'run')
  with pytest.raises(soak.SoakFailure, match='data position differs'):
    soak.compare_states(reference, (_state(), {'position': 5}), 'run')


def test_every_logged_loss_must_repeat_exactly(soak):
  reference = [{'step': 1, 'loss': 2.0, 'step_time_s': 0.5},
               {'step': 2, 'loss': 1.5, 'eval_loss': 1.25}]
  relogged = reference[:1] + [{'step': 1, 'loss': 2.0, 'step_time_s': 0.1},
                              reference[1]]
  soak.compare_metrics(reference, relogged, 'run')  # timings may differ
  changed = relogged[:2] + [dict(reference[1], eval_loss=1.2500001)]
  with pytest.raises(soak.SoakFailure, match='eval_loss at step 2'):
    soak.compare_metrics(reference, changed, 'run')
  with pytest.raises(soak.SoakFailure, match='steps logged differ'):
    soak.compare_metrics(reference, reference[:1], 'run')
  # An evaluation cut by a stop signal passes only when a restart logs it.
  cut = [reference[0], {'step': 2, 'loss': 1.5}]
  with pytest.raises(soak.SoakFailure, match='eval_loss at step 2 is None'):
    soak.compare_metrics(reference, cut, 'run')
  soak.compare_metrics(reference, cut + [reference[1]], 'run')


def test_a_seed_fixes_every_kill(soak):
  def plans(seed):
    rng = random.Random(seed)
    return [soak.draw(rng, 15.0) for _ in range(20)]

  assert plans(0) == plans(0) != plans(1)
  assert {k.anchor for k in plans(0)} == {'launch', 'checkpoint', 'steps'}


@pytest.mark.slow
def test_killed_and_resumed_training_equals_an_uninterrupted_run(
    soak, tmp_path, monkeypatch, capsys):
  data_dir = str(tmp_path / 'tfds')
  data.prepare('shakespeare', data_dir)
  # This process keeps its 8 devices (soak.py reads checkpoints here too):
  # start JAX before the flag below, meant for the train.py it starts.
  jax.devices()
  # Two devices: sharded checkpoints, at less compile time than eight.
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=2')
  # Seed 6 plans SIGKILL mid-save, SIGKILL after 4 steps, SIGTERM by a save.
  status = soak.main(['--workdir', str(tmp_path / 'soak'), '--cycles', '3',
                      '--seed', '6', '--num_steps', '8',
                      '--data_dir', data_dir])
  captured = capsys.readouterr()
  out = captured.out
  assert status == 0, out + captured.err  # the verdict is on stderr
  assert out.count('SIG') == 3 and 'bit for bit' in out, out
  assert out.splitlines()[-1].startswith('OK: ')
