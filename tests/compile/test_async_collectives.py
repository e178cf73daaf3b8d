# ruff: noqa: E501 (HLO text is one instruction a line)
"""Collectives the compilers schedule asynchronously (start/done pairs),
read from the optimized HLO; and the overlap options reaching a target's
compiler (``runtime/xla_options.py``)."""

import json

import pytest
from test_target_compile import GPU_COMPILER, compile_at_size, needs_gpu, needs_tpu

from jax_transformer.compile import hlo_stats

# XLA:GPU's form: an all-gather split into start and done, and a
# synchronous all-reduce.
GPU_HLO = """HloModule m

ENTRY %main (b: bf16[64], c: f32[8]) -> bf16[256] {
  %b = bf16[64]{0} parameter(0)
  %c = f32[8]{0} parameter(1)
  %all-gather-start = (bf16[64]{0}, bf16[256]{0}) all-gather-start(%b), dimensions={0}
  %all-reduce.2 = f32[8]{0} all-reduce(%c), to_apply=%add
  ROOT %all-gather-done = bf16[256]{0} all-gather-done(%all-gather-start)
}
"""

# A TPU's form: an async collective fusion (start and done fusions around
# the all-gather) and a synchronous all-reduce.
TPU_HLO = """HloModule m

%fused_computation.1 (p: bf16[64]) -> (bf16[64], bf16[256]) {
  %p = bf16[64]{0} parameter(0)
  %all-gather.1 = bf16[256]{0} all-gather(%p), dimensions={0}
  ROOT %custom-call.1 = (bf16[64]{0}, bf16[256]{0}) custom-call(%all-gather.1), custom_call_target="AsyncCollectiveStart"
}

%async_collective_fusion.3 (r: bf16[64]) -> bf16[256] {
  %r = bf16[64]{0} parameter(0)
  ROOT %all-gather.3 = bf16[256]{0} all-gather(%r), dimensions={0}
}

%fused_computation.2 (q: (bf16[64], bf16[256])) -> bf16[256] {
  %q = (bf16[64]{0}, bf16[256]{0}) parameter(0)
  %q0 = bf16[64]{0} get-tuple-element(%q), index=0
  %all-gather.2 = bf16[256]{0} all-gather(%q0), dimensions={0}
  ROOT %custom-call.2 = bf16[256]{0} custom-call(%q, %all-gather.2), custom_call_target="AsyncCollectiveDone"
}

ENTRY %main (b: bf16[64], c: f32[8]) -> bf16[256] {
  %b = bf16[64]{0} parameter(0)
  %c = f32[8]{0} parameter(1)
  %async-collective-start.1 = (bf16[64]{0}, bf16[256]{0}) fusion(%b), kind=kCustom, calls=%fused_computation.1
  %fusion.3 = bf16[256]{0} fusion(%b), kind=kLoop, calls=%async_collective_fusion.3
  %all-reduce.2 = f32[8]{0} all-reduce(%c), to_apply=%add
  ROOT %async-collective-done.1 = bf16[256]{0} fusion(%async-collective-start.1), kind=kCustom, calls=%fused_computation.2
}
"""


@pytest.mark.parametrize('hlo', [GPU_HLO, TPU_HLO], ids=['gpu', 'tpu'])
def test_start_done_pairs_are_counted_as_async(hlo):
  counts = hlo_stats.async_collectives(hlo)
  assert counts['pairs'] == {'start': 1, 'done': 1}
  assert counts['async']['all-gather'] == 1
  assert counts['sync']['all-reduce'] == 1
  assert counts['sync']['all-gather'] == counts['async']['all-reduce'] == 0
  # A TPU repeats the collective in the fusions between start and done:
  # its bytes count once.
  assert hlo_stats.collective_bytes(hlo) == {
      'all-reduce': 8 * 4, 'all-gather': 256 * 2, 'reduce-scatter': 0,
      'all-to-all': 0, 'collective-permute': 0}
  assert hlo_stats.collective_launches(hlo) == 2


# A tiny LM over 4 (TPU) or 8 (GPU) devices on fsdp: its weights are
# gathered and its gradients reduced every layer.
TINY = ('--config', 'lm_shakespeare:tiny', '--config.batch_size=16',
        '--config.seq_len=128', '--config.model.max_len=128',
        '--config.mesh.data=1')


