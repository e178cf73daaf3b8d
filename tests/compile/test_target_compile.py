"""Steps compiled by a TPU's or GPU's own compiler on this CPU host:
targets, collective bytes from the HLO, the report and the refusal.

The compilers come from the ``aot`` extra (TPU) and ``aot-gpu`` (GPU; CI
keeps it in .ci-cache/gpu-compiler, outside the environment). A test that
needs one it cannot find is skipped, saying which. ``train.py
--aot_target`` and ``compile_at_size.py --target`` start one way
(``targets.start``), tested here through both: nothing the runtimes print
of their own start, and a missing compiler in one sentence.
"""

import importlib.util
import json
import os
import subprocess
import sys

import flop_count
import pytest
import repo
import script_helpers

from jax_transformer.compile import hlo_stats, topology
from jax_transformer.errors import UsageError
from jax_transformer.experiment import doors
from jax_transformer.runtime import gpu_specs, targets

# A v5e chip's bf16 peak and ICI bandwidth (Google's figures, as
# docs/scaling.md's table gives them).
V5E_PEAK, V5E_ICI = 197e12, 200e9
GPU_COMPILER = os.path.join(repo.ROOT, '.ci-cache', 'gpu-compiler')
HAS_TPU = importlib.util.find_spec('libtpu') is not None
HAS_GPU = (importlib.util.find_spec('jax_cuda12_plugin') is not None
           or os.path.isdir(os.path.join(GPU_COMPILER, 'jax_cuda12_plugin')))
HAS_CUDNN = (importlib.util.find_spec('nvidia') is not None
             or os.path.isdir(os.path.join(GPU_COMPILER, 'nvidia', 'cudnn')))
needs_tpu = pytest.mark.skipif(
    not HAS_TPU, reason="no TPU compiler: pip install -e '.[aot]'")
needs_gpu = pytest.mark.skipif(
    not HAS_GPU, reason="no GPU compiler: pip install -e '.[aot-gpu]' (or "
    'into .ci-cache/gpu-compiler, as .ci/run does)')

# A loop of 12 trips whose body all-reduces 1024 floats, and one all-gather
# of 256 bf16 outside it.
LOOP_HLO = """HloModule m

%cond (p: (s32[], f32[1024])) -> pred[] {
  %p = (s32[], f32[1024]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(12)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %p = (s32[], f32[1024]) parameter(0)
  %x = f32[1024]{0} get-tuple-element(%p), index=1
  %all-reduce.1 = f32[1024]{0:T(128)} all-reduce(%x), channel_id=1, to_apply=%add
  ROOT %t = (s32[], f32[1024]) tuple(%i, %all-reduce.1)
}

ENTRY %main (a: f32[1024], /*index=1*/b: bf16[64]) -> f32[1024] {
  %w = (s32[], f32[1024]) while(%init), condition=%cond, body=%body
  %all-gather-start = (bf16[64]{0}, bf16[256]{0}) all-gather-start(%b), dimensions={0}
  %all-gather-done = bf16[256]{0} all-gather-done(%all-gather-start)
  ROOT %r = f32[1024] get-tuple-element(%w), index=1
}
"""


def test_collective_bytes_count_each_loop_trip():
  moved = hlo_stats.collective_bytes(LOOP_HLO)
  assert moved['all-reduce'] == 12 * 1024 * 4
  assert moved['all-gather'] == 256 * 2  # the start counted, not the done
  assert moved['reduce-scatter'] == 0


