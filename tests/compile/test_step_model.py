"""The step-time model (``compile/step_model.py``) and what it reads of
the HLO (``compile/hlo_stats.py``): FLOPs per loop trip, its arithmetic,
and one set of figures for the target report and the planner."""

import json

import flop_count
import jax
import jax.numpy as jnp
import pytest

from jax_transformer import cli
from jax_transformer.compile import hlo_stats, lowering, report, step_model
from jax_transformer.experiment import Experiment
from jax_transformer.plan import candidates as cands
from jax_transformer.plan import search
from jax_transformer.runtime import targets


def test_matmul_flops_count_every_trip_of_a_scanned_body():
  def f(w, x):
    y, _ = jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)
    return y.sum()
  hlo = jax.jit(jax.grad(f)).lower(
      jnp.ones((3, 64, 64)), jnp.ones((8, 64))).compile().as_text()
  per_step, once = hlo_stats.dot_flops(hlo)
  forward = 3 * 2 * 8 * 64 * 64   # three layers of an 8 x 64 @ 64 x 64
  assert per_step == 3 * forward  # and the backward's two matmuls each
  assert once < per_step          # each body counted once


def _cost(**given):
  fields = dict(flops=2e12, hbm_bytes=1e9, link_bytes=3e9, collectives=10,
                collective_bytes={}, attention_kernels=[])
  fields.update(given)
  if 'link_classes' in given:
    fields['link_bytes'] = sum(given['link_classes'].values())
  return step_model.StepCost(**fields)


CHIP = step_model.Rates('chip', 1e12, 1e9, 1e9, None, overlap=True,
                        network_bytes_per_s=1e8, collective_overlap=0.75)


def test_the_model_adds_parts_on_host_devices_and_overlaps_some_on_chips():
  """On chips: compute 2 s, HBM 1 s (behind the matmuls), links 3 s. A
  synchronous collective stops the chip; an asynchronous one hides 3/4
  of its time; on host devices every part adds."""
  on_chip = step_model.predict(_cost(link_classes={'sync': 3e9}), CHIP,
                               2, 1e12, 1)
  assert on_chip['step_s'] == pytest.approx(2 + 3)
  assert on_chip['predicted_step_s'] == pytest.approx(2 * 5)
  assert on_chip['predicted_mfu'] == pytest.approx(1 / 10)
  assert on_chip['link_share'] == pytest.approx(3 / 5)
  hidden = step_model.predict(_cost(link_classes={'async': 3e9}), CHIP,
                              1, 1e12, 1)
  assert hidden['step_s'] == pytest.approx(max(2, 0.75 * 3) + 0.25 * 3)
  assert hidden['exposed_link_s'] == pytest.approx(1.0)
  host = step_model.Rates('host', 1e12, 1e9, 1e9, None, overlap=False,
                          collective_latency_s=0.1)
  on_host = step_model.predict(_cost(), host, 1, 1e12, 1)
  assert on_host['predicted_step_s'] == pytest.approx(2 + 1 + 3 + 1)


def test_of_two_layouts_with_the_same_flops_the_one_moving_more_is_slower():
  """Cost version 9: bytes no matmul hides (between kernels) and link
  bytes (however overlapped) each make a compute-bound step slower; cost
  version 8 (everything overlapped) tied all four."""
  def step(**given):
    return step_model.predict(_cost(**given), CHIP, 1, 1e12, 1)['step_s']
  base = step(hbm_bytes=1e9, exposed_hbm_bytes=0.2e9,
              link_classes={'async': 0.5e9})
  assert step(hbm_bytes=1.5e9, exposed_hbm_bytes=0.7e9,
              link_classes={'async': 0.5e9}) > base
  assert step(hbm_bytes=1e9, exposed_hbm_bytes=0.2e9,
              link_classes={'async': 1.5e9}) > base
  assert step(hbm_bytes=1e9, exposed_hbm_bytes=0.2e9,
              link_classes={'async': 0.5e9, 'sync': 0.1e9}) > base
  # What the matmul kernels read hides behind their math, up to it.
  assert step(hbm_bytes=1.5e9, exposed_hbm_bytes=0.2e9,
              link_classes={'async': 0.5e9}) == pytest.approx(base)


def test_collectives_that_cross_hosts_or_slices_move_at_the_networks_rate():
  """The same bytes: at the chip's link rate inside a host or slice, at
  the network's (here 10x slower) across."""
  local = step_model.predict(_cost(link_classes={'sync': 1e9}), CHIP,
                             1, 1e12, 1)
  across = step_model.predict(_cost(link_classes={'sync_cross': 1e9}),
                              CHIP, 1, 1e12, 1)
  assert local['link_s'] == pytest.approx(1.0)
  assert across['link_s'] == across['network_s'] == pytest.approx(10.0)
  assert across['step_s'] == pytest.approx(2 + 10)


