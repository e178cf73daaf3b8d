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

The mixture is a kind of source, ``sources.Mixture`` (its parts, checks,
preparation and mixed batches); this module keeps its functions by their
names.
"""

from __future__ import annotations

from typing import Any

from jax_transformer.data import datasets
from jax_transformer.data import sources as kinds

# What a source may set, and what it takes from the run's config.data.
SOURCE_FIELDS = kinds.SOURCE_FIELDS
INHERITED = kinds.INHERITED
Source = kinds.Part  # one source of a mixture: label, weight, data


def sources(data_cfg: Any) -> list[Source]:
  """The sources of ``data_cfg.mixture`` ([] without one), checked
  (``sources.Mixture.parts``)."""
  return list(kinds.source_for(data_cfg).parts)


def check(data_cfg: Any) -> None:
  """Refuses a bad mixture in one sentence (see ``sources.Mixture.parts``)."""
  sources(data_cfg)


def prepare_for(data_cfg: Any, **kwargs: Any) -> datasets.PreparedData:
  """The run's dataset and tokenizer (``sources.prepare_for(data_cfg,
  **kwargs)``), then every source of its mixture: its TFDS dataset built
  and its train and eval splits' token stores written with that
  tokenizer, refusing an empty split or (given seq_len) one too short for a
  window."""
  return kinds.source_for(data_cfg).prepare(**kwargs)