def assert_overlapped(row, variable):
  assert row['xla_options'].startswith('XLA overlap: lhs, ')
  assert row['xla_options'].endswith(f'({variable})')
  counts = row['async_collectives']
  assert counts['pairs']['start'] == counts['pairs']['done'] > 0
  assert sum(counts['async'].values()) > 0


@needs_tpu
@pytest.mark.slow
def test_a_sharded_step_for_a_tpu_has_async_collectives():
  out = compile_at_size('--target', 'v5e-4', *TINY, '--config.mesh.fsdp=4')
  assert out.returncode == 0, out.stderr[-3000:]
  row = json.loads(out.stdout.strip().splitlines()[-1])
  assert row['mesh']['fsdp'] == 4
  assert_overlapped(row, 'LIBTPU_INIT_ARGS')
  # The layers' weights are gathered in async collective fusions.
  assert row['async_collectives']['async']['all-gather'] > 0


@needs_gpu
@pytest.mark.slow
def test_a_sharded_step_for_h100s_has_async_collectives():
  out = compile_at_size('--target', 'h100-8', *TINY, '--config.mesh.fsdp=8',
                        pythonpath=GPU_COMPILER)
  assert out.returncode == 0, out.stderr[-3000:]
  row = json.loads(out.stdout.strip().splitlines()[-1])
  assert row['mesh']['fsdp'] == 8
  assert_overlapped(row, 'XLA_FLAGS')
  counts = row['async_collectives']
  # XLA:GPU starts every collective of this step asynchronously.
  assert sum(counts['sync'].values()) == 0


# A layer loop of 24 trips whose fusion reads one layer's slice of a
# stacked [24, 1024] input and writes its output into a stacked [24, 1024]
# buffer in place.
STACKED_HLO = """HloModule m

%fused_computation.5 (param_0.1: f32[24,1024], param_1.1: f32[24,1024], param_2.1: s32[]) -> f32[24,1024] {
  %param_0.1 = f32[24,1024]{1,0} parameter(0)
  %param_1.1 = f32[24,1024]{1,0} parameter(1)
  %param_2.1 = s32[] parameter(2)
  %zero = s32[] constant(0)
  %dynamic-slice.1 = f32[1,1024]{1,0} dynamic-slice(%param_1.1, %param_2.1, %zero), dynamic_slice_sizes={1,1024}
  %exp.1 = f32[1,1024]{1,0} exponential(%dynamic-slice.1)
  ROOT %dynamic-update-slice.1 = f32[24,1024]{1,0} dynamic-update-slice(%param_0.1, %exp.1, %param_2.1, %zero)
}

%cond (p: (s32[], f32[24,1024], f32[24,1024])) -> pred[] {
  %p = (s32[], f32[24,1024], f32[24,1024]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(24)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[24,1024], f32[24,1024])) -> (s32[], f32[24,1024], f32[24,1024]) {
  %p = (s32[], f32[24,1024], f32[24,1024]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %out = f32[24,1024]{1,0} get-tuple-element(%p), index=1
  %in = f32[24,1024]{1,0} get-tuple-element(%p), index=2
  %fusion.5 = f32[24,1024]{1,0} fusion(%out, %in, %i), kind=kLoop, calls=%fused_computation.5
  ROOT %t = (s32[], f32[24,1024], f32[24,1024]) tuple(%i, %fusion.5, %in)
}

ENTRY %main (a: f32[24,1024]) -> f32[24,1024] {
  %a = f32[24,1024]{1,0} parameter(0)
  %w = (s32[], f32[24,1024], f32[24,1024]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[24,1024] get-tuple-element(%w), index=1
}
"""


def test_a_fused_slice_and_in_place_update_move_one_layer():
  per_step, once = hlo_stats.memory_bytes(STACKED_HLO)
  # Each trip reads one [1, 1024] f32 slice and the 4-byte counter, and
  # writes one slice: not the two whole [24, 1024] arrays.
  trip = 1024 * 4 * 2 + 4
  assert per_step == 24 * trip
  assert once == trip + 9  # and the loop's condition (a compare) once