def test_gpu_hosts_are_priced_at_the_network_and_it_can_be_overridden():
  h100 = step_model.Rates.of_target(targets.target('h100-64'))
  assert h100.network_bytes_per_s == pytest.approx(8 * 400e9 / 8 / 8)
  assert h100.link_bytes_per_s / h100.network_bytes_per_s == pytest.approx(9)
  given = step_model.Rates.of_target(targets.target('v5p-128'),
                                     targets.network_rate(
                                         targets.target('v5p-128'), 100))
  assert given.network_bytes_per_s == pytest.approx(100e9 / 8)


def test_the_target_report_and_the_planner_give_one_step_time():
  """One executable, two readers: the target report's roofline and the
  planner's row for the same compiled step give the same seconds and MFU
  bound (they once scaled XLA's bytes two ways and disagreed: 100% against
  30% for lm_350m on 8 H100s). Compiled once, on the 8 CPU devices, at a
  v5e's rates, with two accumulation steps an update."""
  cfg = cli.load_config('lm_shakespeare:tiny')
  cfg.model.update(num_heads=4, num_decoder_layers=2)
  rates = step_model.Rates.of_target(targets.target('v5e-8'))
  where = search.Where('v5e rates', tuple(jax.devices()), 'cpu', rates)
  layout = cands.Candidate(4, 2, 1, 'none', 'float32', 0, 8, 2)
  sized = search.Sizer(Experiment.of(cfg), where, 64)(layout)
  run = lowering.lower_train(sized.cfg, list(where.devices), 'cpu', 64,
                             sized.setup)
  step = report.compile_lowered(run.lowered, run.lower_s)
  table = report.roofline(step, sized.cfg.step_shape,
                          sized.cfg.optim.grad_accum_steps, sized.setup,
                          rates, where.chips)
  # As the planner keeps it (its cache's JSON) and ranks it.
  kept = json.loads(json.dumps(search.compiled_result(step, sized, where)))
  planned = search.compiled_row(sized, kept, 'tiny', where, 16)
  for ours, theirs in (('compute_bound_s', 'compute_s'),
                       ('hbm_bound_s', 'hbm_s'), ('link_bound_s', 'link_s'),
                       ('step_time_bound_s', 'step_s'),
                       ('predicted_step_s', 'predicted_step_s'),
                       ('predicted_mfu', 'predicted_mfu')):
    assert table[ours] == pytest.approx(planned[theirs], rel=1e-9), ours
  assert table['collective_bytes'] == planned['collective_bytes']
  assert table['predicted_step_s'] == pytest.approx(
      2 * table['step_time_bound_s'])
  # The MFU from the row's own fields: the model's FLOPs of an update (two
  # steps of the step's rows, counted from its weights' shapes) at a v5e's
  # 197 TFLOP/s on each of the 8 chips, over the predicted update.
  shape = sized.cfg.step_shape
  update = flop_count.lm_train_flops(sized.setup.model_config,
                                     2 * shape.batch_size, shape.seq_len)
  assert table['model_flops_per_step'] == pytest.approx(update / 2,
                                                        rel=1e-12)
  assert table['predicted_mfu'] == pytest.approx(
      update / (8 * 197e12 * table['predicted_step_s']), rel=1e-9)
  # Data x fsdp over 8 devices: weights gathered, gradients reduced.
  assert table['link_bound_s'] > 0 and table['hbm_bound_s'] > 0


# A weight gradient as a TPU's compiler writes it: heads as a window of 16
# padded 15 each side over an input of size 1, so each output sees one
# input position. True work: 2 x 1024 x 2048 x 16 x 128 multiply-adds.
CONVOLUTION_HLO = ("""HloModule m

ENTRY %main (x: bf16[2,1024,2048,1], g: bf16[2,1024,16,128]) -> bf16[2048,16,128,1] {
  %x = bf16[2,1024,2048,1]{3,2,1,0} parameter(0)
  %g = bf16[2,1024,16,128]{3,2,1,0} parameter(1)
  ROOT %convolution.1 = bf16[2048,16,128,1]{3,2,1,0} convolution(%x, %g), """
    """window={size=16x2 pad=15_15x0_0 rhs_reversal=1x0}, """
    """dim_labels=1fb0_1i0o->b0f1
}
""")
GEMM_HLO = ("""HloModule m

ENTRY %main (a: bf16[8,4], b: bf16[4,16]) -> bf16[8,16] {
  %a = bf16[8,4]{1,0} parameter(0)
  %b = bf16[4,16]{1,0} parameter(1)
  %gemm = (bf16[8,16]{1,0}, s8[64]{0}) custom-call(%a, %b), """
    """custom_call_target="__cublas$gemm", backend_config={"gemm_backend_"""
    """config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":"""
    """["1"],"rhs_contracting_dimensions":["0"]}}}
  ROOT %r = bf16[8,16]{1,0} get-tuple-element(%gemm), index=0
}
""")


def test_matmuls_written_as_padded_convolutions_or_cublas_calls_count_once():
  assert hlo_stats.dot_flops(CONVOLUTION_HLO)[0] == 2.0 * (
      2 * 1024 * 2048 * 16 * 128)
  assert hlo_stats.dot_flops(GEMM_HLO)[0] == 2.0 * 8 * 16 * 4