@pytest.mark.parametrize('name, topology, chips', [
    ('v5p-128', 'v5:4x4x4', 64),   # 128 cores, megacore
    ('v5p-64', 'v5:2x4x4', 32),
    ('v5p-384', 'v5:4x4x12', 192),
    ('v5p-768', 'v5:4x8x12', 384),
    ('v4-8', 'v4:2x2x1', 4),
    ('v4-4096', 'v4:8x16x16', 2048),
    ('v5e-1', 'v5e:1x1', 1),
    ('v5e-16', 'v5e:4x4', 16),
    ('v6e-64', 'v6e:8x8', 64),
    ('h100-16', '2x1x8', 16),
    ('h200-24', '3x1x8', 24),
])
def test_any_slice_of_the_known_families_parses_by_name(name, topology,
                                                         chips):
  t = targets.target(name)
  assert (t.topology, t.chips) == (topology, chips)
  assert t.platform == ('cuda' if name.startswith('h') else 'tpu')
  assert t.megacore == name.startswith(('v4', 'v5p'))
  assert 'major: 9' in gpu_specs.target_config('h200')


@pytest.mark.parametrize('name, sentence', [
    ('v5x-8', "Unknown target 'v5x-8': name a TPU slice v4-N or v5p-N"),
    ('v5p-12', 'v5p-12 is not a v5p slice: v5p-N counts TensorCores (2 a '
     'chip): 8, 16, 32, 64, or a multiple of 128 that fits the 16x20x28 pod'),
    ('v5e-12', 'v5e-12 is not a v5e slice: v5e-N counts chips, one of 1, 4, '
     '8, 16, 32, 64, 128, 256 (e.g. v5e-16).'),
    ('v4-16384', 'v4-16384 is not a v4 slice'),
    ('h100-12', 'h100-12 is not a number of whole GPU hosts: h100-N counts '
     'GPUs, 8 a host'),
])
def test_a_name_that_is_no_slice_is_refused_in_one_sentence(name, sentence):
  with pytest.raises(UsageError) as err:
    targets.target(name)
  assert str(err.value).startswith(sentence), err.value


# What the runtimes print of their own start on this host, without their
# hardware: libtpu's (no TPU VM's metadata, no worker hostnames, JAX's TPU
# backend) and the CUDA plugin's (no driver, once per library, each after
# absl's note). A process that compiles for a target prints none of them.
START_LINES = ('could not determine TPU', 'InitGoogle', 'libtpu_init_utils',
               "Unable to initialize backend 'tpu'", 'cudart_stub',
               'Could not find cuda drivers', 'absl::InitializeLog')


def start_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines()
          if any(said in line for said in START_LINES)]


def as_a_user(pythonpath=None) -> dict:
  """The environment of a user's shell: none of the variables the test
  session sets for its own JAX (the command sets what it needs), the GPU
  compiler's folder on PYTHONPATH where given. Another process compiling
  for a TPU (a user's, a parallel test) holds libtpu's lock; compiling
  needs no TPU, so it may be shared."""
  env = {k: v for k, v in os.environ.items()
         if k not in ('JAX_PLATFORMS', 'TPU_SKIP_MDS_QUERY', 'XLA_FLAGS')}
  env['ALLOW_MULTIPLE_LIBTPU_LOAD'] = '1'
  if pythonpath:
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (pythonpath, env.get('PYTHONPATH')) if p)
  return env


def compile_at_size(*flags, pythonpath=None):
  return subprocess.run(
      [sys.executable, os.path.join(repo.SCRIPTS, 'compile_at_size.py'),
       *flags], cwd=repo.ROOT, env=as_a_user(pythonpath),
      capture_output=True, text=True, timeout=900)


def train_aot(*flags, pythonpath=None):
  """train.py --aot_target as a user runs it, from the repository root."""
  return subprocess.run(
      [sys.executable, 'train.py', *flags], cwd=repo.ROOT,
      env=as_a_user(pythonpath), capture_output=True, text=True,
      timeout=900)


