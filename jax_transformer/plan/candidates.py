"""The layouts a run could take on a set of chips: the planner's search
space.

A candidate is a mesh split (``mesh.data`` x ``mesh.fsdp`` x
``mesh.sequence`` x ``mesh.tensor`` over every chip; the sequence axis
only for long rows, ``MIN_SHARD_POSITIONS`` a shard), a remat policy, a
parameter dtype, a loss chunk size, and the rows per train step with the
gradient accumulation that brings them to the requested global batch
(``batch_size`` rows a step, ``optim.grad_accum_steps`` steps an update).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterator

from jax_transformer.experiment import Experiment

REMATS = ('none', 'dots', 'full')
PARAM_DTYPES = ('float32', 'bfloat16')
LOSS_CHUNKS = (0, 8192)
# And a chunk of this many token rows on each batch shard (1024 x data x
# fsdp rows, the recipes' chunk on 256 shards): on a pod, 8192 rows a
# chunk are a few dozen a chip, and each chunk reads the whole head (and
# its float32 gradient) from HBM again.
SHARD_CHUNK_ROWS = 1024
MAX_TENSOR = 8        # one host's NVLink, or a TPU's nearest neighbours
# A row is split over the sequence axis only into parts this long or
# longer: shorter rows fill the chips by the batch, and every split part
# gathers the whole row's keys and values each layer.
MIN_SHARD_POSITIONS = 4096
MAX_ACCUMULATION = 16


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One layout of a run; ``batch_size`` x ``grad_accum_steps`` rows make
  one optimizer update."""
  data: int
  fsdp: int
  tensor: int
  remat: str
  param_dtype: str
  loss_chunk_size: int
  batch_size: int
  grad_accum_steps: int
  sequence: int = 1

  def overrides(self) -> dict[str, Any]:
    """The config fields this candidate sets, by dotted name."""
    return {'mesh.data': self.data, 'mesh.fsdp': self.fsdp,
            'mesh.tensor': self.tensor, 'mesh.sequence': self.sequence,
            'model.remat': self.remat,
            'model.param_dtype': self.param_dtype,
            'loss_chunk_size': self.loss_chunk_size,
            'batch_size': self.batch_size,
            'eval_batch_size': self.batch_size,
            'optim.grad_accum_steps': self.grad_accum_steps}

  def flags(self) -> list[str]:
    """The candidate as ``train.py`` flags."""
    return [f'--config.{k}={v}' for k, v in self.overrides().items()]

  def apply(self, cfg: Experiment) -> Experiment:
    """A copy of cfg laid out as this candidate."""
    return cfg.replace(**self.overrides())

  def describe(self) -> str:
    mesh = ' x '.join(f'{k} {v}' for k, v in
                      (('data', self.data), ('fsdp', self.fsdp),
                       ('sequence', self.sequence), ('tensor', self.tensor))
                      if v > 1) or '1 chip'
    dtype = 'bf16' if self.param_dtype == 'bfloat16' else 'f32'
    return (f'{mesh}, remat {self.remat}, {dtype} params, loss chunk '
            f'{self.loss_chunk_size or "off"}, {self.batch_size} rows x '
            f'{self.grad_accum_steps}')


def shipped(cfg: Experiment, chips: int,
            global_batch: int) -> Candidate:
  """The config's own layout at global_batch rows an update: its mesh
  (-1 resolved to the chips left), remat, dtype, loss chunk, and its
  accumulation where that divides the batch."""
  # The four axes only: mesh.dcn_* say how they cross slices, not sizes.
  sizes = {axis: getattr(cfg.mesh, axis)
           for axis in ('data', 'fsdp', 'sequence', 'tensor')}
  known = 1
  for v in sizes.values():
    known *= v if v > 0 else 1
  sizes = {k: (chips // known if v == -1 else v) for k, v in sizes.items()}
  accum = cfg.optim.grad_accum_steps
  if global_batch % accum:
    accum = 1
  return Candidate(sizes['data'], sizes['fsdp'], sizes['tensor'],
                   cfg.model.remat, cfg.model.param_dtype,
                   cfg.loss_chunk_size,
                   global_batch // accum, accum, sizes['sequence'])


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def meshes(chips: int, heads: int, kv_heads: int, seq_len: int = 0
           ) -> Iterator[tuple[int, int, int, int]]:
  """(data, fsdp, tensor, sequence) over every chip; tensor divides the
  heads (and the key-value heads) and is at most MAX_TENSOR; sequence
  splits rows of seq_len into parts of MIN_SHARD_POSITIONS or more."""
  for tensor in _divisors(chips):
    if tensor > MAX_TENSOR or heads % tensor or kv_heads % tensor:
      continue
    for sequence in _divisors(chips // tensor):
      if sequence > 1 and (seq_len % sequence
                           or seq_len // sequence < MIN_SHARD_POSITIONS):
        continue
      rest = chips // tensor // sequence
      for data in _divisors(rest):
        yield data, rest // data, tensor, sequence


def enumerate_candidates(cfg: Experiment, chips: int,
                         global_batch: int, slices: int = 1,
                         param_dtypes: tuple[str, ...] = PARAM_DTYPES,
                         remats: tuple[str, ...] = REMATS
                         ) -> list[Candidate]:
  """Every candidate for cfg on ``chips`` chips at global_batch rows an
  update: each mesh, remat, dtype, loss chunk, and each accumulation that
  leaves every batch shard whole rows. Over several slices only data
  parallelism crosses between them (mesh.data a multiple of slices)."""
  m = cfg.model
  heads = m.num_heads
  kv_heads = m.kv_heads
  chunks = sorted({*LOSS_CHUNKS, cfg.loss_chunk_size})
  out = []
  layouts = [(mesh, remat, dtype, chunk) for mesh in meshes(
      chips, heads, kv_heads, cfg.seq_len) for remat, dtype, chunk in itertools.product(
          remats, param_dtypes,
          sorted({*chunks, SHARD_CHUNK_ROWS * mesh[0] * mesh[1]}))]
  for (data, fsdp, tensor, sequence), remat, dtype, chunk in layouts:
    if data % slices:
      continue
    for accum in _divisors(global_batch):
      rows = global_batch // accum
      if accum > MAX_ACCUMULATION or rows % (data * fsdp):
        continue
      out.append(Candidate(data, fsdp, tensor, remat, dtype, chunk, rows,
                           accum, sequence))
  return out
