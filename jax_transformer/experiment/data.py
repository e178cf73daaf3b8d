"""An experiment's data: which dataset, how it is tokenized and batched.

One frozen dataclass, ``config.data`` of every experiment, read by the
whole data layer (``sources.source_for``, ``sources.Mixture``,
``pipeline.make_dataset``) and built by :meth:`DataConfig.of` from whatever
a caller holds: a dataset name, a dict, an ``ml_collections`` config or a
DataConfig. Which kind of source owns each field, and which fields are
paths, is said by the kinds' ``data_options``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax_transformer import fields
from jax_transformer.errors import UsageError
from jax_transformer.experiment.data_options import (
  FORMER,
  FilesOptions,
  HfOptions,
)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """The data fields of an experiment (docs/data.md).

  Attributes:
    name: a dataset of ``data.DATASETS``, any TFDS name
      ('name/config:version'), 'files' (your files: ``files.train``), or
      'huggingface:OWNER/NAME' / 'huggingface' (``hf.path``).
    data_dir: where ``prepare`` puts it (None: $TFDS_DATA_DIR or
      ~/tensorflow_datasets); local or mounted.
    direction: translation only and required there: 'SRC-TGT' (e.g.
      'en-de'), so a model is never trained the wrong way round;
      'prompt-completion' for instruction data.
    pack: pack several sequences per row (ignored for stream LM datasets,
      which have no padding to remove).
    src_len: source length S for translation (None: seq_len).
    tokenizer / vocab_size / spm_model_type: a tokenizer trained on the
      corpus ('sentencepiece' of that size and model type; None: bytes).
    train_split / eval_split: the splits a run trains and evaluates on.
    builder_kwargs: keyword arguments of the TFDS builder.
    task: 'lm' or 'translation' for a dataset outside DATASETS (None: from
      direction); text_key: the LM's text feature ('text'); lm_mode:
      'stream' or 'examples' (``datasets.DatasetSpec.lm_mode``).
    files: your files, for name='files' (``data_options.FilesOptions``:
      ``train`` and ``eval`` globs, ``eval_fraction``).
    hf: a Hugging Face dataset (``data_options.HfOptions``: a
      ``save_to_disk`` folder ``path``, a Hub dataset's ``config``).
    train_files, eval_files, eval_fraction, hf_path, hf_config: the flat
      names of earlier versions (``data_options.FORMER``), still read from
      a command line, a config file or a saved config.json: each given is
      moved to its nested field (over the nested value, if both are
      given), and reads None after.
    tokenizer_path: an existing tokenizer instead of one trained on the
      corpus: a SentencePiece .model, a Hugging Face tokenizer.json or a
      folder holding one (tokenizer and vocab_size unset).
    chat_train: chat records: 'all' (every assistant reply trains, each
      with its end-of-turn marker) or 'last' (the final reply alone).
    mixture: several sources with weights, read with this data's tokenizer
      (docs/data.md, "Mixtures"): dicts such as {'name': 'shakespeare',
      'weight': 3}; None: this dataset alone.
    prepare_workers: processes tokenizing a big split (None: all cores).
    worker_count / worker_buffer_size: processes building training batches
      (0: this process, with threads) and batches each keeps ready. The
      count is part of the stream: resume with the count a checkpoint was
      saved with.
    accept_changed_corpus: resume a run of your files although they
      changed since it started (a file added, removed or rewritten; else
      refused, ``data/corpus.py``): the new corpus is prepared and the
      data iterator starts afresh on it. Not part of the run (a resume may
      set it or not).
  """
  name: str = 'shakespeare'
  data_dir: str | None = None
  direction: str | None = None
  pack: bool = False
  src_len: int | None = None
  tokenizer: str | None = None
  vocab_size: int | None = None
  spm_model_type: str = 'unigram'
  train_split: str = 'train'
  eval_split: str = 'validation'
  builder_kwargs: dict | None = None
  task: str | None = None
  text_key: str | None = None
  lm_mode: str | None = None
  files: FilesOptions = dataclasses.field(default_factory=FilesOptions)
  hf: HfOptions = dataclasses.field(default_factory=HfOptions)
  tokenizer_path: str | None = None
  mixture: tuple | None = None
  chat_train: str = 'all'
  prepare_workers: int | None = None
  worker_count: int = 0
  worker_buffer_size: int = 2
  accept_changed_corpus: bool = False
  # The FORMER names, last: a command line may still set them.
  train_files: str | None = None
  eval_files: str | None = None
  eval_fraction: float | None = None
  hf_path: str | None = None
  hf_config: str | None = None

  def __post_init__(self):
    for former, nested in FORMER.items():
      self._move(former, *nested.split('.'))

  def _move(self, former: str, group: str, name: str) -> None:
    """The value of a FORMER field moved to its nested one (a group
    given as None is its defaults). Given both, the former name's value is
    taken: it is the one given last where both meet (an old flag over a
    preset's nested value, ``replace(train_files=...)`` on a config)."""
    options = getattr(self, group)
    if options is None:
      options = self.__dataclass_fields__[group].default_factory()
    value = getattr(self, former)
    if value is not None:
      options = dataclasses.replace(options, **{name: value})
    # Frozen: __post_init__ is where a frozen dataclass may still be set.
    object.__setattr__(self, group, options)
    object.__setattr__(self, former, None)

  @classmethod
  def of(cls, value: Any) -> DataConfig:
    """A DataConfig from a DataConfig, a dataset name, or a mapping of its
    fields (a dict, an ml_collections config); missing fields take their
    defaults, a misspelt one is refused naming the closest."""
    if isinstance(value, str):
      return cls(name=value)
    return fields.build(cls, value, 'config.data')

  def replace(self, **changes: Any) -> DataConfig:
    return dataclasses.replace(self, **changes)

  def check(self) -> None:
    """Refuses in one sentence a field no dataset could use (what the
    dataset itself needs is checked by its source, ``sources.source_for``)."""
    if self.data_dir and '://' in self.data_dir:
      # TFDS's array_record reader opens local files only.
      raise UsageError(f'config.data.data_dir={self.data_dir}: prepared '
                       'data must be on a local or mounted path (object '
                       'storage works for --workdir).')
    if self.chat_train not in ('all', 'last'):
      raise UsageError("config.data.chat_train must be 'all' or 'last', got "
                       f'{self.chat_train!r}.')
    for name, least in (('worker_count', 0), ('worker_buffer_size', 1)):
      fields.check_integer(f'config.data.{name}', getattr(self, name), least)