@needs_tpu
@pytest.mark.slow
def test_rows_split_over_the_sequence_axis_compile_for_a_tpu():
  """sequence 2 on a v5e-4: the splash kernel runs per shard (its block
  tables cut along the queries), the step's all-gathers are the keys and
  values, and the report counts them over the sequence axis."""
  out = compile_at_size('--target', 'v5e-4', '--config',
                        'lm_shakespeare:tiny', '--config.batch_size=8',
                        '--config.mesh.data=2', '--config.mesh.sequence=2',
                        '--config.seq_len=256', '--config.model.max_len=256',
                        '--train_only')
  assert out.returncode == 0, out.stderr[-3000:]
  row = json.loads(out.stdout.strip().splitlines()[-1])
  assert row['mesh'] == {'data': 2, 'fsdp': 1, 'sequence': 2, 'tensor': 1}
  assert row['fits'] and row['attention_kernel'] == 'splash'
  assert row['attention_kernels_in_hlo'] == ['pallas']
  # Keys and values (one layer), each gathered once.
  counts = row['async_collectives']
  assert counts['async']['all-gather'] + counts['sync']['all-gather'] == 2
  assert row['collective_bytes']['all-gather'] > 0
  by_axes = row['collective_bytes_by_axes']
  assert by_axes.get('sequence', 0) >= row['collective_bytes']['all-gather']


@pytest.mark.slow
def test_a_tiny_lm_compiles_for_v5e_4_with_the_tpu_compiler(tmp_path):
  # Whole 128-token blocks: the splash kernel takes the attention.
  out = compile_at_size('--target', 'v5e-4', '--config',
                        'lm_shakespeare:tiny', '--config.batch_size=16',
                        '--config.seq_len=128', '--config.model.max_len=128',
                        '--serialize', str(tmp_path / 'step.bin'))
  assert out.returncode == 0, out.stderr[-3000:]
  assert not start_lines(out.stderr), out.stderr[-3000:]
  row = json.loads(out.stdout.strip().splitlines()[-1])
  assert row['device_kind'] == 'TPU v5 lite' and row['devices'] == 4
  assert row['fits'] and 0 < row['per_chip_bytes'] < row['chip_memory_bytes']
  assert row['chip_memory_bytes'] == 16 * 2 ** 30
  assert row['attention_kernel'] == 'splash'
  assert row['attention_kernels_in_hlo'] == ['pallas']
  # Data parallel over 4 chips: the gradients are all-reduced.
  assert row['collective_bytes']['all-reduce'] > 0
  # The MFU from the row's own fields: the model's FLOPs of a step
  # (counted from its weights' shapes, at the report's 32768-token
  # vocabulary) at a v5e's 197 TFLOP/s on each of 4 chips, over the
  # predicted step.
  cfg = doors.load('lm_shakespeare:tiny').replace(
      **{'model.max_len': 128, 'seq_len': 128, 'batch_size': 16})
  assert cfg.optim.grad_accum_steps == 1
  flops = flop_count.lm_train_flops(cfg.model_config(32768), 16, 128)
  assert row['model_flops_per_step'] == pytest.approx(flops, rel=1e-12)
  assert row['predicted_mfu'] == pytest.approx(
      flops / (4 * V5E_PEAK * row['predicted_step_s']), rel=1e-9)
  # The KV-cached decode compiled too.
  assert row['decode_compile_s'] > 0 and row['decode_per_chip_bytes'] > 0
  for key in ('config', 'target', 'estimate_bytes', 'compile_s'):
    assert key in row
  assert (tmp_path / 'step.bin').stat().st_size > 0


@needs_tpu
@pytest.mark.slow
def test_a_run_over_the_chips_memory_is_refused_in_one_sentence():
  # About a terabyte of activations per chip: refused, never prepared; in
  # a shell that sets nothing for libtpu, which says nothing of its start.
  out = train_aot('--config', 'lm_shakespeare:tiny',
                  '--config.batch_size=1048576', '--aot_target', 'v5e-4',
                  '--workdir', '/nonexistent/never_made')
  assert out.returncode == 2, out.stderr[-3000:]
  assert len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]
  last = out.stderr.strip()
  assert last.startswith('train.py: error: --aot_target v5e-4: '
                         'lm_shakespeare:tiny needs '), last
  assert ('per chip to train by the TPU v5 lite compiler, and a chip has '
          '17.2 GB') in last


