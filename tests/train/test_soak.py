"""scripts/soak.py: training killed at random moments and resumed ends bit
for bit where an uninterrupted run does; its comparisons
(jax_transformer/bench/resumed.py) catch one bit."""

import random
import signal

import jax
import numpy as np
import pytest
import script_helpers
import xla_flags

from jax_transformer import data
from jax_transformer.bench import resumed


@pytest.fixture(scope='module')
def soak():
  return script_helpers.load_script('soak')


def _state(flip: bool = False):
  w = np.linspace(-1, 1, 6, dtype=np.float32)
  if flip:
    w.view(np.uint32)[2] ^= 1  # the last bit of one weight
  return {'params': {'w': w}, 'step': np.int32(4)}


def test_one_flipped_bit_or_other_data_position_is_caught():
  reference = (_state(), {'position': 4})
  resumed.compare_states(reference, (_state(), {'position': 4}), 'run')
  with pytest.raises(resumed.SoakFailure,
                     match=r"run: \['params'\]\['w'\] differs"):
    resumed.compare_states(reference, (_state(flip=True), {'position': 4}),
                        'run')
  with pytest.raises(resumed.SoakFailure, match='data position differs'):
    resumed.compare_states(reference, (_state(), {'position': 5}), 'run')


def test_every_logged_loss_must_repeat_exactly():
  reference = [{'step': 1, 'loss': 2.0, 'step_time_s': 0.5},
               {'step': 2, 'loss': 1.5, 'eval_loss': 1.25}]
  relogged = reference[:1] + [{'step': 1, 'loss': 2.0, 'step_time_s': 0.1},
                              reference[1]]
  resumed.compare_metrics(reference, relogged, 'run')  # timings may differ
  changed = relogged[:2] + [dict(reference[1], eval_loss=1.2500001)]
  with pytest.raises(resumed.SoakFailure, match='eval_loss at step 2'):
    resumed.compare_metrics(reference, changed, 'run')
  with pytest.raises(resumed.SoakFailure, match='steps logged differ'):
    resumed.compare_metrics(reference, reference[:1], 'run')
  # An evaluation cut by a stop signal passes only when a restart logs it.
  cut = [reference[0], {'step': 2, 'loss': 1.5}]
  with pytest.raises(resumed.SoakFailure, match='eval_loss at step 2 is None'):
    resumed.compare_metrics(reference, cut, 'run')
  resumed.compare_metrics(reference, cut + [reference[1]], 'run')


def test_a_seed_fixes_every_kill(soak):
  def plans(seed):
    rng = random.Random(seed)
    return [soak.draw(rng, 15.0) for _ in range(20)]

  assert plans(0) == plans(0) != plans(1)
  assert {k.anchor for k in plans(0)} == {'launch', 'checkpoint', 'steps'}


def test_the_last_step_plan_lands_each_phase_in_an_order_that_works(soak):
  kills = soak.last_step_kills(8)
  assert {(k.signum, k.phase) for k in kills} == {
      (signum, phase) for signum in (signal.SIGTERM, signal.SIGKILL)
      for phase in ('compile', 'step', 'eval', 'save')}
  assert all(k.count in (7, 8) for k in kills)


def test_damage_never_touches_the_last_intact_step(soak, tmp_path):
  damage = soak.Damage(random.Random(0))
  for step in (2, 4):
    arrays = tmp_path / 'checkpoints' / str(step) / 'params' / 'd'
    arrays.mkdir(parents=True)
    (arrays / 'chunk').write_bytes(b'0123456789')
  (tmp_path / 'checkpoints' / '4.unreadable').mkdir()
  said = damage(str(tmp_path))
  assert said.split()[2] in ('2,', '4,'), said
  assert damage(str(tmp_path)) == ''  # one intact step left: spared


@pytest.mark.slow
def test_killed_damaged_and_resumed_training_equals_an_uninterrupted_run(
    soak, tmp_path, monkeypatch, capsys):
  data_dir = str(tmp_path / 'tfds')
  data.prepare('shakespeare', data_dir)
  # This process keeps its 8 devices (soak.py reads checkpoints here too):
  # start JAX before the flag below, meant for the train.py it starts.
  jax.devices()
  # Two devices: sharded checkpoints, at less compile time than eight.
  monkeypatch.setenv('XLA_FLAGS', xla_flags.cpu(2))
  # Every phase of the last step with both signals (stops the trainer
  # reaches itself, so the same on any machine), then two random kills
  # (seed 6: SIGKILL mid-save, SIGKILL after 4 steps), and a damaged
  # checkpoint before each restart. Batches come from two worker
  # processes, whose stream must resume exactly too.
  status = soak.main(['--workdir', str(tmp_path / 'soak'), '--cycles', '2',
                      '--seed', '6', '--num_steps', '8', '--last_step',
                      '--damage', '--data_dir', data_dir, '--',
                      '--config.data.worker_count=2'])
  captured = capsys.readouterr()
  out = captured.out
  assert status == 0, out + captured.err  # the verdict is on stderr
  for kill in soak.last_step_kills(8):
    assert str(kill) in out, (kill, out)
  assert any(f'{how} step' in out for how in soak.checkpoint_damage.DAMAGES)
  assert out.splitlines()[-1].startswith('OK: '), out
