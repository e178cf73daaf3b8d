"""Padding, packing (segment ids, positions, no cross-talk) and resumption."""

import grain
import numpy as np
import pytest

from jax_transformer.data import batching
from jax_transformer.data.tokenizers import BOS_ID, EOS_ID


def random_sequences(n, max_len, seed=0):
  rng = np.random.default_rng(seed)
  # Ids from 10 up: distinguishable from pad/bos/eos in the checks below.
  return [rng.integers(10, 1000, size=rng.integers(1, max_len + 1))
          for _ in range(n)]


def segments_of_row(row_values, row_segments):
  """{segment id: its tokens} of one row."""
  return {s: row_values[row_segments == s]
          for s in np.unique(row_segments) if s > 0}


def test_lm_and_translation_examples():
  ex = batching.lm_example([5, 6, 7])
  np.testing.assert_array_equal(ex['inputs'], [BOS_ID, 5, 6, 7])
  np.testing.assert_array_equal(ex['targets'], [5, 6, 7, EOS_ID])
  tr = batching.translation_example([10, 11], [20, 21, 22])
  np.testing.assert_array_equal(tr['src'], [10, 11, EOS_ID])
  np.testing.assert_array_equal(tr['tgt_in'], [BOS_ID, 20, 21, 22])
  np.testing.assert_array_equal(tr['tgt_out'], [20, 21, 22, EOS_ID])


def test_fits_and_truncate_keep_alignment():
  layout = batching.translation_layout(4, 3)
  ex = batching.translation_example([10, 11, 12], [20, 21, 22])
  assert batching.fits(ex, layout) is False  # tgt has length 4 > 3
  cut = batching.truncate(ex, layout)
  assert batching.fits(cut, layout)
  np.testing.assert_array_equal(cut['tgt_in'], [BOS_ID, 20, 21])
  np.testing.assert_array_equal(cut['tgt_out'], [20, 21, 22])
  np.testing.assert_array_equal(cut['src'], [10, 11, 12, EOS_ID])


def test_unpacked_batches_pad_one_example_per_row():
  seqs = random_sequences(5, 6)
  layout = batching.lm_layout(8)
  batches = list(batching.batch_examples(
      [batching.lm_example(s) for s in seqs], layout, batch_size=2))
  assert len(batches) == 3
  for b in batches:
    assert set(b) == set(batching.batch_keys(layout))
    assert all(v.shape == (2, 8) and v.dtype == np.int32 for v in b.values())
  rows = [(b, r) for b in batches for r in range(2)]
  for (b, r), s in zip(rows, seqs):
    n = len(s) + 1
    np.testing.assert_array_equal(b['segment_ids'][r], [1] * n + [0] * (8 - n))
    np.testing.assert_array_equal(b['positions'][r, :n], np.arange(n))
    np.testing.assert_array_equal(b['inputs'][r, 1:n], s)
    assert not b['inputs'][r, n:].any() and not b['targets'][r, n:].any()
  # The 6th row (last batch, row 1) is pure padding.
  last = batches[-1]
  assert not any(last[k][1].any() for k in last)


@pytest.mark.parametrize('batch_size,length', [(1, 16), (3, 12), (4, 40)])
def test_packing_recovers_every_sequence(batch_size, length):
  seqs = random_sequences(40, length - 1, seed=batch_size)
  layout = batching.lm_layout(length)
  batches = list(batching.batch_examples(
      [batching.lm_example(s) for s in seqs], layout, batch_size, pack=True))
  recovered = []
  for b in batches:
    for r in range(batch_size):
      seg, pos = b['segment_ids'][r], b['positions'][r]
      ids = segments_of_row(b['inputs'][r], seg)
      tgts = segments_of_row(b['targets'][r], seg)
      assert list(ids) == list(range(1, len(ids) + 1))  # 1, 2, ... in order
      for s in ids:
        # Segments are contiguous and positions restart at 0.
        where = np.flatnonzero(seg == s)
        assert np.all(np.diff(where) == 1)
        np.testing.assert_array_equal(pos[where], np.arange(len(where)))
        # Each segment is exactly one whole sequence: nothing leaks across.
        assert ids[s][0] == BOS_ID and tgts[s][-1] == EOS_ID
        np.testing.assert_array_equal(ids[s][1:], tgts[s][:-1])
        recovered.append((where[0], b, r, tgts[s][:-1]))
      assert not b['inputs'][r][seg == 0].any()
      assert not pos[seg == 0].any()
  got = sorted(map(tuple, (x[-1] for x in recovered)))
  assert got == sorted(map(tuple, seqs))
  # Packing must beat one-per-row padding when sequences are short.
  if length >= 40:
    assert len(batches) < len(seqs) / batch_size


