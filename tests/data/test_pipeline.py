"""Grain pipelines on fixture datasets: formats, direction, sharding, resume."""

import json
import os

import jax
import ml_collections
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from jax_transformer import data
from jax_transformer.data import datasets
from jax_transformer.data import testing as data_testing
from jax_transformer.data.tokenizers import BOS_ID, EOS_ID

PLAYS = ('macbeth', 'tempest')
T = 32


@pytest.fixture(scope='module')
def prepared(tmp_path_factory):
  """Fixture corpora built and tokenized with the real prepare()."""
  root = tmp_path_factory.mktemp('data')
  plays = data_testing.write_fake_plays(root / 'texts', PLAYS)
  ding_file = data_testing.write_fake_ding(root / 'de-en')
  data_dir = str(root / 'tfds')
  return {
      'dir': data_dir,
      'shakespeare': data.prepare('shakespeare', data_dir, builder_kwargs={
          'source_dir': plays, 'plays': PLAYS}),
      # BPE: unigram needs a more varied corpus to learn whole words.
      'ding': data.prepare('ding_en_de', data_dir, vocab_size=500,
                           model_type='bpe',
                           builder_kwargs={'source_path': ding_file}),
  }


def lm_cfg(prepared):
  return {'name': 'shakespeare', 'data_dir': prepared['dir']}


def ding_cfg(prepared, direction='en-de', pack=False):
  return {'name': 'ding_en_de', 'data_dir': prepared['dir'],
          'direction': direction, 'pack': pack}


def take(it, n):
  return [next(it) for _ in range(n)]


def assert_same(batches_a, batches_b):
  assert len(batches_a) == len(batches_b)
  for a, b in zip(batches_a, batches_b):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def stream_text(prepared, split):
  source = datasets.load_source('shakespeare', split, prepared['dir'])
  return '\n\n'.join(datasets.as_text(source[i]['text'])
                     for i in range(len(source)))


def segments(values, segment_ids):
  """All (row, segment) token runs of a batch feature, in order."""
  out = []
  for r in range(values.shape[0]):
    for s in np.unique(segment_ids[r]):
      if s > 0:
        out.append(values[r][segment_ids[r] == s])
  return out


def test_lm_stream_batches(prepared):
  tok = prepared['shakespeare'].tokenizer
  it = data.make_iterator(lm_cfg(prepared), 'train', tok, batch_size=4,
                          seq_len=T, seed=0, process_index=0,
                          process_count=1, num_threads=1)
  batch = next(it)
  assert set(batch) == {'inputs', 'targets', 'segment_ids', 'positions'}
  for v in batch.values():
    assert v.shape == (4, T) and v.dtype == np.int32
  np.testing.assert_array_equal(batch['inputs'][:, 1:],
                                batch['targets'][:, :-1])
  assert (batch['segment_ids'] == 1).all()
  np.testing.assert_array_equal(batch['positions'][2], np.arange(T))
  text = stream_text(prepared, 'train')
  for row in batch['inputs']:
    assert tok.decode(row) in text


def test_lm_stream_eval_reads_each_window_once(prepared):
  tok = prepared['shakespeare'].tokenizer
  text = stream_text(prepared, 'validation')
  tokens = tok.encode(text)
  n_windows = (len(tokens) - 1) // T
  per_host = []
  for host in range(2):
    it = data.make_iterator(lm_cfg(prepared), 'validation', tok,
                            batch_size=4, seq_len=T, shuffle=False,
                            num_epochs=1, process_index=host,
                            process_count=2, num_threads=1)
    per_host.append(list(it))
  # Every host runs the same number of (local, 2-row) batches.
  assert len(per_host[0]) == len(per_host[1]) > 0
  assert all(b['inputs'].shape == (2, T) for h in per_host for b in h)
  rows = {}
  for host, batches in enumerate(per_host):
    flat = [r for b in batches for r in zip(b['inputs'], b['segment_ids'])]
    real = [ids for ids, seg in flat if seg.any()]
    for j, ids in enumerate(real):
      rows[host + 2 * j] = ids  # host h reads windows h, h + 2, ...
  assert sorted(rows) == list(range(n_windows))
  joined = np.concatenate([rows[i] for i in range(n_windows)])
  np.testing.assert_array_equal(joined, tokens[:n_windows * T])


