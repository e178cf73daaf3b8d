"""scripts/benchmark.py and its suites, on shapes small enough for a test."""

import dataclasses
import subprocess
import sys

import flop_count
import jax
import numpy as np
import pytest
import repo
import script_helpers

from jax_transformer.bench import documented, nanogpt, pipeline, step
from jax_transformer.compile import step_model
from jax_transformer.model.config import gpt2_small, transformer_base


def tiny_cases():
  encdec = dict(name='tiny_encdec', kind='encoder_decoder', batch=2,
                src_len=8, tgt_len=8,
                config=transformer_base(vocab_size=40, d_model=16,
                                        num_heads=2, num_encoder_layers=1,
                                        num_decoder_layers=1, d_ff=32))
  lm = dict(name='tiny_lm', kind='decoder_lm', batch=2, src_len=0, tgt_len=8,
            config=gpt2_small(vocab_size=40, d_model=16, num_heads=2,
                              num_decoder_layers=1, d_ff=32, max_len=16,
                              activation='gelu'))
  scanned = dict(encdec, name='tiny_encdec_scanned', config=dataclasses.replace(
      encdec['config'], scan_layers=True))
  return [encdec, lm, scanned]


@pytest.mark.slow
@pytest.mark.parametrize('case', tiny_cases(), ids=lambda c: c['name'])
def test_cpu_suite_rows_compare_the_same_loss(case):
  rows = step.run_case(case, rounds=2)
  assert [r['step'] for r in rows] == ['train', 'forward']
  for row in rows:
    assert row['loss_rel_diff'] < 1e-5
    assert row['rounds'] == 2 and row['jax_s'] > 0 and row['torch_s'] > 0
    # The median of two rounds' ratios is their mean (not the ratio of
    # the two sides' medians, nor either round's).
    assert row['ratio'] == pytest.approx(
        (row['ratio_min'] + row['ratio_max']) / 2, rel=1e-12)
    assert row['gflop'] > 0 and row['compile_s'] > 0


def test_cpu_suite_refuses_to_time_different_computations(monkeypatch):
  case = tiny_cases()[1]
  monkeypatch.setattr(step, 'torch_eval_step', lambda ref, batch: 123.0)
  with pytest.raises(AssertionError, match='losses differ'):
    step.run_case(case, rounds=1)


def test_loss_at_equal_wall_time_takes_the_last_evaluation_reached():
  curve = [{'val_loss': 3.0, 'elapsed_s': 10.0},
           {'val_loss': 2.0, 'elapsed_s': 20.0}]
  assert nanogpt.loss_at(curve, 5.0) is None
  assert nanogpt.loss_at(curve, 15.0) == 3.0
  assert nanogpt.loss_at(curve, 25.0) == 2.0


def test_nanogpt_suite_reads_where_train_py_spent_its_time():
  from jax_transformer.train import goodput
  line = goodput.describe({'total_startup_s': 5.25, 'total_step_s': 200.0,
                           'total_eval_s': 12.5, 'wall_s': 220.0,
                           'goodput': 200 / 220})
  assert nanogpt.time_parts(line) == {'start-up': 5.2, 'steps': 200.0,
                                      'evaluation': 12.5}
  assert nanogpt.time_parts('step 100: train loss 2.1') == {}


def test_pipeline_suite_reports_supply_and_demand():
  rows = pipeline.run(seconds=0.3, worker_counts=(0,), examples=3000,
                      rounds=3)
  assert [(r['model'], r['device']) for r in rows] == [
      (m, d) for m in ('transformer_base', 'gpt2_small')
      for d in ('NVIDIA H200', 'TPU v5p')]
  for row in rows:
    assert row['supply_tokens_per_s'] > 0 and row['cores'] >= 1
    assert row['ratio'] == pytest.approx(
        row['supply_tokens_per_s'] / row['demand_tokens_per_s'])
    assert row['tokens_per_s_per_core'] == pytest.approx(
        row['supply_tokens_per_s'] / row['cores'])
  # The documented figure reads the ratio as the median of three windows,
  # with their range.
  figure, = [f for f in documented.FIGURES if f.suite == 'pipeline']
  got = documented.value({'rows': rows}, figure)
  assert got['n'] == 3 and got['median'] == rows[0]['ratio']
  assert (got['min'], got['max']) == (rows[0]['ratio_min'],
                                      rows[0]['ratio_max'])
  # The base model on an H200 at 40% MFU: about 985k target tokens/s.
  assert rows[0]['demand_tokens_per_s'] == pytest.approx(985e3, rel=0.01)


