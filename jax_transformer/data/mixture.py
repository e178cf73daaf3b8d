"""Mixtures: several sources with weights, one training stream.

A run trains on a mixture when ``config.data.mixture`` lists its sources,
each a data config like the run's own ``config.data`` (``name``, and for
that dataset ``text_key``, ``task``, ``lm_mode``, ``train_files``,
``eval_files``, ``train_split``, ``eval_split``, ``builder_kwargs``...), with
a ``weight`` (a positive number, default 1) and an optional ``label`` (its
name in the metrics, default its ``name``)::

  # configs/*.py: a tuple of dicts
  c.data.mixture = ({'name': 'shakespeare', 'weight': 3},
                    {'name': 'files', 'train_files': 'notes/*.txt',
                     'weight': 1, 'label': 'notes'})
  # the command line: the same as a Python literal
  --config.data.mixture="[{'name': 'shakespeare', 'weight': 3},
                          {'name': 'files', 'train_files': 'notes/*.txt'}]"

A source takes ``data_dir``, ``direction``, ``pack`` and ``src_len`` from
the run's ``config.data`` unless it sets them; every other field is its own.
All sources are read with the run's tokenizer (the one ``config.data``
names, prepared from ``config.data.name``), and must be of one task.

Training rows are drawn from the sources in the weights' proportions by
Grain's deterministic mix (``grain.IterDataset.mix``), row by row: a batch
holds rows of every source, each source shuffled and packed on its own.
The stream's position (every source's, and the mix's) is one Grain state,
so a resumed run continues with exactly the next batch. Evaluation scores
each source's ``eval_split`` on its own (``eval_loss/<label>``) and all of
them together (``eval_loss``, pooled over tokens).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import grain
import numpy as np

from jax_transformer.data import datasets
from jax_transformer.errors import UsageError
from jax_transformer.experiment.data import DataConfig

# What a source may set (its dataset's fields, its weight and label).
SOURCE_FIELDS = ('name', 'weight', 'label', 'data_dir', 'direction', 'pack',
                 'src_len', 'task', 'text_key', 'lm_mode', 'train_files',
                 'eval_files', 'eval_fraction', 'builder_kwargs',
                 'train_split', 'eval_split')
# What a source takes from the run's config.data unless it sets it.
INHERITED = ('data_dir', 'direction', 'pack', 'src_len')


@dataclasses.dataclass(frozen=True)
class Source:
  """One source of a mixture: its label, weight and data config."""
  label: str
  weight: float
  data: DataConfig

  @property
  def train_split(self) -> str:
    return self.data.train_split

  @property
  def eval_split(self) -> str:
    return self.data.eval_split


def sources(data_cfg: Any) -> list[Source]:
  """The sources of ``data_cfg.mixture`` ([] without one), checked:
  refuses in one sentence a source that is not a dict with a name, a field
  a source cannot set, a weight that is not a positive number, two sources
  with one label, and sources of different tasks (the run's own dataset's
  task included)."""
  run = DataConfig.of(data_cfg)
  entries = run.mixture
  if not entries:
    return []
  if isinstance(entries, (str, Mapping)) or not isinstance(entries,
                                                           Sequence):
    raise UsageError('config.data.mixture must be a list of sources, each a '
                     "dict such as {'name': 'shakespeare', 'weight': 3}, got "
                     f'{entries!r}.')
  out = []
  for i, entry in enumerate(entries):
    where = f'config.data.mixture[{i}]'
    source = _source(run, entry, where)
    if source.label in [s.label for s in out]:
      raise UsageError(f'{where} and another source are both labelled '
                       f"{source.label!r}; give one a 'label' of its own.")
    out.append(source)
  run_task = datasets.spec_for(run).task
  for s in out:
    task = datasets.spec_for(s.data).task
    if task != run_task:
      raise UsageError(
          f'config.data.mixture mixes tasks: {s.label} is {task} and '
          f'{run.name} (config.data.name) is {run_task}; every source '
          'must be of the run\'s task.')
  return out


def _source(run: DataConfig, entry: Any, where: str) -> Source:
  """One entry of the mixture as a Source: the run's INHERITED fields,
  then the entry's own."""
  if hasattr(entry, 'to_dict'):
    entry = entry.to_dict()
  if not isinstance(entry, Mapping) or not entry.get('name'):
    raise UsageError(f'{where} must be a dict with a dataset name, such '
                     f"as {{'name': 'shakespeare', 'weight': 1}}, got "
                     f'{entry!r}.')
  unknown = sorted(set(entry) - set(SOURCE_FIELDS))
  if unknown:
    raise UsageError(f'{where} has no field {unknown[0]!r}; a source sets '
                     f'{", ".join(SOURCE_FIELDS)}.')
  weight = entry.get('weight', 1)
  if (isinstance(weight, bool) or not isinstance(weight, (int, float))
      or not math.isfinite(weight) or weight <= 0):
    raise UsageError(f'{where}.weight must be a positive number, got '
                     f'{weight!r}.')
  label = entry.get('label') or entry['name']
  if not isinstance(label, str):
    raise UsageError(f'{where}.label must be a string, got {label!r}.')
  own = {k: v for k, v in entry.items() if k not in ('weight', 'label')}
  inherited = {k: getattr(run, k) for k in INHERITED}
  return Source(label, float(weight),
                DataConfig.of({**inherited, **own}))


def check(data_cfg: Any) -> None:
  """Refuses a bad mixture in one sentence (see ``sources``)."""
  sources(data_cfg)


def prepare_for(data_cfg: Any, **kwargs: Any) -> datasets.PreparedData:
  """``datasets.prepare_for(data_cfg, **kwargs)`` (the run's dataset and
  tokenizer), then every source of its mixture: its TFDS dataset built and
  its train and eval splits' token stores written with that tokenizer,
  refusing an empty split or (given seq_len) one too short for a window."""
  prepared = datasets.prepare_for(data_cfg, **kwargs)
  for s in sources(data_cfg):
    datasets.prepare_alongside(s.data, prepared,
                               (s.train_split, s.eval_split),
                               seq_len=kwargs.get('seq_len'),
                               workers=kwargs.get('workers'))
  return prepared


def _concat(rows: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}


def mixed_dataset(data_cfg: Any, make_dataset: Callable[..., Any], *,
                  batch_size: int, seed: int, process_count: int,
                  **kwargs: Any) -> grain.IterDataset:
  """The training batches of a mixture: each source's training rows (its
  own ``make_dataset`` stream on its train_split, seeded seed + its index,
  one row per host), mixed by weight, batched [B // processes, ...]."""
  mixed = sources(data_cfg)
  local_batch = batch_size // process_count  # make_dataset checked it
  rows = {s.label: make_dataset(s.data, s.train_split, batch_size=process_count,
                                seed=seed + i, process_count=process_count,
                                **kwargs)
          for i, s in enumerate(mixed)}
  ds = grain.IterDataset.mix(rows, {s.label: s.weight for s in mixed})
  return ds.batch(local_batch, drop_remainder=True, batch_fn=_concat)