@pytest.mark.parametrize('direction', ['en-de', 'de-en'])
@pytest.mark.parametrize('pack', [False, True])
def test_translation_direction_and_format(prepared, direction, pack):
  tok = prepared['ding'].tokenizer
  pairs = dict(data_testing.fake_ding_pairs())  # en -> de (one of them)
  all_pairs = set(data_testing.fake_ding_pairs())
  it = data.make_iterator(ding_cfg(prepared, direction, pack), 'train', tok,
                          batch_size=4, seq_len=T, seed=1, process_index=0,
                          process_count=1, num_threads=1)
  batch = next(it)
  assert set(batch) == {'src', 'src_segment_ids', 'src_positions', 'tgt_in',
                        'tgt_out', 'tgt_segment_ids', 'tgt_positions'}
  assert all(v.shape == (4, T) and v.dtype == np.int32
             for v in batch.values())
  srcs = segments(batch['src'], batch['src_segment_ids'])
  tgt_in = segments(batch['tgt_in'], batch['tgt_segment_ids'])
  tgt_out = segments(batch['tgt_out'], batch['tgt_segment_ids'])
  assert len(srcs) == len(tgt_out) >= (8 if pack else 4)
  for s, ti, to in zip(srcs, tgt_in, tgt_out):
    assert s[-1] == EOS_ID and to[-1] == EOS_ID and ti[0] == BOS_ID
    np.testing.assert_array_equal(ti[1:], to[:-1])
    src_text, tgt_text = tok.decode(s), tok.decode(to)
    en, de = ((src_text, tgt_text) if direction == 'en-de'
              else (tgt_text, src_text))
    assert (en, de) in all_pairs, (direction, src_text, tgt_text)
    assert en in pairs  # the English side really is English
  if pack:
    assert (batch['src_segment_ids'].max(axis=1) > 1).any()


def test_translation_needs_a_direction(prepared):
  tok = prepared['ding'].tokenizer
  for bad in (None, 'en-fr', 'ende'):
    with pytest.raises(ValueError, match='direction'):
      data.make_iterator(ding_cfg(prepared, bad), 'train', tok, batch_size=2,
                         seq_len=T, process_index=0, process_count=1)


@pytest.mark.parametrize('process_count', [1, 3])
def test_translation_eval_sees_every_pair_once(prepared, process_count):
  tok = prepared['ding'].tokenizer
  source = datasets.load_source('ding_en_de', 'validation', prepared['dir'])
  expected = sorted((datasets.as_text(source[i]['en']),
                     datasets.as_text(source[i]['de']))
                    for i in range(len(source)))
  got, counts = [], []
  for host in range(process_count):
    batches = list(data.make_iterator(
        ding_cfg(prepared, pack=True), 'validation', tok,
        batch_size=2 * process_count, seq_len=T, shuffle=False, num_epochs=1,
        process_index=host, process_count=process_count, num_threads=1))
    counts.append(len(batches))
    for b in batches:
      # Evaluation never packs: one pair (or padding) per row.
      assert b['src_segment_ids'].max() <= 1
      for s, t in zip(segments(b['src'], b['src_segment_ids']),
                      segments(b['tgt_out'], b['tgt_segment_ids'])):
        got.append((tok.decode(s), tok.decode(t)))
  assert len(set(counts)) == 1
  assert sorted(got) == expected


def test_same_seed_same_batches(prepared):
  tok = prepared['ding'].tokenizer

  def first(seed):
    return take(data.make_iterator(
        ding_cfg(prepared, pack=True), 'train', tok, batch_size=4, seq_len=T,
        seed=seed, process_index=0, process_count=1, num_threads=2), 3)

  assert_same(first(3), first(3))
  with pytest.raises(AssertionError):
    assert_same(first(3), first(4))


@pytest.mark.parametrize('name,pack', [('shakespeare', False),
                                       ('ding_en_de', False),
                                       ('ding_en_de', True)])
