"""--suite local_tier's arguments and rows, on fake run summaries (no
training run: the suite itself is the benchmark's to run)."""

import json

import pytest
import script_helpers

from jax_transformer.bench import local_tier


def summary(step, checkpoint, data_wait=0.5):
  return {'step': 200, 'loss': 2.0, 'total_startup_s': 9.0,
          'total_compile_s': 5.0, 'total_data_wait_s': data_wait,
          'total_step_s': step, 'total_checkpoint_s': checkpoint,
          'total_eval_s': 1.0, 'total_other_s': 0.1, 'wall_s': 60.0,
          'goodput': step / 60.0}


def test_defaults_and_refusals():
  benchmark = script_helpers.load_script('benchmark')
  args = benchmark.parse_args(['--suite', 'local_tier'])
  assert (args.steps, args.rounds, args.local_every) == (200, 5, 10)
  args = benchmark.parse_args(['--suite', 'cpu'])
  assert (args.steps, args.rounds) == (600, 7)
  with pytest.raises(SystemExit):
    benchmark.parse_args(['--suite', 'local_tier', '--steps', '205'])


def test_rows_time_steps_data_waits_and_checkpoints_only():
  text = '\n'.join([json.dumps({'step': 50, 'step_time_s': 0.2}),
                    json.dumps(summary(39.5, 1.0)), '{"cut sho'])
  found = local_tier.summary_of(text)
  row = local_tier.round_row('with', 0, 200, found, 10)
  assert row['step_s'] == pytest.approx((39.5 + 1.0 + 0.5) / 200)
  assert row['local_saves'] == 20
  assert local_tier.round_row('without', 0, 200, found, None)[
      'local_saves'] == 0


def test_summary_is_the_median_per_round_ratio():
  rows = [local_tier.round_row(side, r, 200, summary(step, ckpt), every)
          for r, (wo, w) in enumerate([(39.5, 40.5), (39.5, 41.5),
                                       (39.5, 40.0)])
          for side, step, ckpt, every in (('without', wo, 0.0, None),
                                          ('with', w, 0.0, 10))]
  out = local_tier.summary_row(rows, 1.0, 2.0)
  assert out['rounds'] == 3 and out['local_saves'] == 20
  assert out['ratio'] == pytest.approx(41.0 / 40.0, abs=1e-4)
  assert out['overhead_percent'] == pytest.approx(2.5, abs=0.01)
  assert (out['load_average_before'], out['load_average_after']) == (1.0,
                                                                     2.0)