@needs_gpu
@pytest.mark.slow
def test_a_tiny_lm_compiles_for_one_h100_host_with_the_gpu_compiler():
  out = compile_at_size('--target', 'h100-8', '--config',
                        'lm_shakespeare:tiny', '--config.batch_size=16',
                        '--config.seq_len=128', '--config.model.max_len=128',
                        '--config.model.dtype=bfloat16',
                        pythonpath=GPU_COMPILER)
  assert out.returncode == 0, out.stderr[-3000:]
  assert not start_lines(out.stderr), out.stderr[-3000:]
  row = json.loads(out.stdout.strip().splitlines()[-1])
  assert row['device_kind'] == 'NVIDIA H100 80GB HBM3'
  assert row['fits'] and row['devices'] == 8
  assert row['chip_memory_bytes'] == 80 * 10 ** 9
  if not HAS_CUDNN:
    pytest.skip("cuDNN's library is absent: pip install -e '.[aot-gpu]'")
  # bfloat16, 16-wide heads: 'auto' picks cuDNN and its compiler built it.
  assert row['attention_kernel'] == 'cudnn'
  assert row['attention_kernels_in_hlo'] == ['cudnn']


@needs_gpu
@pytest.mark.slow
def test_a_translation_model_with_padding_compiles_for_cudnn():
  """cuDNN takes a mask only as long as the queries: the source padding
  mask, broadcast over queries, is spread over them before the call (its
  compile failed with "Bias must have same seq length as QKV")."""
  out = compile_at_size('--target', 'h100-8', '--config',
                        'translate_ende:tiny', '--config.batch_size=16',
                        '--config.eval_batch_size=16',
                        '--config.model.dtype=bfloat16',
                        pythonpath=GPU_COMPILER)
  assert out.returncode == 0, out.stderr[-3000:]
  row = json.loads(out.stdout.strip().splitlines()[-1])
  assert row['fits'] and row['eval_per_chip_bytes']


@needs_tpu
@pytest.mark.slow
def test_two_slices_compile_with_the_data_axis_across_them():
  out = compile_at_size('--target', 'v5e-4', '--slices', '2', '--config',
                        'lm_shakespeare:tiny', '--config.mesh.data=2',
                        '--config.mesh.fsdp=4', '--config.batch_size=16',
                        '--train_only')
  assert out.returncode == 0, out.stderr[-3000:]
  row = json.loads(out.stdout.strip().splitlines()[-1])
  assert row['devices'] == 8 and row['slices'] == 2
  # The train step alone: no eval step or decode was compiled.
  assert row['compile_s'] > 0
  assert not any(k.startswith(('eval_', 'decode_')) for k in row), row
  assert row['mesh'] == {'data': 2, 'fsdp': 4, 'sequence': 1, 'tensor': 1}
  # The hybrid mesh the run builds (model/sharding.make_mesh): data alone
  # crosses between the slices.
  assert row['mesh_spans'] == {'data': 2, 'fsdp': 1, 'sequence': 1,
                               'tensor': 1}
  assert row['fits']
  # The gradients' reduction over data crosses the slices and is priced
  # at the data-center network's 25 Gb/s a chip, not the chips' links.
  classes = row['link_classes']
  assert classes['sync_cross'] + classes['async_cross'] > 0, classes
  assert row['network_bytes_per_s'] == pytest.approx(25e9 / 8)
  # The link time from the row's bytes: those that cross at the network's
  # rate, the rest at a v5e's 200 GB/s of ICI (no latency is charged on a
  # target's rates); the step by the step model's formula from its parts.
  net, ici = 25e9 / 8, V5E_ICI
  sync = classes['sync'] / ici + classes['sync_cross'] / net
  asynchronous = classes['async'] / ici + classes['async_cross'] / net
  assert row['network_s'] == pytest.approx(
      (classes['sync_cross'] + classes['async_cross']) / net, rel=1e-9)
  assert row['link_bound_s'] == pytest.approx(sync + asynchronous, rel=1e-9)
  exposed = row['exposed_hbm_s']
  kernels = max(row['compute_bound_s'], row['hbm_bound_s'] - exposed) + exposed
  assert row['step_time_bound_s'] == pytest.approx(
      max(kernels, 0.75 * asynchronous) + 0.25 * asynchronous + sync,
      rel=1e-9)
  assert row['link_share'] == pytest.approx(
      row['link_bound_s'] / row['step_time_bound_s'], rel=1e-9)