def test_plan_suite_defaults_to_every_host_size():
  """--plan_sizes's default names the sizes there are (it named one that
  had been renamed, and the suite stopped at its argument check)."""
  from jax_transformer.plan import measure
  args = script_helpers.load_script('benchmark').parse_args(
      ['--suite', 'plan'])
  assert args.plan_sizes.split(',') == list(measure.HOST_SIZES)


@pytest.mark.parametrize('args, message', [
    (['--suite', 'gpu'], 'needs a GPU or TPU'),
    (['--suite', 'nanogpt'], 'needs --nanogpt_dir'),
    (['--models', 'transformer_big'], '--models: unknown transformer_big'),
    (['--suite', 'nanogpt', '--nanogpt_dir', '/nonexistent'],
     'is not a nanoGPT clone'),
])
def test_cli_refuses_what_it_cannot_run_in_one_sentence(args, message):
  out = subprocess.run([sys.executable, 'scripts/benchmark.py', *args],
                       cwd=repo.ROOT, capture_output=True, text=True)
  assert out.returncode != 0
  assert message in out.stderr
  assert 'Traceback' not in out.stderr


@pytest.mark.slow
def test_gpu_suite_item_measures_on_any_backend(monkeypatch):
  from jax_transformer.bench import gpu
  monkeypatch.setitem(gpu.ITEMS, 'tiny', dict(
      kind='decoder_lm', fields=dict(vocab_size=64, d_model=32, num_heads=2,
                                     num_decoder_layers=1, d_ff=64,
                                     max_len=16),
      batch=2, seq=16))
  rates, of_devices = [], step_model.Rates.of_devices

  def kept(devices):  # the rates the prediction takes, kept for the test
    rates.append(of_devices(devices))
    return rates[-1]
  monkeypatch.setattr(step_model.Rates, 'of_devices', kept)
  row = gpu.measure('tiny', steps=2, seconds=5.0)
  assert row['timed_steps'] == 2 and row['step_s'] > 0
  assert row['tokens_per_s'] == pytest.approx(2 * 16 / row['step_s'])
  assert row['mfu_vs_matmul'] == pytest.approx(
      row['model_tflops_per_s'] / row['matmul_tflops_per_s'])
  assert 'mfu' not in row  # no built-in peak for a CPU
  # The roofline's prediction beside the measurement, at the CPU host
  # rates measured once: there the parts add, and the MFU is the model's
  # FLOPs (counted from its weights' shapes) at the measured peak over the
  # predicted step.
  [host] = rates
  assert not host.overlap and host.peak_flops > 0
  flops = flop_count.lm_train_flops(
      gpt2_small(vocab_size=64, d_model=32, num_heads=2, num_decoder_layers=1,
                 d_ff=64, max_len=16), 2, 16)
  assert row['model_tflops_per_s'] * 1e12 * row['step_s'] == pytest.approx(
      flops, rel=1e-9)
  assert row['predicted_step_s'] == pytest.approx(
      sum(row['predicted_parts_s'].values()), rel=1e-12)
  assert row['predicted_mfu'] == pytest.approx(
      flops / (host.peak_flops * row['predicted_step_s']), rel=1e-9)
  assert row['measured_over_predicted'] == pytest.approx(
      row['step_s'] / row['predicted_step_s'])
  printed = script_helpers.load_script('benchmark').table([row])
  for column in ('step_s=', 'predicted_step_s=', 'mfu_vs_matmul=',
                 'predicted_mfu=', 'measured_over_predicted='):
    assert column in printed


