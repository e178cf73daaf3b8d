"""The input pipeline's sustained supply against what accelerators demand.

Two data shapes, each through the trainer's own pipeline
(``data.make_iterator``: token store, shuffle, filter, pack, batch):

- WMT14 en-de for the base translation model: a store of 1M sentence
  pairs of 8-60 tokens a side, packed into 128 rows of 256 tokens;
- lm1b for ``gpt2_small``: a store of 1M sentences of 5-50 tokens, packed
  into 64 rows of 1024 tokens.

The stores are synthetic (random ids of real-looking lengths, written
once to a temporary folder), which costs the pipeline what a prepared split
costs it: training reads token ids, never text. Each shape is timed with
the batches made in this process and by worker processes, in interleaved
rounds; its best median supply (target tokens per second) is set against
the demand of one chip training the model at 40% MFU (H200 and TPU v5p,
bf16 dense peaks).
"""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np

from jax_transformer import data
from jax_transformer.data import token_store
from jax_transformer.experiment import doors
from jax_transformer.model.config import transformer_base
from jax_transformer.train import perf

PEAKS = {'NVIDIA H200': 989e12, 'TPU v5p': 459e12}
MFU = 0.4
EXAMPLES = 1_000_000


def shapes() -> dict[str, dict]:
  """Per model: its dataset, pipeline config, batch shape and model."""
  gpt2 = doors.load('gpt2_small')
  return {
      'transformer_base': dict(
          dataset='wmt14_translate/de-en', features=('en', 'de'),
          cfg={'direction': 'en-de', 'pack': True}, lengths=(8, 60),
          batch=128, seq=256, model=transformer_base(), src_len=256),
      'gpt2_small': dict(
          dataset='lm1b', features=('text',), cfg={'pack': True},
          lengths=(5, 50), batch=gpt2.batch_size, seq=gpt2.seq_len,
          model=gpt2.model_config(32768), src_len=0),
  }


def write_store(data_dir: str, shape: dict, tokenizer,
                examples: int = EXAMPLES) -> None:
  """A synthetic train split of that many examples, as prepare writes one."""
  rng = np.random.default_rng(0)
  arrays = {}
  for feature in shape['features']:
    low, high = shape['lengths']
    lengths = rng.integers(low, high + 1, examples)
    offsets = np.zeros(examples + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ids = rng.integers(4, tokenizer.vocab_size, int(offsets[-1]),
                       dtype=np.int32)
    arrays[feature] = (ids, offsets)
  token_store.write(token_store.store_dir(data_dir, shape['dataset'],
                                          'train', tokenizer), arrays)


def supply(data_dir: str, shape: dict, tokenizer, workers: int,
           seconds: float) -> float:
  """Target tokens per second the pipeline sustains, after a warm-up."""
  cfg = {'name': shape['dataset'], 'data_dir': data_dir, **shape['cfg']}
  it = data.make_iterator(cfg, 'train', tokenizer, batch_size=shape['batch'],
                          seq_len=shape['seq'], seed=0, worker_count=workers,
                          worker_buffer_size=4)
  key = 'tgt_segment_ids' if 'en' in shape['features'] else 'segment_ids'
  try:
    for _ in range(3 + 2 * workers):  # threads and workers started
      next(it)
    start, tokens = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
      tokens += int((next(it)[key] > 0).sum())
    return tokens / (time.perf_counter() - start)
  finally:
    it.close()


def demand(shape: dict, peak: float) -> float:
  """Target tokens per second one chip of peak FLOP/s trains at MFU."""
  flops = perf.step_flops(shape['model'], shape['batch'], shape['src_len'],
                          shape['seq'])['train']
  return MFU * peak / flops * shape['batch'] * shape['seq']


def run(seconds: float = 4.0, worker_counts=(0, 1, 2),
        examples: int = EXAMPLES, rounds: int = 5) -> list[dict]:
  """A row per model and device: the median supply over ``rounds``
  windows of ``seconds`` (the worker counts interleaved in each round) of
  the worker count with the best median, against the device's demand."""
  tokenizer = data.ByteTokenizer()
  cores = os.cpu_count()
  rows = []
  with tempfile.TemporaryDirectory() as data_dir:
    for model, shape in shapes().items():
      write_store(data_dir, shape, tokenizer, examples)
      windows = {w: [] for w in worker_counts}
      for _ in range(rounds):
        for w in worker_counts:
          windows[w].append(supply(data_dir, shape, tokenizer, w, seconds))
      measured = {w: float(np.median(v)) for w, v in windows.items()}
      workers = max(measured, key=measured.get)
      best = measured[workers]
      for device, peak in PEAKS.items():
        need = demand(shape, peak)
        rows.append(dict(
            suite='pipeline', model=model, device=device,
            supply_tokens_per_s=best, demand_tokens_per_s=need,
            ratio=best / need, ratio_min=min(windows[workers]) / need,
            ratio_max=max(windows[workers]) / need, rounds=rounds,
            cores=cores,
            tokens_per_s_per_core=best / cores,
            cores_needed=need / (best / cores), worker_count=workers,
            supply_by_worker_count={str(w): s for w, s in measured.items()},
            batch=shape['batch'], seq=shape['seq'],
            demand_assumes=f'{MFU:.0%} MFU of {peak / 1e12:.0f} TFLOP/s'))
  return rows