@needs_tpu
@pytest.mark.slow
def test_a_tiny_lm_compiles_for_v5p_64_by_its_name():
  out = compile_at_size('--target', 'v5p-64', '--config',
                        'lm_shakespeare:tiny', '--config.batch_size=32',
                        '--config.eval_batch_size=32')
  assert out.returncode == 0, out.stderr[-3000:]
  row = json.loads(out.stdout.strip().splitlines()[-1])
  assert row['devices'] == 32 and row['device_kind'] == 'TPU v5'
  assert row['fits'] and row['decode_fits']


@needs_gpu
@pytest.mark.slow
def test_a_tiny_lm_compiles_for_two_h100_hosts_with_fsdp_across_them():
  out = compile_at_size('--target', 'h100-16', '--config',
                        'lm_shakespeare:tiny', '--config.batch_size=16',
                        '--config.eval_batch_size=16', '--config.mesh.data=1',
                        '--config.mesh.fsdp=-1',
                        '--config.model.attention_implementation=xla',
                        pythonpath=GPU_COMPILER)
  assert out.returncode == 0, out.stderr[-3000:]
  row = json.loads(out.stdout.strip().splitlines()[-1])
  assert row['devices'] == 16 and row['fits']
  assert row['mesh_spans'] == {'data': 1, 'fsdp': 2, 'sequence': 1,
                               'tensor': 1}
  # FSDP over both hosts: its gathers and reductions cross them, priced
  # at the network's 8 x 400 Gb/s a host (50 GB/s a GPU), a ninth of
  # NVLink's 450 GB/s; --network_gbps sets another rate.
  classes = row['link_classes']
  assert classes['sync_cross'] + classes['async_cross'] > 0, classes
  assert row['network_bytes_per_s'] == pytest.approx(50e9)
  crossing = classes['sync_cross'] + classes['async_cross']
  assert row['network_s'] == pytest.approx(crossing / 50e9)
  assert row['cost_version'] == 9


@needs_gpu
@pytest.mark.slow
def test_train_compiles_for_two_h100_hosts_as_compile_at_size_does():
  """train.py --aot_target starts as compile_at_size.py --target does: a
  GPU target compiles (it ended in "topology not implemented for cuda"),
  and the CUDA plugin's start-up lines are held back."""
  # 16 rows of 128 tokens and 2 layers, not the recipe's 512 of 1024 and
  # 24: the start lines and the summary's form are the same at any batch
  # and depth, at less than half the time (76 s -> 35 s, most of it the
  # decode's compile).
  out = train_aot('--config', 'lm_350m', '--aot_target', 'h100-16',
                  '--config.batch_size=16', '--config.eval_batch_size=16',
                  '--config.seq_len=128', '--config.model.num_decoder_layers=2',
                  pythonpath=GPU_COMPILER)
  assert out.returncode == 0, out.stderr[-3000:]
  assert not start_lines(out.stderr), out.stderr[-3000:]
  summary = out.stdout.strip().splitlines()[-1]
  assert summary.startswith('lm_350m on h100-16 (16 x NVIDIA H100 80GB '
                            'HBM3, '), summary
  assert ': fits: ' in summary and 'per chip of 80.0 GB' in summary


@pytest.mark.skipif(importlib.util.find_spec('jax_cuda12_plugin')
                    is not None, reason='the GPU compiler is installed here')