@pytest.mark.slow
def test_gpu_suite_scaling_options_run_on_any_backend(monkeypatch):
  """The scaled items' options (auto attention, lengths, chunked loss,
  scan, remat) measure on a tiny model; every item names known fields."""
  from jax_transformer.bench import gpu
  from jax_transformer.model.config import ModelConfig
  for item in gpu.ITEMS.values():
    ModelConfig(**item['fields'])  # a misspelt option fails here
  tiny = dict(vocab_size=64, d_model=32, num_heads=2, num_decoder_layers=2,
              d_ff=64, max_len=16)
  monkeypatch.setitem(gpu.ITEMS, 'tiny_scaled', dict(
      gpu.ITEMS['gpt2_350m_scan_dots'],
      fields=dict(gpu.ITEMS['gpt2_350m_scan_dots']['fields'], **tiny),
      batch=2, seq=16, loss_chunk_size=8))
  row = gpu.measure('tiny_scaled', steps=2, seconds=5.0)
  assert row['timed_steps'] == 2
  assert row['options']['scan_layers'] and not row['options']['packed']


def test_decode_benchmark_rows_ratios_and_bytes():
  """bench/decode.py's arithmetic on a case with stand-in contenders."""
  from flax import nnx

  import jax_transformer as jt
  from jax_transformer.bench import decode
  model = jt.DecoderLM(jt.ModelConfig(
      vocab_size=64, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64,
      num_encoder_layers=0, num_decoder_layers=2), nnx.Rngs(0))
  weights = sum(x.nbytes for x in
                jax.tree.leaves(nnx.state(model, nnx.Param)))
  # Cache: 2 (keys, values) x 2 layers x batch 3 x 2 heads x 8 wide x 10
  # slots x 4 bytes.
  assert decode.step_bytes(model, 3, 10) == weights + 2 * 2 * 3 * 2 * 8 * 40
  tokens = np.zeros((3, 4), np.int32)
  case = decode.Case('tiny', 3, 4, 2,
                     {'ours': lambda: tokens, 'ref': lambda: tokens + 1},
                     {'ours': 1000.0, 'ref': 1000.0}, 'ref')
  rows = {r['side']: r for r in decode.measure(case, 3, bandwidth=1e9,
                                                 peak=2e9)}
  ours = rows['ours']
  assert ours['same_tokens'] == 0.0 and 'speed_vs_ref' in ours
  assert ours['tokens_per_s'] == pytest.approx(12 / ours['seconds'])
  assert ours['bandwidth_fraction'] == pytest.approx(
      2 * ours['peak_bandwidth_fraction'])
  assert decode.peak_bandwidth('NVIDIA H200') == 4.8e12
  assert decode.peak_bandwidth('cpu') is None


@pytest.mark.slow
def test_lora_suite_times_lora_against_full_fine_tuning():
  """--suite lora on finetune:gpt2_shakespeare's config at a tiny size."""
  from jax_transformer.bench import lora
  (row,) = lora.run(rounds=1, vocab=64, seq_len=8, batch_size=2, model=dict(
      vocab_size=64, d_model=16, num_heads=2, num_decoder_layers=1,
      d_ff=32, max_len=16))
  assert row['suite'] == 'lora' and row['rank'] == lora.RANK
  assert row['rounds'] == 1 and row['lora_s'] > 0 and row['full_s'] > 0
  assert row['ratio'] == pytest.approx(row['lora_s'] / row['full_s'])
  assert row['meets_goal'] == (row['ratio'] <= 0.75)
  # The adapters alone train: fewer trainable parameters, and less memory
  # (no optimizer moments of the base).
  assert 0 < row['lora_trainable_m'] < row['full_trainable_m']
  assert row['full_trainable_m'] == pytest.approx(row['params_m'])
  assert 0 < row['lora_memory_gb'] < row['full_memory_gb']
  printed = script_helpers.load_script('benchmark').table([row])
  for column in ('lora_s=', 'full_s=', 'ratio=', 'lora_memory_gb='):
    assert column in printed
