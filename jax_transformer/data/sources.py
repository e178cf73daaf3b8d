"""Where a run's data comes from: one class per kind of source.

``source_for(data_cfg)`` reads a run's ``config.data`` and returns its
source, an instance of the first kind of ``KINDS`` that claims it:

* ``Mixture``: ``data.mixture`` is set; several sources with weights,
  read with the tokenizer of the run's own dataset, the kind ``data.name``
  names (``Mixture`` and docs/data.md, "Mixtures", describe them);
* ``BuiltIn``: a name of the table ``datasets.DATASETS`` (its row gives
  task, keys and tokenizer; ``data.task``, ``text_key`` and ``lm_mode``
  may still override it);
* ``Files``: ``'files'``, your files (``data.files.train`` and
  ``data.files.eval``, see ``files``);
* ``HuggingFace``: ``'huggingface:OWNER/NAME'`` (``data.hf.config``) or
  ``'huggingface'`` with ``data.hf.path``, see ``hf_datasets``;
* ``Tfds``: any other name, as TFDS names it (``'name/config:version'``),
  from its catalog or already prepared under ``data.data_dir``, with
  ``data.task`` ('lm', or 'translation' when ``data.direction`` is set),
  ``data.text_key`` (LM) or the two feature keys of ``data.direction``
  ('src-tgt'), and ``data.lm_mode``.

Each kind owns its ``spec`` (the ``datasets.DatasetSpec`` it reads,
refusing a config it cannot read in one sentence: ``check``), its ``build``
(the TFDS dataset on disk), its ``prepare`` (that, the tokenizer and the
token stores, ``datasets.prepare_spec``) and its ``dataset`` (a split's
Grain batches, ``splits.batches``). Every kind but the mixture ends as a
TFDS dataset read by name, so everything after ``build`` is shared.

A new kind is a subclass of ``Source`` with its ``kind``, ``claims`` and
``_spec`` (and ``build`` where its TFDS dataset is written by this
package), listed in ``KINDS`` before ``Tfds``, which claims every name.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import grain
import numpy as np

from jax_transformer.data import (
  datasets,
  files,
  hf_datasets,
  splits,
  token_store,
)
from jax_transformer.data.datasets import DatasetSpec, PreparedData
from jax_transformer.data.tokenizers import Tokenizer
from jax_transformer.errors import UsageError
from jax_transformer.experiment import data_options
from jax_transformer.experiment.data import DataConfig

LM_MODES = datasets.LM_MODES
TASKS = datasets.TASKS


class Source:
  """A run's data, of one kind (see the module doc).

  Attributes:
    config: the run's ``config.data`` (a DataConfig).
    options: the fields of it this kind reads as its own, and which of
      them are paths (``data_options``; its key there is ``kind``).
  """
  kind: ClassVar[str]
  options: ClassVar[data_options.Options]

  def __init__(self, config: DataConfig):
    self.config = config

  @classmethod
  def claims(cls, d: DataConfig) -> bool:
    """Whether a data config (its name a non-empty string) is this kind's."""
    raise NotImplementedError

  def _spec(self) -> DatasetSpec:
    raise NotImplementedError

  @functools.cached_property
  def spec(self) -> DatasetSpec:
    """What it reads; refuses in one sentence a config it cannot read."""
    return self._spec()

  @property
  def parts(self) -> tuple[Part, ...]:
    """The sources a mixture mixes; none for a dataset of its own."""
    return ()

  @property
  def data_dir(self) -> str:
    return self.config.data_dir or datasets.default_data_dir()

  def check(self) -> None:
    """Refuses in one sentence, before anything is prepared, a config that
    names nothing this kind could read."""
    self.spec  # made for its refusals

  def build(self):
    """Writes its TFDS dataset under data_dir if it is not there; returns
    the builder."""
    return datasets.build(self.spec.name, self.data_dir,
                          self.config.builder_kwargs)

  def prepare(self, *, seq_len: int | None = None,
              refuse_other_tokenizer: bool = False,
              workers: int | None = None) -> PreparedData:
    """Prepares exactly what a run reads (``prepare_for`` says how)."""
    d, spec = self.config, self.spec
    given = datasets.given_tokenizer(d)
    both = tuple(dict.fromkeys((d.train_split or 'train',
                                d.eval_split or 'validation')))
    prepared = datasets.prepare_spec(
        spec, self.data_dir, self.build, given=given,
        given_dir=d.tokenizer_path, tokenizer=d.tokenizer,
        vocab_size=d.vocab_size, model_type=d.spm_model_type or 'unigram',
        splits=both, train_split=both[0],
        refuse_other_tokenizer=refuse_other_tokenizer,
        workers=workers or d.prepare_workers)
    for split in both:
      datasets.check_split(prepared, split, seq_len)
    return prepared

  def prepare_alongside(self, prepared: PreparedData,
                        split_names: tuple[str, ...], *,
                        seq_len: int | None = None,
                        workers: int | None = None) -> None:
    """Prepared as one source of a mixture, with the run's tokenizer
    (``prepared.tokenizer``): its TFDS dataset built, its features
    checked, each split's token store written, then a split that is empty
    or (given seq_len) too short for a window refused in one sentence, as
    ``prepare`` does."""
    spec = self.spec
    datasets.check_features(spec, self.build())
    here = dataclasses.replace(prepared, spec=spec, data_dir=self.data_dir)
    for split in dict.fromkeys(split_names):
      self.store(split, prepared.tokenizer,
                 workers=workers or self.config.prepare_workers)
      datasets.check_split(here, split, seq_len)

  def store(self, split: str, tokenizer: Tokenizer,
            workers: int | None = None) -> token_store.TokenStore:
    """The token store of a split, written once per tokenizer."""
    spec = self.spec
    return token_store.open_or_build(
        self.data_dir, spec.home, split, tokenizer, spec.text_features,
        functools.partial(datasets.load_source, spec, split,
                          self.config.data_dir), workers=workers)

  def dataset(self, split: str, tokenizer: Tokenizer, *, source=None,
              **batching: Any) -> grain.IterDataset:
    """The batches of a split (``pipeline.make_dataset``'s arguments),
    from its token store or, given one, a data source of text (tests)."""
    store = None if source is not None else self.store(split, tokenizer)
    return splits.batches(self.spec, self.config, split, tokenizer,
                          store=store, source=source, **batching)


