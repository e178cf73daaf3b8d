"""The step-time model against measured steps: eight layouts of a small LM
on 8 CPU host devices (each mesh kind, remat full, gradient
accumulation), planned and then run in interleaved rounds. The predicted
order agrees with the measured one (Spearman's rank correlation at least
0.8) and the predicted fastest is the measured fastest, within 10% (near
equal layouts, such as data 8 with and without accumulation, trade
places from run to run on a shared host)."""

import jax
import pytest

from jax_transformer.bench import plan as plan_suite
from jax_transformer.plan import measure, search


@pytest.mark.slow
def test_predicted_order_of_layouts_agrees_with_measured_steps():
  where = search.Where.here(jax.devices())
  assert where.chips == 8 and not where.rates.overlap
  rows = measure.compare(measure.host_check_config(),
                         measure.host_check_layouts(), where,
                         vocab_size=512, rounds=3)
  result = plan_suite.summary([
      {'predicted_step_s': r['predicted_step_s'],
       'measured_step_s': r['measured_step_s']} for r in rows])
  assert result['spearman'] >= 0.8, rows
  assert result['top_choice_agrees'], rows
