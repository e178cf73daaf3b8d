"""The data pre-flight (data/preflight.py): before the first step, what the
training split gives at the run's rows (kept, cut, dropped, loss tokens per
batch); a refusal in one sentence where nothing trains; a warning where
much is lost; and an iterator that stops, rather than reads forever, when a
whole pass of its data is dropped."""

import gc
import json
import os
import signal
import subprocess
import sys
import time

import grain
import numpy as np
import pytest
import repo

from jax_transformer import data
from jax_transformer.cli import load_config
from jax_transformer.data import batching, preflight
from jax_transformer.errors import UsageError
from jax_transformer.experiment import Experiment
from jax_transformer.runtime import exits, faults
from jax_transformer.train import preemption, trainer

WORDS = 'the cat dog sat on a mat big red sun run fun day way'.split()


def sentence(rng, n):
  """A text of exactly n bytes (n >= 4), words and a full stop."""
  text = ''
  while len(text) < n:
    text += rng.choice(WORDS) + ' '
  return text[:n - 1].rstrip().ljust(n - 1, 'x') + '.'


def write_pairs(path, n, low, high, seed=0):
  """n tab-separated pairs, each side low..high bytes."""
  rng = np.random.default_rng(seed)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(''.join(
      f'{sentence(rng, rng.integers(low, high + 1))}\t'
      f'{sentence(rng, rng.integers(low, high + 1))}\n' for _ in range(n)))


def translation_config(tmp_path, files, seq_len=24, pack=False):
  cfg = load_config('translate_ende:tiny')
  cfg.data.update(name='files', train_files=str(files), direction='en-fr',
                  tokenizer='byte', vocab_size=None,
                  data_dir=str(tmp_path / 'tfds'), pack=pack)
  cfg.seq_len = cfg.data.src_len = seq_len
  return cfg


def preflight_of(cfg):
  prepared = data.prepare_for(cfg.data, seq_len=cfg.seq_len)
  report, = data.training_preflight(Experiment.of(cfg).train_batches,
                                     prepared.tokenizer)
  return report, prepared


def test_every_pair_too_long_is_refused_in_one_sentence(tmp_path):
  # The hang of issue 38: 400 pairs of 25-28 bytes, rows of 24 bytes.
  write_pairs(tmp_path / 'pairs' / 'a.tsv', 400, 25, 28)
  cfg = translation_config(tmp_path, tmp_path / 'pairs' / '*.tsv')
  report, _ = preflight_of(cfg)
  assert report.line().startswith(
      'Data (train): 391 pairs read, 0 kept, 0 cut, 391 dropped (longer '
      'than data.src_len 24 or seq_len 24 with EOS); about 0 loss tokens')
  with pytest.raises(UsageError) as refused:
    report.check()
  message = str(refused.value)
  assert '\n' not in message
  assert message.startswith('Every one of the 391 pairs in train is longer '
                            'than its rows, so no batch can be made: en + '
                            'EOS is p50 '), message
  assert 'max 29 tokens for data.src_len 24 (391 too long)' in message
  assert 'fr + EOS is p50' in message and 'tokens for seq_len 24' in message
  assert message.endswith('raise --config.data.src_len to 29 and '
                          '--config.seq_len to 29 to keep every pair.')
  assert report.warning() is None  # the refusal says it all


def test_prepare_data_warns_where_the_lengths_exceed_the_runs_rows(
    tmp_path, capsys):
  import prepare_data
  write_pairs(tmp_path / 'pairs' / 'a.tsv', 400, 25, 28)
  rc = prepare_data.main([
      '--config', 'translate_ende:tiny', '--config.data.name=files',
      f'--config.data.files.train={tmp_path / "pairs"}/*.tsv',
      '--config.data.direction=en-fr', '--config.data.tokenizer=byte',
      '--config.data.vocab_size=0', '--num_examples', '0',
      f'--config.data.data_dir={tmp_path / "tfds"}'])
  out = capsys.readouterr().out.splitlines()
  assert rc == 0
  lengths = out.index(next(line for line in out
                           if line.startswith('train tokens per example: ')))
  assert out[lengths + 1].startswith(
      "at the run's rows: Data (train): 391 pairs read, 0 kept, 0 cut, 391 "
      'dropped (longer than data.src_len 24 or seq_len 24 with EOS)')
  assert out[lengths + 2].startswith(
      'Warning: train.py with these flags would refuse: Every one of the 391 '
      'pairs in train is longer than its rows')