def _choice(d: DataConfig, name: str, choices: tuple[str, ...]):
  value = getattr(d, name)
  if value is not None and value not in choices:
    raise UsageError(f'config.data.{name} must be one of {choices}, got '
                     f'{value!r}.')
  return value


def _overrides(d: DataConfig) -> dict[str, Any]:
  """The spec fields the config sets (task, lm_mode, text_key), checked."""
  task = _choice(d, 'task', TASKS)
  lm_mode = _choice(d, 'lm_mode', LM_MODES)
  text_key = d.text_key
  if text_key is not None and (not isinstance(text_key, str) or not text_key):
    raise UsageError('config.data.text_key must be a feature name, got '
                     f'{text_key!r}.')
  return {k: v for k, v in (('task', task), ('lm_mode', lm_mode),
                            ('text_key', text_key)) if v is not None}


def _languages(direction: Any, task: str) -> tuple[str, ...]:
  """The two feature keys of a translation dataset outside DATASETS,
  from direction 'src-tgt'."""
  if task != 'translation':
    return ()
  parts = direction.split('-') if isinstance(direction, str) else []
  if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
    raise UsageError('A translation dataset needs config.data.direction='
                     "'SRC-TGT', its two feature keys (e.g. 'en-de'), got "
                     f'{direction!r}.')
  return tuple(parts)


def _spec_fields(d: DataConfig) -> dict[str, Any]:
  """task, text_key, languages and lm_mode of a dataset outside the table:
  what the config sets, else an LM (translation with a direction) of
  'text', read as a stream."""
  overrides = _overrides(d)
  task = overrides.get('task') or ('translation' if d.direction else 'lm')
  return dict(task=task, text_key=overrides.get('text_key') or 'text',
              languages=_languages(d.direction, task),
              lm_mode=overrides.get('lm_mode') or 'stream')