# A schedule of three collectives on 8 partitions: an all-gather started
# with a matmul before its done (overlapped), an all-reduce started and
# done with nothing between (exposed), and a synchronous all-reduce over
# groups that join partitions 0-3 with 4-7.
_GROUPS = ', use_global_device_ids=true'
SCHEDULE_HLO = '\n'.join([
    'HloModule m, is_scheduled=true',
    '',
    '%add (a: f32[], b: f32[]) -> f32[] {',
    '  %a = f32[] parameter(0)',
    '  %b = f32[] parameter(1)',
    '  ROOT %s = f32[] add(%a, %b)',
    '}',
    '',
    'ENTRY %main (w: f32[64,64], x: f32[256]) -> f32[64,64] {',
    '  %w = f32[64,64]{1,0} parameter(0)',
    '  %x = f32[256]{0} parameter(1)',
    '  %all-gather-start = (f32[256]{0}, f32[1024]{0}) all-gather-start(%x), '
    'channel_id=1, replica_groups=[2,4]<=[8], dimensions={0}' + _GROUPS,
    '  %dot = f32[64,64]{1,0} dot(%w, %w), lhs_contracting_dims={1}, '
    'rhs_contracting_dims={0}',
    '  %all-gather-done = f32[1024]{0} all-gather-done(%all-gather-start)',
    '  %all-reduce-start = f32[256]{0} all-reduce-start(%x), channel_id=2, '
    'replica_groups=[2,4]<=[8]' + _GROUPS + ', to_apply=%add',
    '  %all-reduce-done = f32[256]{0} all-reduce-done(%all-reduce-start)',
    '  %all-reduce = f32[256]{0} all-reduce(%x), channel_id=3, '
    'replica_groups=[4,2]<=[2,4]T(1,0)' + _GROUPS + ', to_apply=%add',
    '  %negate = f32[64,64]{1,0} negate(%dot)',
    '  ROOT %r = f32[64,64]{1,0} add(%negate, %dot)',
    '}', ''])


def test_a_collective_is_hidden_only_with_math_between_its_start_and_done():
  hosts = [0, 0, 0, 0, 1, 1, 1, 1]
  links = hlo_stats.collective_links(SCHEDULE_HLO, hosts)
  # all-gather: 4 KB hidden, local; the started-and-done all-reduce: 1 KB
  # twice, exposed, local; the last: 1 KB twice, exposed, across hosts.
  assert links == {'async': 4096, 'sync': 2048, 'sync_cross': 2048,
                   'async_cross': 0}
  assert sum(links.values()) == hlo_stats.link_bytes(
      hlo_stats.collective_bytes(SCHEDULE_HLO))
  # On one host nothing crosses.
  assert hlo_stats.collective_links(SCHEDULE_HLO)['sync_cross'] == 0


def test_bytes_of_kernels_without_a_matmul_are_the_exposed_ones():
  """The negate and the add move 3 x 16 KB each way no matmul hides; the
  dot's 48 KB hide behind its math; the collectives are the links'."""
  per_step, _ = hlo_stats.memory_bytes(SCHEDULE_HLO)
  exposed = hlo_stats.bytes_without_math(SCHEDULE_HLO)
  assert exposed == 2 * 16384 + 3 * 16384
  assert per_step > exposed


@pytest.mark.parametrize('line, groups', [
    ('replica_groups={{0,1},{2,3}}', [[0, 1], [2, 3]]),
    ('replica_groups=[2,4]<=[8]', [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ('replica_groups=[4,2]<=[2,4]T(1,0)', [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=mesh['x'=2,'y'=4] {'x'}",
     [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=mesh['x'=4,'y'=2], device_ids=([2,4]T(1,0)) {'x'}",
     [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ('source_target_pairs={{0,4},{4,0}}', [[0, 4], [4, 0]]),
    ('replica_groups={}', []),
])
def test_replica_groups_in_each_form_the_compilers_write(line, groups):
  assert hlo_stats.replica_groups(f'%c = f32[8] all-reduce(%x), {line}') \
      == groups


def test_collective_bytes_are_split_by_the_mesh_axes_their_groups_span():
  """On a mesh {'fsdp': 2, 'sequence': 4} (partition p at position
  (p // 4, p % 4)): groups along the last axis span 'sequence', along the
  first 'fsdp', all eight both."""
  hlo = '\n'.join([
      'ENTRY %main {',
      '  %a = f32[256] all-gather(f32[64] %x), replica_groups=[2,4]<=[8], '
      'dimensions={0}',
      '  %b = f32[128] all-reduce(f32[128] %y), replica_groups=[4,2]<=[2,4]'
      'T(1,0), to_apply=%add',
      '  ROOT %c = f32[32] all-reduce(f32[32] %z), replica_groups={}, '
      'to_apply=%add',
      '}'])
  got = hlo_stats.collective_bytes_by_axes(hlo, {'fsdp': 2, 'sequence': 4})
  assert got == {'sequence': 256 * 4, 'fsdp': 128 * 4,
                 'fsdp+sequence': 32 * 4}
