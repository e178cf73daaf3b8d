"""Where the time goes: the clock's parts, every metrics row's timings, the
last row's goodput, summaries across starts, and profiler traces planned
and on demand."""

import glob
import os

import pytest

from jax_transformer.cli import load_config
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.train import goodput, metrics, profiling, trainer


class FakeTime:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def test_the_clock_charges_each_second_to_one_part(monkeypatch):
  now = FakeTime()
  monkeypatch.setattr(goodput.time, 'time', now)
  clock = goodput.Clock(started=999.0)  # a second of start-up
  now.now += 2  # more start-up
  clock.switch('step')
  now.now += 3
  with clock.charged('eval'):
    now.now += 4
  now.now += 5
  assert clock.row() == {'data_wait_s': 0, 'step_s': 8, 'checkpoint_s': 0,
                         'eval_s': 4}
  assert clock.row()['step_s'] == 0  # since the last row only
  now.now += 6
  summary = clock.summary()
  assert summary['total_startup_s'] == 3 and summary['total_step_s'] == 14
  assert summary['wall_s'] == 21 and summary['goodput'] == 14 / 21
  assert 'goodput' in goodput.describe(summary)


def test_a_restart_loses_its_start_up_and_compile():
  first = {'total_startup_s': 10, 'total_compile_s': 5, 'total_step_s': 80,
           'wall_s': 100}
  second = {'total_startup_s': 6, 'total_compile_s': 4, 'total_step_s': 40,
            'wall_s': 50}
  both = goodput.across_starts([first, second])
  assert both['total_restarts_s'] == 10
  assert both['total_startup_s'] == 10 and both['total_compile_s'] == 5
  assert both['wall_s'] == 150 and both['goodput'] == pytest.approx(0.8)
  assert both['starts'] == 2


@pytest.mark.parametrize('fields,message', [
    ({'start_step': -1}, 'config.profile.start_step must be a non-negative'),
    ({'num_steps': 3}, 'set config.profile.start_step'),
])
def test_bad_profile_fields_are_refused(fields, message):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.profile.update(fields)
  with pytest.raises(UsageError, match=message):
    Experiment.of(cfg).check()


def traces(workdir):
  return sorted(glob.glob(os.path.join(
      workdir, 'tensorboard', '*', 'plugins', 'profile', '*', '*.xplane.pb')))


def test_rows_carry_their_time_and_the_last_row_the_run_s(fake_data_dir,
                                                          tmp_path):
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.data_dir = fake_data_dir
  cfg.update(num_steps=8, log_every=2, eval_every=4, checkpoint_every=4)
  cfg.sample.enabled = False
  cfg.profile.update(start_step=2, num_steps=2)
  workdir = str(tmp_path / 'run')
  # Asked for a trace of one step before it starts: taken at step 1.
  os.makedirs(workdir)
  with open(os.path.join(workdir, profiling.DEMAND_FILE), 'w') as f:
    f.write('1')
  trainer.train_and_evaluate(cfg, workdir)
  rows = metrics.read_jsonl(workdir)
  for row in rows:
    for key in ('data_wait_s', 'step_s', 'checkpoint_s', 'eval_s'):
      assert row[key] >= 0, (key, row)
  assert rows[4]['eval_s'] > 0 and rows[2]['checkpoint_s'] > 0
  last = rows[-1]
  assert last['step'] == 8 and last['loss'] == rows[-2]['loss']
  parts = sum(last[f'total_{p}_s'] for p in goodput.PARTS)
  assert parts == pytest.approx(last['wall_s'], rel=0.02)
  # Step time over wall time, from the two as the row gives them: each
  # rounded to the microsecond, which moves the ratio by under 1e-6 / wall.
  assert last['total_step_s'] > 0
  assert last['goodput'] == pytest.approx(
      last['total_step_s'] / last['wall_s'], rel=0,
      abs=1e-6 / last['wall_s'])
  assert metrics.read_history(workdir)[-1] == last  # the row, once
  # Two traces (on demand at step 1, planned at 2-3); the request is gone.
  assert [t.split(os.sep)[-5] for t in traces(workdir)] == ['steps_1-1',
                                                             'steps_2-3']
  assert not os.path.exists(os.path.join(workdir, profiling.DEMAND_FILE))