def _keys(fields: Mapping[str, Any]) -> tuple[str, ...]:
  """The text features of _spec_fields (DatasetSpec.text_features)."""
  return (fields['languages'] if fields['task'] == 'translation'
          else (fields['text_key'],))


class BuiltIn(Source):
  """A dataset of the table ``datasets.DATASETS`` (a version after ':'
  too): its row, where the config's task, text_key and lm_mode override
  it."""
  kind = 'builtin'
  options = data_options.BUILTIN

  @classmethod
  def claims(cls, d: DataConfig) -> bool:
    return (d.name in datasets.DATASETS
            or d.name.split(':')[0] in datasets.DATASETS)

  def _spec(self) -> DatasetSpec:
    name = self.config.name
    row = (datasets.DATASETS.get(name)
           or datasets.DATASETS[name.split(':')[0]])
    return dataclasses.replace(row, name=name, **_overrides(self.config))


class Files(Source):
  """Your files (``data.name='files'``), written once as the TFDS dataset
  ``your_files/<fingerprint>`` (``files``); a changed corpus has another
  fingerprint, so it is prepared again rather than read stale."""
  kind = 'files'
  options = data_options.FILES

  @classmethod
  def claims(cls, d: DataConfig) -> bool:
    return d.name == files.NAME

  def _spec(self) -> DatasetSpec:
    fields = _spec_fields(self.config)
    own = self.config.files
    fraction = own.eval_fraction
    fraction = files.DEFAULT_EVAL_FRACTION if fraction is None else fraction
    if (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
        or not 0 < fraction < 1):
      raise UsageError('config.data.files.eval_fraction must be a number '
                       f'between 0 and 1 (the share held out), got '
                       f'{fraction!r}.')
    if not own.train:
      raise UsageError("config.data.name='files' reads "
                       'config.data.files.train: set it to a glob of your '
                       'files (.txt, .jsonl, .parquet, .tsv).')
    train = files.expand(own.train, 'files.train')
    evaluation = files.expand(own.eval, 'files.eval') if own.eval else []
    for path in train + evaluation:
      files.file_kind(path)
    fp = files.fingerprint(fields['task'], _keys(fields), train, evaluation,
                           float(fraction))
    return DatasetSpec(f'{files.BUILDER}/{fp}', **fields,
                       files=(tuple(train), tuple(evaluation),
                              float(fraction)))

  def build(self):
    spec = self.spec
    train, evaluation, fraction = spec.files
    files.build(self.data_dir, fingerprint=spec.name.split('/')[1],
                keys=spec.text_features, train=train, evaluation=evaluation,
                eval_fraction=fraction)
    return super().build()


class HuggingFace(Source):
  """A Hugging Face dataset, of the Hub or a ``save_to_disk`` folder,
  written once as a TFDS dataset (``hf_datasets``)."""
  kind = 'huggingface'
  options = data_options.HUGGINGFACE

  @classmethod
  def claims(cls, d: DataConfig) -> bool:
    return hf_datasets.is_huggingface(d.name)

  def _spec(self) -> DatasetSpec:
    fields = _spec_fields(self.config)
    tfds_name, hf = hf_datasets.spec_fields(self.config.name, self.config,
                                            _keys(fields))
    return DatasetSpec(tfds_name, **fields, hf=hf)

  def build(self):
    spec = self.spec
    hf_datasets.build(spec.name, spec.hf, spec.text_features, self.data_dir)
    return super().build()


class Tfds(Source):
  """Any other TFDS dataset, by the name TFDS gives it: downloaded and
  prepared by TFDS, or already prepared under data_dir."""
  kind = 'tfds'
  options = data_options.TFDS

  @classmethod
  def claims(cls, d: DataConfig) -> bool:
    return True  # asked last (KINDS)

  def _spec(self) -> DatasetSpec:
    name = self.config.name
    fields = _spec_fields(self.config)
    if name.startswith(f'{files.NAME}/'):  # not the files' folder name
      raise UsageError(f'config.data.name={name!r}: your files are '
                       "config.data.name='files' with "
                       'config.data.files.train.')
    return DatasetSpec(name, **fields)


