"""benchmark.py --suite sequence: a row per seq_len with both layouts'
times, their ratio and each step's memory, as the record takes them."""

from jax_transformer.bench import record, sequence


def test_a_row_per_length_with_both_layouts():
  rows = sequence.run(rounds=1, seq_lens=(128,))
  (row,) = rows
  assert row['shape'] == '2x128' and row['rounds'] == 1
  assert row['ratio'] == row['sequence_s'] / row['tensor_s']
  assert row['sequence_memory_gb'] > 0 and row['tensor_memory_gb'] > 0
  figures = record.figures(rows)
  assert 'sequence/lm_shakespeare:tiny/train/2x128/2/cpu/ratio' in figures
