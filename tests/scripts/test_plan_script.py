"""scripts/plan.py as a user runs it: a tiny LM planned for a v5e:2x2
slice by the TPU compiler (skipped, saying why, without it), the JSON row
of every candidate, the table, the winner as train.py flags; and bad input
in one sentence before anything compiles."""

import importlib.util
import json
import os

import pytest
import script_helpers

needs_tpu = pytest.mark.skipif(
    importlib.util.find_spec('libtpu') is None,
    reason="no TPU compiler: pip install -e '.[aot]'")
ENV = {'ALLOW_MULTIPLE_LIBTPU_LOAD': '1'}


@needs_tpu
@pytest.mark.slow
def test_plans_a_tiny_lm_for_a_tpu_slice_and_prints_the_winner(tmp_path):
  out = tmp_path / 'plan.jsonl'
  cache = tmp_path / 'cache'
  args = ['--config', 'lm_shakespeare:tiny', '--target', 'v5e-4',
          '--global_batch', '8', '--budget_s', '12', '--output', str(out),
          '--cache_dir', str(cache)]
  result = script_helpers.run_script('plan', *args, env=ENV)
  assert result.returncode == 0, result.stderr
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert len(rows) > 20
  shipped = [r for r in rows if r['shipped']]
  assert len(shipped) == 1 and shipped[0]['status'] == 'compiled'
  compiled = [r for r in rows if r['status'] == 'compiled']
  for r in compiled:
    for key in ('fits', 'per_chip_bytes', 'predicted_step_s', 'predicted_mfu',
                'compile_s', 'data', 'fsdp', 'tensor', 'remat',
                'param_dtype', 'loss_chunk_size', 'batch_size',
                'grad_accum_steps'):
      assert r[key] is not None, key
    assert r['batch_size'] * r['grad_accum_steps'] == 8
  assert any(r['status'] == 'skipped' for r in rows)
  assert 'not compiled: the budget of 12 s ran out' in result.stderr
  best = next(r for r in rows if r['rank'] == 1)
  # The fastest, or within 0.5% of it and moving no more bytes (a tie).
  fastest = min(r['predicted_step_s'] for r in compiled if r['fits'])
  assert best['predicted_step_s'] <= 1.005 * fastest
  assert all(r['ranked_by'] for r in compiled if r['fits'])
  assert result.stdout.startswith('Predicted by the step model (cost '
                                  'version 9), not measured; ties')
  command = result.stdout.strip().splitlines()[-1]
  assert command.startswith('python train.py --config lm_shakespeare:tiny')
  assert f'--config.mesh.fsdp={best["fsdp"]}' in command
  # A second plan finds the compiled candidates in the cache.
  again = script_helpers.run_script('plan', *args, env=ENV)
  assert again.returncode == 0, again.stderr
  assert 'found in the cache' in again.stderr
  assert os.listdir(cache)


@pytest.mark.parametrize('args, says', [
    (['--config', 'lm_shakespeare', '--target', 'v9-1'], 'Unknown target'),
    (['--config', 'lm_shakespeare', '--target', 'h100-8', '--slices', '2'],
     'several slices are a TPU layout'),
    (['--config', 'lm_shakespeare', '--target', 'v5e-4',
      '--tokens_per_step', '10'], 'less than one row'),
    (['--config', 'lm_shakespeare', '--target', 'v5e-4', '--global_batch',
      '8', '--tokens_per_step', '4096'], 'not both'),
    (['--config', 'lm_shakespeare'], '--target is required'),
    (['--config', 'lm_shakespeare', '--target', 'v5e-4', '--param_dtypes',
      'float16'], '--param_dtypes takes float32 and bfloat16'),
    (['--config', 'lm_shakespeare', '--target', 'v5e-4', '--remats',
      'some'], '--remats takes none, dots, full, got some.'),
    (['--config', 'lm_shakespeare', '--target', 'h100-16',
      '--network_gbps', '0'], '--network_gbps must be above 0'),
])
def test_bad_input_is_one_sentence(args, says, capsys):
  plan = script_helpers.load_script('plan')
  assert plan.main(args) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and says in lines[0], lines
