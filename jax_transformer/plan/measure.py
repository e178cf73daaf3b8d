"""Measured step times of planned layouts on the devices at hand: how the
step-time model is checked (``scripts/benchmark.py --suite plan``, on CPU
host devices or on a GPU or TPU).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import numpy as np

from jax_transformer.compile import lowering
from jax_transformer.experiment import Experiment, doors
from jax_transformer.plan import candidates as cands
from jax_transformer.plan import search


def step_runner(cfg: Experiment, devices: list,
                vocab_size: int) -> Callable[[], None]:
  """A function running cfg's train step once on devices (compiled here,
  state initialised from cfg's seed, one fixed batch of random tokens)."""
  run = lowering.lower_here(cfg, vocab_size, devices)
  compiled = run.lowered.compile()
  state = jax.jit(lambda: run.setup.init_state(cfg.seed),
                  out_shardings=run.shardings)()
  rng = np.random.default_rng(cfg.seed)
  batch = {}
  for key, spec in run.batch.items():
    if 'segment' in key:
      values = np.ones(spec.shape, np.int32)
    elif 'position' in key:
      values = np.broadcast_to(np.arange(spec.shape[1], dtype=np.int32),
                               spec.shape)
    else:
      values = rng.integers(1, vocab_size, spec.shape, dtype=np.int32)
    batch[key] = jax.device_put(values, spec.sharding)
  holder = [state]

  def step():
    holder[0], metrics = compiled(holder[0], batch)
    jax.block_until_ready(metrics)
  return step


def measure(base: Experiment,
            layouts: list[cands.Candidate], devices: list, vocab_size: int,
            rounds: int = 5, warmup: int = 1) -> list[float]:
  """Median seconds per optimizer update of each layout (its step time x
  grad_accum_steps), in rounds interleaved over the layouts so that the
  host's load falls on all alike."""
  runners = [step_runner(c.apply(base), devices, vocab_size)
             for c in layouts]
  for run in runners:
    for _ in range(warmup):
      run()
  times = [[] for _ in runners]
  for _ in range(rounds):
    for i, run in enumerate(runners):
      start = time.perf_counter()
      run()
      times[i].append(time.perf_counter() - start)
  return [float(np.median(t)) * c.grad_accum_steps
          for t, c in zip(times, layouts)]


def spearman(a: list[float], b: list[float]) -> float:
  """Spearman's rank correlation of two equally long lists (no ties)."""
  ra = np.argsort(np.argsort(a))
  rb = np.argsort(np.argsort(b))
  return float(np.corrcoef(ra, rb)[0, 1])



def compare(base: Experiment, layouts: list[cands.Candidate],
            where, vocab_size: int, rounds: int = 5) -> list[dict]:
  """Each layout planned on ``where`` (the devices at hand) and measured
  there: its plan row with measured_step_s and the ratio of prediction to
  measurement added, in the order of layouts."""
  base = layouts[0].apply(base)  # the first is the plan's own layout
  rows = search.plan(base, 'compare', where, layouts[0].batch_size
                     * layouts[0].grad_accum_steps, budget_s=float('inf'),
                     cache_dir=None, vocab_size=vocab_size, only=layouts,
                     log=lambda _: None)
  by_layout = {r['layout']: r for r in rows}
  measured = measure(base, layouts, list(where.devices), vocab_size, rounds)
  out = []
  for c, seconds in zip(layouts, measured):
    row = dict(by_layout[c.describe()], measured_step_s=seconds)
    row['predicted_over_measured'] = row['predicted_step_s'] / seconds
    out.append(row)
  return out


@dataclasses.dataclass(frozen=True)
class HostSize:
  """A decoder LM the step model is checked on with CPU host devices (a
  512-token vocabulary), and the rows of one optimizer update."""
  layers: int
  width: int
  heads: int
  seq_len: int
  rows: int


# From tiny to gpt2_small's width and heads (768, 12) at 4 of its 12
# layers, each small enough to measure on 8 host devices of a 2-core,
# 24 GB machine: the suite holds every layout's state at once (rounds
# interleave), and 12 layers' Adam states replicated 8 ways by three of
# the layouts come to about 37 GB.
HOST_SIZES = {'tiny': HostSize(2, 128, 8, 64, 32),
              'small': HostSize(4, 256, 8, 128, 32),
              'gpt2_small_4l': HostSize(4, 768, 12, 128, 8)}


def host_check_config(size: str = 'small') -> Experiment:
  """The LM of ``HOST_SIZES[size]`` (d_ff 4 x width) on 8 host devices;
  'small' is 4 layers of width 256, 8 heads, 128-token rows."""
  s = HOST_SIZES[size]
  return doors.load('lm_shakespeare').replace(**{
      'model.d_model': s.width, 'model.num_heads': s.heads,
      'model.num_decoder_layers': s.layers, 'model.d_ff': 4 * s.width,
      'seq_len': s.seq_len})


def host_check_layouts(size: str = 'small') -> list[cands.Candidate]:
  """Layouts of host_check_config(size) over 8 devices: each mesh kind,
  remat full and dots, a chunked loss (4 chunks) and gradient
  accumulation; the largest size takes five of them (its steps take
  seconds each)."""
  s = HOST_SIZES[size]
  chunk = s.rows * s.seq_len // 4

  def layout(data, fsdp, tensor, remat='none', accum=1, loss_chunk=0):
    return cands.Candidate(data, fsdp, tensor, remat, 'float32', loss_chunk,
                           s.rows // accum, accum)
  if size == 'gpt2_small_4l':
    return [layout(8, 1, 1), layout(1, 8, 1), layout(2, 1, 4),
            layout(8, 1, 1, 'full'), layout(8, 1, 1, loss_chunk=chunk)]
  return [layout(8, 1, 1), layout(1, 8, 1), layout(1, 1, 8),
          layout(2, 1, 4), layout(4, 1, 2), layout(8, 1, 1, 'full'),
          layout(1, 8, 1, 'full'), layout(8, 1, 1, accum=2),
          layout(8, 1, 1, 'dots'), layout(8, 1, 1, loss_chunk=chunk)]