def test_packing_translation_keeps_pairs_together():
  rng = np.random.default_rng(1)
  pairs = [(rng.integers(10, 500, rng.integers(1, 6)),
            rng.integers(500, 999, rng.integers(1, 9))) for _ in range(30)]
  layout = batching.translation_layout(12, 16)
  examples = [batching.translation_example(s, t) for s, t in pairs]
  expected = {tuple(s): tuple(t) for s, t in pairs}
  seen = 0
  for b in batching.batch_examples(examples, layout, 2, pack=True):
    for r in range(2):
      srcs = segments_of_row(b['src'][r], b['src_segment_ids'][r])
      tgts = segments_of_row(b['tgt_out'][r], b['tgt_segment_ids'][r])
      assert srcs.keys() == tgts.keys()
      for s in srcs:
        # Source segment k and target segment k come from the same pair.
        assert expected[tuple(srcs[s][:-1])] == tuple(tgts[s][:-1])
        seen += 1
  assert seen == len(pairs)


def test_packer_rejects_too_long_examples():
  packer = batching.RowPacker(batching.lm_layout(4), 2)
  with pytest.raises(ValueError, match='exceed'):
    packer.add(batching.lm_example([5, 6, 7, 8]))


def test_lm_window_is_shifted_by_one():
  tokens = np.arange(100, 121)  # 21 tokens -> 2 windows of 10 (+1)
  assert batching.num_lm_windows(len(tokens), 10) == 2
  w = batching.lm_window(tokens, 1, 10)
  np.testing.assert_array_equal(w['inputs'], np.arange(110, 120))
  np.testing.assert_array_equal(w['targets'], np.arange(111, 121))
  np.testing.assert_array_equal(w['segment_ids'], np.ones(10))
  with pytest.raises(IndexError):
    batching.lm_window(tokens, 2, 10)


def _packed_dataset(seqs, pack):
  ds = grain.MapDataset.source(seqs).map(batching.lm_example)
  # Chunks of 5 examples: restore points fall inside chunks too. Every 7th
  # example is dropped (None), as a length filter would.
  ds = ds.map_with_index(lambda i, ex: None if i % 7 == 3 else ex)
  return batching.pack_and_batch(ds, batching.lm_layout(12), 3, pack=pack,
                                 chunk_size=5)


@pytest.mark.parametrize('pack', [True, False])
def test_pack_iterator_resumes_exactly(pack):
  seqs = random_sequences(60, 8, seed=3)
  full = list(_packed_dataset(seqs, pack))
  assert len(full) > 6
  offsets = set()
  for stop in range(1, 8):
    it = iter(_packed_dataset(seqs, pack))
    for _ in range(stop):
      next(it)
    state = it.get_state()
    offsets.add(state['offset'])
    restored = iter(_packed_dataset(seqs, pack))
    restored.set_state(state)
    rest = list(restored)
    assert len(rest) == len(full) - stop
    for a, b in zip(rest, full[stop:]):
      for k in a:
        np.testing.assert_array_equal(a[k], b[k])
  assert len(offsets) > 1  # some states point inside a chunk
  # The batch-at-a-time generator and the grain dataset agree.
  ref = list(batching.batch_examples(
      [batching.lm_example(s) for i, s in enumerate(seqs) if i % 7 != 3],
      batching.lm_layout(12), 3, pack=pack))
  assert len(ref) == len(full)
  np.testing.assert_array_equal(ref[-1]['inputs'], full[-1]['inputs'])
