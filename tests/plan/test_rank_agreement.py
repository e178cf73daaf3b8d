"""The step-time model's order of layouts, checked where it cannot be
wrong without a fault in the model or in what it reads of the HLO: of two
layouts of the same run on 8 CPU devices, compiled (never run) and priced
at a TPU v5e's fixed rates, the one that does the same work and moves more
bytes, or does more work, must be predicted slower. Under cost version 8
(every byte assumed hidden behind compute) a compute-bound pair tied.

How well the model's order agrees with measured steps is a measurement,
``scripts/benchmark.py --suite plan`` (docs/planning.md), not asserted here:
a timed assertion fails on a loaded machine. The slow test runs that
suite's comparison on two layouts and checks its summary against the rows.
"""

import jax
import numpy as np
import pytest

from jax_transformer.bench import plan as plan_suite
from jax_transformer.compile import step_model
from jax_transformer.experiment import Experiment
from jax_transformer.plan import candidates as cands
from jax_transformer.plan import measure, search
from jax_transformer.runtime import targets


def _planned(layouts: list[cands.Candidate]) -> dict[str, dict]:
  """The layouts of the host-check LM planned (compiled, not run) on the 8
  CPU devices at a v5e chip's rates, by layout. Its 'tiny' size (2 layers
  of width 128, 64-token rows; 32 rows as _layout's): the comparisons
  below are of HLO costs, the same on any host, and hold at it with
  margins (hbm 1.6x, link 1.29x, compute 1.24x against the 1.2x, 1.2x and
  1.1x asked) at a quarter of the 'small' size's compile time."""
  rates = step_model.Rates.of_target(targets.target('v5e-8'))
  assert rates.overlap  # an accelerator's: the parts overlap, in part
  where = search.Where('v5e rates', tuple(jax.devices()), 'cpu', rates)
  base = layouts[0].apply(measure.host_check_config('tiny'))
  rows = search.plan(Experiment.of(base), 'rank check', where,
                     layouts[0].batch_size * layouts[0].grad_accum_steps,
                     budget_s=float('inf'), cache_dir=None, vocab_size=512,
                     only=layouts, log=lambda _: None)
  return {r['layout']: r for r in rows}


def _layout(data, fsdp, tensor, remat='none', accum=1, rows=32):
  return cands.Candidate(data, fsdp, tensor, remat, 'float32', 0,
                         rows // accum, accum)


@pytest.mark.slow
def test_a_layout_slower_by_construction_is_predicted_slower():
  """Data over 8 with two accumulation steps does the same FLOPs an update
  as with one and reads every weight and its gradient twice; FSDP over 8
  with remat 'full' recomputes each layer's forward and gathers its
  weights again for it. Each is predicted slower than its plain twin, and
  the planner ranks them so."""
  once, twice = _layout(8, 1, 1), _layout(8, 1, 1, accum=2)
  plain, recompute = _layout(1, 8, 1), _layout(1, 8, 1, remat='full')
  rows = _planned([once, twice, plain, recompute])
  a, b, c, d = (rows[x.describe()] for x in (once, twice, plain, recompute))
  for row in (a, b, c, d):
    assert row['fits'] and row['predicted_step_s'] > 0, row
    assert row['ranked_by'], row
  # The same FLOPs, more HBM bytes an update: slower.
  assert b['compute_s'] * 2 == pytest.approx(a['compute_s'], rel=0.05)
  assert b['cost_bytes']['hbm'] > 1.2 * a['cost_bytes']['hbm']
  assert b['predicted_step_s'] > a['predicted_step_s']
  assert b['rank'] > a['rank']
  # More FLOPs and more link bytes: slower.
  assert d['compute_s'] > 1.1 * c['compute_s']
  assert d['cost_bytes']['link'] > 1.2 * c['cost_bytes']['link']
  assert d['predicted_step_s'] > c['predicted_step_s']
  assert d['rank'] > c['rank']


def test_ties_go_to_the_layout_that_moves_fewer_bytes():
  """Two rows the model cannot tell apart (within 0.5%): the planner puts
  first the one that moves fewer bytes, and says it broke a tie."""
  def row(name, seconds, moved):
    return {'layout': name, 'status': 'compiled', 'fits': True,
            'predicted_step_s': seconds, 'param_dtype': 'float32',
            'per_chip_bytes': 1, 'cost_bytes': {'hbm': moved, 'link': 0.0}}
  ranked = search.rank([row('more', 1.000, 2e9), row('fewer', 1.004, 1e9),
                        row('slower', 1.2, 0.0)])
  assert [r['layout'] for r in ranked] == ['fewer', 'more', 'slower']
  assert 'fewest bytes' in ranked[0]['ranked_by']
  assert ranked[2]['ranked_by'] == 'predicted time'


@pytest.mark.slow
def test_the_suite_measures_each_layout_and_sums_up_its_rows():
  """The benchmark's comparison on two layouts (not timed against any
  figure): each planned and measured in the order given, and the summary's
  figures are those of its rows."""
  where = search.Where.here(jax.devices())
  assert where.chips == 8 and not where.rates.overlap
  layouts = measure.host_check_layouts('tiny')[:2]  # data 8, fsdp 8
  rows = measure.compare(measure.host_check_config('tiny'), layouts, where,
                         vocab_size=512, rounds=1)
  assert [r['layout'] for r in rows] == [c.describe() for c in layouts]
  for row in rows:
    assert row['predicted_step_s'] > 0 and row['measured_step_s'] > 0, row
  result = plan_suite.summary(rows, 'tiny')
  assert result['size'] == 'tiny'
  ratios = [r['predicted_step_s'] / r['measured_step_s'] for r in rows]
  assert result['layouts'] == 2
  assert result['cost_version'] == step_model.COST_VERSION
  assert result['median_predicted_over_measured'] == pytest.approx(
      float(np.median(ratios)))
  assert result['worst_predicted_over_measured'] in ratios
  (p0, p1), (m0, m1) = ([r[k] for r in rows] for k in (
      'predicted_step_s', 'measured_step_s'))
  assert result['spearman'] == pytest.approx(
      1.0 if (p0 < p1) == (m0 < m1) else -1.0)


@pytest.mark.parametrize('size', list(measure.HOST_SIZES))
def test_each_size_measures_meshes_remat_a_chunked_loss_and_accumulation(
    size):
  """What the suite measures at each size, from tiny to gpt2_small's width:
  more than one mesh kind, remat, a chunked loss; all at one update's
  rows; the smaller sizes also accumulation and remat dots."""
  layouts = measure.host_check_layouts(size)
  rows = {c.batch_size * c.grad_accum_steps for c in layouts}
  assert rows == {measure.HOST_SIZES[size].rows}
  assert len({(c.data, c.fsdp, c.tensor) for c in layouts}) >= 3
  assert {'none', 'full'} <= {c.remat for c in layouts}
  assert any(c.loss_chunk_size for c in layouts)
  if size != 'gpt2_small_4l':
    assert any(c.grad_accum_steps > 1 for c in layouts)
    assert 'dots' in {c.remat for c in layouts}
  cfg = measure.host_check_config(size)
  assert cfg.model.num_decoder_layers == measure.HOST_SIZES[size].layers
  # Every layout splits the model: heads and widths over 'tensor'.
  for c in layouts:
    assert cfg.model.num_heads % c.tensor == 0, (size, c)
    assert cfg.model.d_model % (c.tensor * c.fsdp) == 0, (size, c)