# What a mixture's part may set (a dataset's fields, every kind's own, its
# weight and label), and what it takes from the run's config.data unless
# it sets it.
SOURCE_FIELDS = data_options.part_fields()
INHERITED = ('data_dir', 'direction', 'pack', 'src_len')


@dataclasses.dataclass(frozen=True)
class Part:
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


class Mixture(Source):
  """Several sources with weights, one training stream (``data.mixture``;
  docs/data.md, "Mixtures").

  ``config.data.mixture`` lists the parts, each a dict of data fields like
  the run's own ``config.data`` (``name``, and for that dataset
  ``text_key``, ``task``, ``lm_mode``, ``files``, ``hf``,
  ``train_split``, ``eval_split``, ``builder_kwargs``...), with a
  ``weight`` (a positive number, default 1) and an optional ``label`` (its
  name in the metrics, default its ``name``)::

    # configs/*.py: a tuple of dicts
    c.data.mixture = ({'name': 'shakespeare', 'weight': 3},
                      {'name': 'files', 'files': {'train': 'notes/*.txt'},
                       'weight': 1, 'label': 'notes'})
    # the command line: the same as a Python literal
    --config.data.mixture="[{'name': 'shakespeare', 'weight': 3},
                            {'name': 'files', 'files': {'train': 'n/*.txt'}}]"

  A part takes ``INHERITED`` (``data_dir``, ``direction``, ``pack``,
  ``src_len``) from the run's ``config.data`` unless it sets them. The
  run's own dataset (``own``, the kind its ``data.name`` names) gives the
  spec, the tokenizer every part is read with, and the task every part
  must share.

  Training rows are drawn from the parts in the weights' proportions by
  Grain's deterministic mix (``grain.IterDataset.mix``), row by row: a
  batch holds rows of every part, each shuffled and packed on its own. The
  stream's position (every part's, and the mix's) is one Grain state, so
  a resumed run continues with exactly the next batch. Evaluation scores
  each part's ``eval_split`` on its own (``eval_loss/<label>``) and all of
  them together (``eval_loss``, pooled over tokens).
  """
  kind = 'mixture'
  options = data_options.MIXTURE

  def __init__(self, config: DataConfig):
    super().__init__(config)
    self.own = source_for(config.replace(mixture=None))

  @classmethod
  def claims(cls, d: DataConfig) -> bool:
    return bool(d.mixture)

  def _spec(self) -> DatasetSpec:
    return self.own.spec

  def build(self):
    return self.own.build()

  @functools.cached_property
  def parts(self) -> tuple[Part, ...]:
    """The parts of ``data.mixture``, checked: refuses in one sentence an
    entry that is not a dict with a name, a field a source cannot set, a
    weight that is not a positive number, two parts with one label, and
    parts of different tasks (the run's own dataset's task included)."""
    entries = self.config.mixture
    if isinstance(entries, (str, Mapping)) or not isinstance(entries,
                                                             Sequence):
      raise UsageError('config.data.mixture must be a list of sources, each '
                       "a dict such as {'name': 'shakespeare', 'weight': 3}, "
                       f'got {entries!r}.')
    out: list[Part] = []
    for i, entry in enumerate(entries):
      where = f'config.data.mixture[{i}]'
      part = self._part(entry, where)
      if part.label in [p.label for p in out]:
        raise UsageError(f'{where} and another source are both labelled '
                         f"{part.label!r}; give one a 'label' of its own.")
      out.append(part)
    run_task = self.spec.task
    for p in out:
      task = source_for(p.data).spec.task
      if task != run_task:
        raise UsageError(
            f'config.data.mixture mixes tasks: {p.label} is {task} and '
            f'{self.config.name} (config.data.name) is {run_task}; every '
            'source must be of the run\'s task.')
    return tuple(out)

  def _part(self, entry: Any, where: str) -> Part:
    """One entry of the mixture: the run's INHERITED fields, then the
    entry's own."""
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
    inherited = {k: getattr(self.config, k) for k in INHERITED}
    return Part(label, float(weight), DataConfig.of({**inherited, **own}))

  def check(self) -> None:
    super().check()
    self.parts  # made for its refusals

  def prepare(self, **kwargs: Any) -> PreparedData:
    """The run's own dataset and tokenizer (``Source.prepare``), then
    every part prepared alongside with that tokenizer, its train and eval
    splits' token stores written."""
    prepared = self.own.prepare(**kwargs)
    for p in self.parts:
      source_for(p.data).prepare_alongside(
          prepared, (p.train_split, p.eval_split),
          seq_len=kwargs.get('seq_len'), workers=kwargs.get('workers'))
    return prepared

  def dataset(self, split: str, tokenizer: Tokenizer, *, batch_size: int,
              seed: int, shuffle: bool, num_epochs: int | None,
              process_count: int, **batching: Any) -> grain.IterDataset:
    """Evaluation reads the run's own split; training mixes each part's
    training rows (its own stream on its train_split, seeded seed + its
    index, one row per host) by weight into batches [B // processes,
    ...]."""
    common = dict(shuffle=shuffle, num_epochs=num_epochs,
                  process_count=process_count, **batching)
    if not shuffle and num_epochs == 1:
      return self.own.dataset(split, tokenizer, batch_size=batch_size,
                              seed=seed, **common)
    local_batch = splits.local_batch_size(batch_size, process_count)
    rows = {p.label: source_for(p.data).dataset(
                p.train_split, tokenizer, batch_size=process_count,
                seed=seed + i, **common)
            for i, p in enumerate(self.parts)}
    ds = grain.IterDataset.mix(rows, {p.label: p.weight for p in self.parts})
    return ds.batch(local_batch, drop_remainder=True, batch_fn=_concat)


