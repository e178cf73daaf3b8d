"""A run killed while writing a metrics row leaves half a line; the next
run's writer drops it instead of gluing its own first row to it."""

import pytest

from jax_transformer.train import metrics

WHOLE = '{"step": 1, "loss": 2.0}\n'


@pytest.mark.parametrize('before', [WHOLE + '{"step": 2, "lo',
                                    '{"step": 1, "lo', WHOLE, ''])
def test_the_next_writer_drops_a_torn_last_row(tmp_path, before):
  with open(tmp_path / 'metrics.jsonl', 'w') as f:
    f.write(before)
  writer = metrics.MetricWriter(str(tmp_path))
  writer.write(2, {'loss': 1.5})
  writer.write(3, {'loss': 1.25})
  writer.close()
  whole_rows = [1] if before.startswith(WHOLE) else []
  steps = whole_rows + [2, 3]
  assert [r['step'] for r in metrics.read_jsonl(str(tmp_path))] == steps
  assert [r['step'] for r in metrics.read_history(str(tmp_path))] == steps