@pytest.mark.parametrize('command', [
    ['train.py', '--config', 'lm_350m', '--aot_target', 'h100-8'],
    [os.path.join('scripts', 'compile_at_size.py'), '--target', 'h200-16',
     '--config', 'lm_350m'],
])
def test_a_missing_gpu_compiler_is_one_sentence_naming_the_extra(command):
  out = subprocess.run([sys.executable, *command], cwd=repo.ROOT,
                       env=as_a_user(), capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 2, out.stderr[-3000:]
  lines = out.stderr.strip().splitlines()
  assert len(lines) == 1, out.stderr[-3000:]
  assert lines[0].endswith(
      'needs the GPU compiler (jax_cuda12_plugin, the aot-gpu extra), which '
      "is not installed here: pip install -e '.[aot-gpu]', or into a folder "
      'on PYTHONPATH (docs/scaling.md).'), lines[0]


def test_a_missing_tpu_compiler_is_one_sentence_before_jax_starts(
    monkeypatch):
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: (
      None if name == 'libtpu' else find_spec(name, *a)))
  before = dict(os.environ)
  with pytest.raises(UsageError) as err, targets.start('v5e-4'):
    pytest.fail('started without its compiler')
  assert str(err.value) == (
      'Target v5e-4 needs the TPU compiler (libtpu, the aot extra), which '
      "is not installed here: pip install -e '.[aot]'.")
  assert dict(os.environ) == before  # refused before setting anything


def test_devices_come_slice_by_slice():
  class Device:
    def __init__(self, slice_index, id_):
      self.slice_index, self.id = slice_index, id_
  mixed = [Device(1, 0), Device(0, 1), Device(0, 0), Device(1, 1)]
  order = sorted(mixed, key=topology._device_order)  # pylint: disable=protected-access
  assert [(d.slice_index, d.id) for d in order] == [(0, 0), (0, 1), (1, 0),
                                                     (1, 1)]


def test_the_table_script_writes_rows_and_errors_as_the_docs_table():
  table = script_helpers.load_script('target_table')
  row = {'config': 'lm_7b', 'target': 'v5p-128',
         'mesh': {'data': 1, 'fsdp': 64, 'tensor': 1}, 'batch_size': 512,
         'seq_len': 2048, 'per_chip_bytes': 63.2e9, 'estimate_bytes': 53.5e9,
         'chip_memory_bytes': 102.0e9, 'fits': True, 'over_by_bytes': 0,
         'compile_s': 97.4, 'predicted_mfu': 0.8, 'attention_kernel': 'splash',
         'largest_batch': 896, 'link_share': 0.03, 'cost_version': 9}
  failed = {'config': 'wmt_base', 'target': 'h100-8',
            'error': 'no compile within 1800 s'}
  row.update(collective_bytes={'all-reduce': 3.0e9, 'all-gather': 0.2e9},
             compute_bound_s=0.3, hbm_bound_s=0.1, link_bound_s=0.01,
             xla_options='XLA overlap: lhs, ag (LIBTPU_INIT_ARGS)')
  lines = table.markdown([row, failed]).splitlines()
  assert 'predicted MFU, cost version 9 (limited by; links)' in lines[0]
  assert lines[2] == ('| `lm_7b` | `v5p-128` | shipped | fsdp 64 | 512 x '
                      '2048 | 63.2 of 102.0 GB | yes | 896 | 0.85x | 97 s '
                      '| 3.2 GB | 80% (compute; 3%) | splash | on |')
  # A failure is a line under the table, never a cell.
  assert len(lines) == 5 and lines[3] == ''
  assert lines[4] == ('- `wmt_base` on `h100-8` did not compile: no compile '
                      'within 1800 s')
  with pytest.raises(UsageError, match='--targets: unknown v9-8'):
    table.parse_args(['--targets', 'v9-8'])
  assert table.main(['--targets', 'v9-8']) == 2
  assert table.parse_args(['--targets', 'v5e-4,h100-8']).targets == [
      'v5e-4', 'h100-8']


def test_a_failed_compile_is_its_exception_not_jaxs_note():
  table = script_helpers.load_script('target_table')
  stderr = ('Traceback (most recent call last):\n  File "x.py", line 1\n'
            'jax.errors.JaxRuntimeError: INTERNAL: ptxas exited\n'
            '--------------------\nFor simplicity, JAX has removed its '
            'internal frames from the traceback of the following exception. '
            'Set JAX_TRACEBACK_FILTERING=off to include these.\n')
  assert table.failure(stderr) == (
      'jax.errors.JaxRuntimeError: INTERNAL: ptxas exited')
  assert table.failure('ValueError: bad\n') == 'ValueError: bad'
  assert table.failure('') == '(no output)'