def test_an_iterator_whose_whole_pass_is_dropped_stops_with_the_refusal(
    tmp_path):
  write_pairs(tmp_path / 'pairs' / 'a.tsv', 400, 25, 28)
  cfg = translation_config(tmp_path, tmp_path / 'pairs' / '*.tsv')
  prepared = data.prepare_for(cfg.data, seq_len=cfg.seq_len)
  it = data.train_iterator(Experiment.of(cfg).train_batches,
                           prepared.tokenizer, process_index=0,
                           process_count=1)
  try:
    with pytest.raises(UsageError, match=r'^Every one of a whole pass of '
                       r'the 391 pairs of train is longer than its rows, so '
                       r'no batch can be made: en \+ EOS is p50 \d+, p95 '
                       r'\d+, max 29 tokens for data.src_len 24 \(391 too '
                       r'long\)'):
      next(it)
  finally:
    it.close()


def test_the_guard_waits_for_two_passes_and_no_more():
  # One example in 50 fits; shuffled differently every pass, two kept ones
  # can be nearly two passes apart, never more.
  seqs = [[5] * (3 if i == 17 else 20) for i in range(50)]
  layout = batching.lm_layout(8)
  def fit(ex):
    return ex if batching.fits(ex, layout) else batching.dropped(ex, layout)
  examples = (grain.MapDataset.source(seqs).map(batching.lm_example)
              .shuffle(seed=1).repeat(None).map(fit))
  here = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  it = iter(batching.pack_and_batch(examples, layout, 2, pack=False,
                                    chunk_size=7, pass_length=50,
                                    read_options=here))
  for _ in range(8):
    assert (next(it)['segment_ids'] > 0).sum() == 8
  dropped = grain.MapDataset.source(seqs[:16]).map(batching.lm_example)
  dropped = dropped.repeat(None).map(fit)
  it = iter(batching.pack_and_batch(dropped, layout, 2, pack=False,
                                    chunk_size=7, pass_length=16,
                                    read_options=here))
  with pytest.raises(UsageError, match='No example of a whole pass'):
    next(it)


@pytest.mark.parametrize('pack', [False, True])
def test_the_line_counts_what_training_keeps_and_its_loss_tokens(
    tmp_path, pack):
  # 10% of the pairs are too long for rows of 24: a warning with the count.
  # (The last 2 pairs, in file order, are held out for evaluation.)
  write_pairs(tmp_path / 'pairs' / 'a.tsv', 17, 26, 30, seed=2)
  write_pairs(tmp_path / 'pairs' / 'b.tsv', 150, 6, 20, seed=1)
  cfg = translation_config(tmp_path, tmp_path / 'pairs' / '*.tsv', pack=pack)
  report, prepared = preflight_of(cfg)
  report.check()
  assert (report.read, report.kept, report.dropped) == (164, 147, 17)
  assert ' 164 pairs read, 147 kept, 0 cut, 17 dropped ' in report.line()
  warning = report.warning()
  assert warning.startswith('Warning: 17 of the 164 pairs in train (10%) are '
                            'longer than their rows and dropped: en + EOS is '
                            'p50 '), warning
  assert warning.endswith('raise --config.data.src_len to 31 and '
                          '--config.seq_len to 31 to keep every pair.')
  # The estimate is what the batches hold.
  it = data.train_iterator(Experiment.of(cfg).train_batches,
                           prepared.tokenizer, process_index=0,
                           process_count=1)
  try:
    held = np.mean([(next(it)['tgt_segment_ids'] > 0).sum()
                    for _ in range(60)])
  finally:
    it.close()
  assert report.loss_tokens == pytest.approx(held, rel=0.08)
  assert f'about {report.loss_tokens:,.0f} loss tokens per batch of 8 x 24' \
      in report.line()