# The same loop as a TPU writes it: the layer's slice is taken by a fusion
# nested in the one that uses it, and the in-place update is the root of
# another nested fusion.
NESTED_HLO = STACKED_HLO.replace('''%fused_computation.5 (''', '''%slice_one (p_0: f32[24,1024], p_1: s32[]) -> f32[1,1024] {
  %p_0 = f32[24,1024]{1,0} parameter(0)
  %p_1 = s32[] parameter(1)
  %zero.2 = s32[] constant(0)
  ROOT %dynamic-slice.2 = f32[1,1024]{1,0} dynamic-slice(%p_0, %p_1, %zero.2), dynamic_slice_sizes={1,1024}
}

%update_one (u_0: f32[24,1024], u_1: f32[1,1024], u_2: s32[]) -> f32[24,1024] {
  %u_0 = f32[24,1024]{1,0} parameter(0)
  %u_1 = f32[1,1024]{1,0} parameter(1)
  %u_2 = s32[] parameter(2)
  %zero.3 = s32[] constant(0)
  ROOT %dynamic-update-slice.3 = f32[24,1024]{1,0} dynamic-update-slice(%u_0, %u_1, %u_2, %zero.3)
}

%fused_computation.5 (''').replace(
    '''  %dynamic-slice.1 = f32[1,1024]{1,0} dynamic-slice(%param_1.1, %param_2.1, %zero), dynamic_slice_sizes={1,1024}''',
    '''  %dynamic-slice.1 = f32[1,1024]{1,0} fusion(%param_1.1, %param_2.1), kind=kLoop, calls=%slice_one''').replace(
    '''  ROOT %dynamic-update-slice.1 = f32[24,1024]{1,0} dynamic-update-slice(%param_0.1, %exp.1, %param_2.1, %zero)''',
    '''  ROOT %fusion.6 = f32[24,1024]{1,0} fusion(%param_0.1, %exp.1, %param_2.1), kind=kLoop, calls=%update_one''')


def test_a_slice_and_update_in_nested_fusions_move_one_layer():
  """Counted as the slice and the update they are, not as the whole
  stacked arrays each trip (a TPU's layer loop: 24x the bytes)."""
  assert 'calls=%slice_one' in NESTED_HLO
  assert 'calls=%update_one' in NESTED_HLO
  assert hlo_stats.memory_bytes(NESTED_HLO)[0] == 24 * (1024 * 4 * 2 + 4)


def test_a_buffer_allocation_moves_no_bytes():
  """A TPU allocates the stack of a scanned layer's saved activations with
  an AllocateBuffer custom call, which writes nothing (XLA's own cost
  analysis counts nothing for it either)."""
  allocating = STACKED_HLO.replace(
      '''  %w = (s32[], f32[24,1024], f32[24,1024]) while(%init)''',
      '''  %buffer = f32[24,1024]{1,0} custom-call(), custom_call_target="AllocateBuffer"
  %w = (s32[], f32[24,1024], f32[24,1024]) while(%init)''')
  assert 'AllocateBuffer' in allocating
  assert (hlo_stats.memory_bytes(allocating)
          == hlo_stats.memory_bytes(STACKED_HLO))


# A TPU's compiler prefetches a buffer into its on-chip memory (memory
# space 1, S(1) in the layout) with an asynchronous copy; the kernel that
# uses it reads it there.
ON_CHIP_HLO = """HloModule m

ENTRY %main (a: f32[1024]) -> f32[1024] {
  %a = f32[1024]{0} parameter(0)
  %copy-start = (f32[1024]{0}, f32[1024]{0:S(1)}, u32[]) copy-start(%a)
  %copy-done = f32[1024]{0:S(1)} copy-done(%copy-start)
  ROOT %e = f32[1024]{0} exponential(%copy-done)
}
"""


def test_a_buffer_on_chip_moves_no_hbm_bytes():
  """The prefetch reads the array from HBM once; the kernel reads it on
  chip and writes its result to HBM: 2 x 4096 bytes of HBM traffic, not
  the 4 x 4096 every operand and result come to (XLA's own figure, which
  the per-step count scales)."""
  per_step, once = hlo_stats.memory_bytes(ON_CHIP_HLO)
  assert per_step == 2 * 4096
  assert once == 4 * 4096