def test_the_table_compiles_at_the_rows_a_run_takes():
  table = script_helpers.load_script('target_table')
  # The language models at about 1M tokens a step.
  assert table.table_batch('gpt2_small', 'v5e-256') == 1024
  assert table.table_batch('lm_7b', 'v5p-128') == 512
  # Translation at the paper's ~25k tokens a side: 128 rows of 256 on 256
  # chips is 128 data shards x tensor 2 (8 heads).
  assert table.table_batch('wmt_base', 'v5e-256') == 128
  assert table.mesh_flags('wmt_base', 'v5e-256') == [
      '--config.mesh.data=128', '--config.mesh.fsdp=1',
      '--config.mesh.tensor=2']
  assert table.mesh_flags('wmt_base', 'v5p-128') == []
  assert table.table_batch('wmt_base', 'h100-8') == 128


def test_the_planners_layout_becomes_the_pairs_flags(monkeypatch):
  table = script_helpers.load_script('target_table')
  best = {'rank': 1, 'data': 2, 'fsdp': 128, 'tensor': 1, 'remat': 'none',
          'param_dtype': 'float32', 'loss_chunk_size': 131072,
          'batch_size': 1024, 'grad_accum_steps': 1}
  ran = []

  def plan(cmd, **_):
    ran.append(cmd)
    return subprocess.CompletedProcess(
        cmd, 0, json.dumps(dict(best, rank=2)) + '\n' + json.dumps(best)
        + '\n| table |\n', '')
  monkeypatch.setattr(table.subprocess, 'run', plan)
  flags = table.planned_flags('lm_1_3b', 'v5e-256', 1024, 300, 60)
  assert '--global_batch=1024' in ran[0] and '--budget_s=300' in ran[0]
  assert flags == [
      '--config.mesh.data=2', '--config.mesh.fsdp=128',
      '--config.mesh.tensor=1', '--config.model.remat=none',
      '--config.model.param_dtype=float32',
      '--config.loss_chunk_size=131072', '--config.batch_size=1024',
      '--config.eval_batch_size=1024', '--config.optim.grad_accum_steps=1']
  monkeypatch.setattr(table.subprocess, 'run', lambda cmd, **_: (
      subprocess.CompletedProcess(cmd, 1, '', '')))
  assert table.planned_flags('lm_1_3b', 'v5e-256', 1024, 300, 60) == (
      'no layout it compiled fits')


def test_the_largest_batch_comes_from_two_compiles(monkeypatch):
  table = script_helpers.load_script('target_table')
  # 10 GB fixed and 0.1 GB a row: 96 GB of room holds 960 rows.
  monkeypatch.setattr(table, 'compile_pair', lambda c, t, timeout, *flags: {
      'per_chip_bytes': 10e9 + 0.1e9 * int(flags[0].split('=')[1])})
  row = {'config': 'lm_7b', 'target': 'v5p-128', 'batch_size': 512,
         'mesh': {'data': 1, 'fsdp': 64, 'tensor': 1},
         'per_chip_bytes': 10e9 + 0.1e9 * 512, 'chip_memory_bytes': 106e9}
  assert table.largest_batch(row, 60) == 960


@pytest.mark.parametrize('args, says', [
    (['--train_only'], '--train_only narrows a --target compile'),
    (['--slices', '2'], '--slices needs --target NAME.'),
    (['--serialize', 'step.bin'], '--serialize writes a --target compile'),
    (['--network_gbps', '100'], '--network_gbps prices a --target compile'),
])
def test_target_flags_without_a_target_are_one_sentence(args, says, capsys):
  script = script_helpers.load_script('compile_at_size')
  assert script.main(args) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and says in lines[0], lines