def _concat(rows: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}


# Asked in this order; the first kind that claims a config reads it.
KINDS: dict[str, type[Source]] = {
    cls.kind: cls for cls in (Mixture, BuiltIn, Files, HuggingFace, Tfds)}


def source_for(data_cfg: Any) -> Source:
  """The source of a run's ``config.data`` (or a dict, a DataConfig, or a
  dataset name): the first kind of ``KINDS`` that claims it."""
  d = DataConfig.of(data_cfg)
  if not isinstance(d.name, str) or not d.name:
    raise UsageError(f'config.data.name must name a dataset, got {d.name!r}.')
  return next(cls for cls in KINDS.values() if cls.claims(d))(d)


def spec_for(data_cfg: Any) -> DatasetSpec:
  """What a run's data config reads (``source_for(data_cfg).spec``; a
  mixture's: its own dataset's)."""
  return source_for(data_cfg).spec


def prepare_for(data_cfg: Any, *, seq_len: int | None = None,
                refuse_other_tokenizer: bool = False,
                workers: int | None = None) -> PreparedData:
  """Prepares the data a run with this ``config.data`` reads, once: its
  dataset (``spec_for``), its tokenizer and the token stores of its
  ``train_split`` and ``eval_split`` (slices too), and, for a mixture,
  every part's with that tokenizer; then refuses in one sentence a split
  that is missing or empty, or (given seq_len) a stream split with fewer
  tokens than one window (``source_for(data_cfg).prepare``).

  refuse_other_tokenizer: refuse, rather than train, a tokenizer this
    config asks for when the dataset was prepared with another one (the
    trainer: training a tokenizer on a big corpus inside a job is hours
    lost; ``scripts/prepare_data.py --config`` prepares the run's).
  workers: processes tokenizing a big split (default: data.prepare_workers,
    else every core).
  """
  return source_for(data_cfg).prepare(
      seq_len=seq_len, refuse_other_tokenizer=refuse_other_tokenizer,
      workers=workers)
