"""The paper-base forward's matrix products alone: XLA:CPU's float32 dot
against PyTorch's, interleaved in one process, at each shape the forward
of the ``cpu`` suite multiplies (8 rows of 64 source and 64 target tokens:
512 token rows a side).

Where that forward loses to PyTorch on a CPU (docs/performance.md), this
says how much of it the dots explain: a row per shape, and one for all of
them weighted by how often the forward runs each (``forward_dots``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jax_transformer.bench import step, timing

# The cpu suite's paper-base case: its batch's rows and lengths (source
# and target alike), and the token rows of each side.
CASE = step.base_case()
ROWS, LENGTH = CASE['batch'], CASE['tgt_len']
TOKENS = ROWS * LENGTH


def shapes() -> list[tuple[str, tuple[int, ...], tuple[int, ...], int]]:
  """(what, left shape, right shape, times one forward runs it) of the
  paper-base forward's dots: projections of 6 encoder and 6 decoder layers
  (self-attention 4 each, cross-attention 4), their feed-forwards, the
  logits, and per-head attention scores and sums (18 attentions)."""
  c = CASE['config']
  d, f, v, h = c.d_model, c.d_ff, c.vocab_size, c.num_heads
  layers = c.num_encoder_layers + c.num_decoder_layers
  heads = (ROWS * h, LENGTH, d // h)
  return [
      ('attention projections', (TOKENS, d), (d, d),
       4 * layers + 4 * c.num_decoder_layers),
      ('feed-forward in', (TOKENS, d), (d, f), layers),
      ('feed-forward out', (TOKENS, f), (f, d), layers),
      ('logits', (TOKENS, d), (d, v), 1),
      ('attention scores', heads, (ROWS * h, d // h, LENGTH),
       layers + c.num_decoder_layers),
      ('attention sums', (ROWS * h, LENGTH, LENGTH), heads,
       layers + c.num_decoder_layers),
  ]


def _flop(left, right) -> float:
  return 2.0 * np.prod(left) * right[-1]


# Dots a timing runs, so that a call's dispatch (tens of microseconds in
# JAX) does not count: the forward's dots run inside one program.
REPEATS = 16


def _contenders(left, right) -> dict[str, Callable[[], Any]]:
  """REPEATS dots each side (JAX's in one program), summed, blocking
  until the sum exists."""
  import torch  # noqa: PLC0415 (the test extra)
  rs = np.random.RandomState(0)
  a = rs.randn(*left).astype(np.float32)
  b = rs.randn(*right).astype(np.float32)

  @jax.jit
  def dots(a, b):
    # Each dot's left side is scaled by its index, so none can be hoisted
    # out of the loop; the scaling and the sum are elementwise, next to
    # nothing against the dot.
    def body(i, total):
      return total + jnp.matmul(a * (1.0 + 1e-7 * i), b)
    return jax.lax.fori_loop(0, REPEATS, body,
                             jnp.zeros((*left[:-1], right[-1])))
  ja, jb = jnp.asarray(a), jnp.asarray(b)
  ta, tb = torch.from_numpy(a), torch.from_numpy(b)

  def torch_dots():
    total = torch.zeros((*left[:-1], right[-1]))
    for i in range(REPEATS):
      total = total + torch.matmul(ta * (1.0 + 1e-7 * i), tb)
    return total
  return {'jax': lambda: dots(ja, jb).block_until_ready(),
          'torch': torch_dots}


def run(rounds: int) -> list[dict[str, Any]]:
  """A row per shape and one for the forward's dots together."""
  import torch  # noqa: PLC0415
  torch.set_num_threads(len(os.sched_getaffinity(0)))
  rows, total = [], {'jax': [0.0] * rounds, 'torch': [0.0] * rounds}
  for what, left, right, count in shapes():
    contenders = _contenders(left, right)
    ours, theirs = (np.asarray(f()) for f in contenders.values())
    if not np.allclose(ours, theirs, rtol=1e-4, atol=1e-3):
      raise AssertionError(f'{what}: the two sides multiply differently; '
                           'the timings would compare different work.')
    times = timing.interleave(contenders, rounds)
    for side in total:
      total[side] = [t + count * s / REPEATS
                     for t, s in zip(total[side], times[side])]
    row = dict(suite='matmul', model='transformer_base',
               shape='x'.join(map(str, (*left, right[-1]))), what=what,
               count=count, **timing.summary(times, 'jax', 'torch'))
    for side in ('jax', 'torch'):
      row[f'{side}_s'] /= REPEATS  # one dot's
      row[f'{side}_gflop_s'] = _flop(left, right) / row[f'{side}_s'] / 1e9
    rows.append(row)
  rows.append(dict(suite='matmul', model='transformer_base',
                   shape='forward_dots', what='every dot of one forward',
                   **timing.summary(total, 'jax', 'torch')))
  return rows
