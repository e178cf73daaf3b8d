"""The input pipeline's sustained rate on a WMT-sized split, against demand.

A stand-in for WMT14 en-de (4.5 million sentence pairs, read lazily by
index, as a split over ``cache_limit`` examples is) feeds the trainer's own
pipeline (``data.make_iterator``: tokenize, filter, pack, batch) with the
base config's batch shape (128 packed rows of 256 tokens). The rate is
timed after a warm-up, and set against what one accelerator consumes: the
base model's target tokens per second at a given MFU of the chip's peak.

The stand-in's records are generated, not decoded from disk, so the rate is
an upper bound for a real split (decoding a TFDS record costs ~0.2 ms).
"""

from __future__ import annotations

import time

import numpy as np

from jax_transformer import data
from jax_transformer.model.config import transformer_base
from jax_transformer.train import perf

_WORDS = ('the', 'house', 'of', 'commons', 'agreed', 'on', 'a', 'new',
          'budget', 'for', 'european', 'research', 'and', 'the', 'council',
          'said', 'that', 'this', 'year', 'was', 'difficult', 'for', 'all')


class MockTranslationSplit:
  """``n`` (en, de) pairs of 8-40 words, looked up by index.

  The texts come from a pool made once, so reading a record costs next to
  nothing and the rate measured is the pipeline's own (a real split adds
  the decoding of its records).
  """

  def __init__(self, n: int = 4_500_000, pool: int = 4096):
    self.n = n
    rs = np.random.default_rng(0)
    self._pool = []
    for _ in range(pool):
      words = rs.choice(len(_WORDS), rs.integers(8, 40))
      en = ' '.join(_WORDS[w] for w in words) + '.'
      self._pool.append({'en': en, 'de': en[::-1]})

  def __len__(self) -> int:
    return self.n

  def __getitem__(self, i: int) -> dict[str, str]:
    # A multiplicative hash spreads neighbouring indices over the pool.
    return self._pool[(int(i) * 2654435761) % len(self._pool)]


def demand_tokens_per_s(mfu: float = 0.4, peak: float = 989e12,
                        batch: int = 96, seq: int = 256) -> float:
  """Target tokens per second the base model trains at ``mfu`` of ``peak``
  (source and target rows of ``seq`` tokens)."""
  flops = perf.step_flops(transformer_base(), batch, seq, seq)['train']
  return mfu * peak / flops * batch * seq


def run(seconds: float = 20.0, batch: int = 128, seq: int = 256,
        num_threads: int = 4) -> list[dict]:
  cfg = {'name': 'wmt14_translate/de-en', 'direction': 'en-de',
         'pack': True}
  source = MockTranslationSplit()
  it = data.make_iterator(cfg, 'train', data.ByteTokenizer(),
                          batch_size=batch, seq_len=seq, seed=0,
                          num_threads=num_threads, source=source)
  next(it)  # warm-up: threads started, first chunks read
  start, batches, tokens, pairs = time.perf_counter(), 0, 0, 0
  while time.perf_counter() - start < seconds:
    b = next(it)
    batches += 1
    tokens += int((b['tgt_segment_ids'] > 0).sum())
    pairs += int(b['tgt_segment_ids'].max(axis=1).sum())  # segments 1..k
  elapsed = time.perf_counter() - start
  supply = tokens / elapsed
  demand = demand_tokens_per_s()
  return [dict(suite='pipeline', split_examples=len(source), batch=batch,
               seq=seq, num_threads=num_threads,
               batches_per_s=batches / elapsed,
               target_tokens_per_s=supply, pairs_per_s=pairs / elapsed,
               demand_target_tokens_per_s=demand,
               demand_assumes='base model, 40% MFU of 989 TFLOP/s',
               supply_over_demand=supply / demand)]