def test_restored_iterator_continues_exactly(prepared, name, pack):
  if name == 'shakespeare':
    cfg, tok = lm_cfg(prepared), prepared['shakespeare'].tokenizer
  else:
    cfg, tok = ding_cfg(prepared, pack=pack), prepared['ding'].tokenizer

  def make():
    return data.make_iterator(cfg, 'train', tok, batch_size=8, seq_len=T,
                              seed=7, process_index=0, process_count=1,
                              num_threads=2)

  # Enough steps to cross an epoch boundary of the small fixture split.
  it = make()
  take(it, 11)
  state = it.get_state()
  expected = take(it, 30)
  restored = make()
  restored.set_state(json.loads(json.dumps(state)))  # as a checkpoint would
  assert_same(take(restored, 30), expected)


def test_local_batch_is_global_over_processes(prepared):
  tok = prepared['ding'].tokenizer
  it = data.make_iterator(ding_cfg(prepared), 'train', tok, batch_size=8,
                          seq_len=T, process_index=1, process_count=2,
                          num_threads=1)
  assert next(it)['src'].shape == (4, T)
  with pytest.raises(ValueError, match='divisible'):
    data.make_iterator(ding_cfg(prepared), 'train', tok, batch_size=9,
                       seq_len=T, process_index=0, process_count=2)


def test_hosts_read_disjoint_examples(prepared):
  tok = prepared['ding'].tokenizer
  seen = []
  for host in range(2):
    batches = list(data.make_iterator(
        ding_cfg(prepared), 'train', tok, batch_size=8, seq_len=64,
        shuffle=True, num_epochs=1, process_index=host, process_count=2,
        num_threads=1))
    seen.append({(tok.decode(s), tok.decode(t)) for b in batches
                 for s, t in zip(segments(b['src'], b['src_segment_ids']),
                                 segments(b['tgt_out'],
                                          b['tgt_segment_ids']))})
  assert seen[0] and seen[1] and not seen[0] & seen[1]
  n_train = prepared['ding'].num_examples['train']
  assert len(seen[0]) + len(seen[1]) == n_train


def test_global_batch_assembles_sharded_arrays():
  devices = np.array(jax.devices())
  mesh = Mesh(devices.reshape(len(devices), 1, 1), ('data', 'fsdp', 'tensor'))
  b = 2 * len(devices)
  local = {'inputs': np.arange(b * 5, dtype=np.int32).reshape(b, 5),
           'segment_ids': np.ones((b, 5), np.int32)}
  out = data.global_batch(local, mesh)
  assert out['inputs'].shape == (b * jax.process_count(), 5)
  np.testing.assert_array_equal(np.asarray(out['inputs']), local['inputs'])
  assert out['inputs'].sharding.spec == PartitionSpec(('data', 'fsdp'))
  # Each device holds its rows only.
  shard = out['inputs'].addressable_shards[0]
  assert shard.data.shape == (2, 5)


def test_prepare_again_reuses_everything(prepared):
  first = prepared['ding']
  model_file = os.path.join(first.tokenizer_dir, 'spm.model')
  mtime = os.stat(model_file).st_mtime_ns
  again = data.prepare('ding_en_de', prepared['dir'], vocab_size=500,
                       model_type='bpe')
  assert os.stat(model_file).st_mtime_ns == mtime  # not retrained
  assert again.tokenizer.model_proto == first.tokenizer.model_proto
  assert again.num_examples == first.num_examples
  assert sum(first.num_examples.values()) == len(
      data_testing.fake_ding_pairs())
  # The saved tokenizer restores the same encoder.
  restored = data.load_tokenizer(first.tokenizer_dir)
  assert restored.encode('The cat sleeps.') == first.tokenizer.encode(
      'The cat sleeps.')


def test_data_config_of_a_name_a_dict_or_a_config_dict():
  cfg = ml_collections.ConfigDict({'name': 'ding_en_de', 'direction': 'de-en',
                                   'pack': True})
  dc = data.DataConfig.of(cfg)
  assert (dc.name, dc.direction, dc.pack, dc.src_len) == (
      'ding_en_de', 'de-en', True, None)
  assert data.DataConfig.of(cfg.to_dict()) == dc
  with pytest.raises(ValueError, match="config.data has no field 'batch_s"):
    data.DataConfig.of({'name': 'lm1b', 'batch_size': 32})
  assert data.DataConfig.of('lm1b') == data.DataConfig(name='lm1b')
  with pytest.raises(ValueError, match='Unknown dataset'):
    data.get_spec('nope')