def test_cut_chat_records_are_counted_and_warned_about(tmp_path):
  # A quarter of the completions run past seq_len: cut, losing their EOS.
  rng = np.random.default_rng(3)
  records = []
  for i in range(80):
    completion = sentence(rng, 40 if i % 4 == 0 else 8)
    records.append({'messages': [
        {'role': 'user', 'content': f'Say {i}.'},
        {'role': 'assistant', 'content': completion}]})
  path = tmp_path / 'chat.jsonl'
  path.write_text(''.join(json.dumps(r) + '\n' for r in records))
  cfg = load_config('lm_shakespeare:tiny')
  cfg.data.update(name='files', train_files=str(path),
                  direction='prompt-completion', lm_mode='examples',
                  data_dir=str(tmp_path / 'tfds'))
  prepared = data.prepare_for(cfg.data)
  # The fixed chat template's prompt (data/chat.py), BOS left out.
  prompt = len(data.chat.prompt_ids(prepared.tokenizer,
                                    records[0]['messages'][:-1])) - 1
  cfg.seq_len = prompt + 20
  report, = data.training_preflight(Experiment.of(cfg).train_batches,
                                     prepared.tokenizer)
  report.check()
  assert (report.read, report.cut, report.dropped) == (79, 20, 0)
  assert ' 79 records read, 59 kept, 20 cut (longer than seq_len ' \
      in report.line()
  assert report.warning().startswith(
      'Warning: 20 of the 79 records in train (25%) are longer than their '
      'rows and cut, losing the end of their completion and its EOS: '
      'prompt + completion + EOS is p50 ')
  # Rows too short for any completion: nothing would train.
  cfg.seq_len = prompt - 2
  report, = data.training_preflight(Experiment.of(cfg).train_batches,
                                     prepared.tokenizer)
  assert 'with nothing of the completion left' in report.line()
  with pytest.raises(UsageError, match=r'^No record of the 79 records in '
                     r'train keeps a token of its completion within its '
                     r'rows, so nothing would train: .*raise --config.seq_len'
                     r' to \d+ to keep every record\.$'):
    report.check()


def test_a_large_split_is_sampled_and_says_so():
  rows = preflight.Rows('document', (preflight.Side(
      'text', ('text',), 1, 16, 'seq_len'),), drops=False, loss_side=0,
                        untrained=None, layout=batching.lm_layout(16),
                        batch_size=4, pack=False)

  class Store:
    def __len__(self):
      return 50_000

    def offsets(self, feature):
      del feature
      return np.arange(50_001) * 10  # every document 10 tokens

  report = preflight.measure(rows, Store(), 'train', sample=1000)
  assert report.line().startswith(
      'Data (train, a sample of 1,000 of 50,000): 1,000 documents read, '
      '1,000 kept, 0 cut (longer than seq_len 16 with EOS), 0 dropped; '
      'about 44 loss tokens per batch of 4 x 16 (69% of the rows).')
  assert report.warning() is None


def train_py(tmp_path, *flags, env=None):
  """train.py on translate_ende:tiny over the pairs in tmp_path/pairs, byte
  tokens, rows of 24 (the command of issue 38); (status, stdout, stderr,
  seconds)."""
  cmd = [sys.executable, os.path.join(repo.ROOT, 'train.py'), '--config',
         'translate_ende:tiny', '--workdir', str(tmp_path / 'run'),
         '--config.data.name=files', '--config.data.train_files=pairs/*.tsv',
         '--config.data.direction=en-fr', '--config.num_steps=20',
         '--config.data.tokenizer=byte', '--config.data.vocab_size=0',
         '--config.data.data_dir=tfds', '--config.sample.enabled=False',
         *flags]
  start = time.monotonic()
  proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True,
                        timeout=300, env=dict(
                            os.environ, JAX_PLATFORMS='cpu', **(env or {})))
  return (proc.returncode, proc.stdout, proc.stderr,
          time.monotonic() - start)


