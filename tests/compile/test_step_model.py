"""The step-time model (``compile/step_model.py``) and what it reads of
the HLO (``compile/hlo_stats.py``): FLOPs per loop trip, its arithmetic,
and one set of figures for the target report and the planner."""

import json

import jax
import jax.numpy as jnp
import pytest

from jax_transformer import cli
from jax_transformer.compile import hlo_stats, lowering, report, step_model
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


def test_the_model_adds_parts_on_host_devices_and_takes_the_longest_on_chips():
  cost = step_model.StepCost(flops=2e12, hbm_bytes=1e9, link_bytes=3e9,
                             collectives=10, collective_bytes={},
                             attention_kernels=[])
  chip = step_model.Rates('chip', 1e12, 1e9, 1e9, None, overlap=True)
  host = step_model.Rates('host', 1e12, 1e9, 1e9, None, overlap=False,
                          collective_latency_s=0.1)
  on_chip = step_model.predict(cost, chip, 2, 1e12, 1)
  assert on_chip['predicted_step_s'] == pytest.approx(2 * 3.0)
  assert on_chip['mfu_bound'] == pytest.approx(1 / 6)
  on_host = step_model.predict(cost, host, 1, 1e12, 1)
  assert on_host['predicted_step_s'] == pytest.approx(2 + 1 + 3 + 1)


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
  sized = search.Sizer(cfg, where, 64)(layout)
  run = lowering.lower_train(sized.cfg, list(where.devices), 'cpu', 64,
                             sized.setup)
  step = report.compile_lowered(run.lowered, run.lower_s)
  table = report.roofline(step, sized.cfg, sized.setup, rates, where.chips)
  # As the planner keeps it (its cache's JSON) and ranks it.
  kept = json.loads(json.dumps(search.compiled_result(step, sized, where)))
  planned = search.compiled_row(sized, kept, 'tiny', where, 16)
  for ours, theirs in (('compute_bound_s', 'compute_s'),
                       ('hbm_bound_s', 'hbm_s'), ('link_bound_s', 'link_s'),
                       ('step_time_bound_s', 'step_s'),
                       ('predicted_step_s', 'predicted_step_s'),
                       ('mfu_bound', 'mfu_bound')):
    assert table[ours] == pytest.approx(planned[theirs], rel=1e-9), ours
  assert table['collective_bytes'] == planned['collective_bytes']
  assert table['predicted_step_s'] == pytest.approx(
      2 * table['step_time_bound_s'])
  assert 0 < table['mfu_bound'] < 1
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