def test_train_py_refuses_a_run_whose_every_pair_is_dropped(tmp_path):
  # Issue 38: this run looped forever in PackIterator._peek at train: 0/20.
  write_pairs(tmp_path / 'pairs' / 'a.tsv', 400, 25, 28)
  status, out, err, seconds = train_py(tmp_path,
                                       '--config.step_timeout_s=60')
  assert status == 2, (out[-2000:], err[-2000:])
  # Above it on stderr: TFDS's progress bars as it prepares the pairs.
  assert 'Traceback' not in err and 'Thread 0x' not in err, err
  err = err.strip().splitlines()[-1]
  assert err.startswith('train.py: error: Every one of the 391 pairs in train '
                        'is longer than its rows, so no batch can be made: ')
  assert 'for data.src_len 24' in err and 'for seq_len 24' in err
  assert 'raise --config.data.src_len to 29 and --config.seq_len to 29' in err
  assert ('Data (train): 391 pairs read, 0 kept, 0 cut, 391 dropped (longer '
          'than data.src_len 24 or seq_len 24 with EOS)') in out
  assert seconds < 60  # seconds here, where it hung at step 0 before
  # Nothing a rerun with longer rows would have to match.
  assert not (tmp_path / 'run' / 'config.json').exists()


def test_a_stop_signal_while_preparing_is_one_line_and_75(tmp_path):
  write_pairs(tmp_path / 'pairs' / 'a.tsv', 40, 5, 12)
  status, out, err, _ = train_py(tmp_path,
                                 env={faults.ENV: 'SIGINT@prepare:0'})
  assert status == exits.EXIT_INTERRUPTED == 75, (out[-2000:], err[-2000:])
  assert err == ('train.py: SIGINT while preparing the data and the model, '
                 'before the first step: stopped with nothing new to save; '
                 'rerun to go on.\n')


def test_a_stop_signal_while_the_first_batch_is_read_stops_at_once(
    tmp_path, monkeypatch):
  # A first batch may never come (or come late): the stop does not wait
  # for it, nor for a first step to save.
  write_pairs(tmp_path / 'pairs' / 'a.tsv', 40, 5, 12)
  cfg = translation_config(tmp_path, tmp_path / 'pairs' / '*.tsv')
  cfg.sample.enabled = False
  before = signal.getsignal(signal.SIGTERM)
  monkeypatch.setattr(faults, '_planned', faults.parse('SIGTERM@data:1'))
  with pytest.raises(preemption.StoppedBeforeFirstStep, match=(
      '^SIGTERM while reading the first batch, before the first step: ')):
    trainer.train_and_evaluate(cfg, str(tmp_path / 'run'))
  assert not (tmp_path / 'run' / 'checkpoints' / '1').exists()
  assert signal.getsignal(signal.SIGTERM) is before


def test_a_stop_raised_where_python_ignores_it_is_raised_next():
  # A signal's handler runs in whatever the main thread runs, JAX's
  # garbage-collector callback included, where Python prints and drops an
  # exception: the stop is signalled again rather than lost.
  stop = preemption.Preemption()
  sent = []

  def callback(phase, info):
    del info
    if phase == 'start' and not sent:
      sent.append(os.kill(os.getpid(), signal.SIGINT))
      sum(range(1000))  # the handler runs (and raises) in here

  gc.callbacks.append(callback)
  try:
    with pytest.raises(preemption.StoppedBeforeFirstStep):
      gc.collect()
      assert stop.requested == 'SIGINT'
      deadline = time.monotonic() + 5
      while time.monotonic() < deadline:
        time.sleep(0.001)
  finally:
    gc.callbacks.remove(callback)
    stop.restore()
