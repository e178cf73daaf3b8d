"""Which datasets exist, how to read them, and ``prepare`` (build + tokenizer).

A dataset is named as TFDS names it (``'shakespeare'``, ``'ding_en_de'``,
``'wmt14_translate/de-en'``, ``'lm1b'``, ...). ``DATASETS`` records for each
what the pipeline needs: the task, the splits, the text features and the
default tokenizer. Everything is read with ``tfds.data_source`` from
ArrayRecord files, so TensorFlow is never needed.

Files live under ``data_dir`` (default: ``$TFDS_DATA_DIR``, else
``~/tensorflow_datasets``, as TFDS itself does)::

  <data_dir>/<name>/[<config>/]<version>/...   the TFDS ArrayRecord files
  <data_dir>/<name>/tokenizer_<id>/            the tokenizer (see tokenizers)

where ``<id>`` is ``byte`` or e.g. ``spm_unigram_8000``, so tokenizers with
different settings never overwrite each other.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jax_transformer.data import builders, token_store
from jax_transformer.data import tokenizers as tok
from jax_transformer.data.tokenizers import as_text  # noqa: F401 (here first)
from jax_transformer.errors import UsageError


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """What the pipeline must know about one dataset.

  Attributes:
    name: TFDS name, with config when there is one.
    task: 'lm' or 'translation'.
    train_split / eval_split: TFDS split names.
    text_key: the text feature of an LM dataset.
    languages: the two text features of a translation dataset.
    lm_mode: 'stream' concatenates a split into one token stream cut into
      windows (no padding; for running text such as plays); 'examples' keeps
      each example as its own sequence ([BOS] text [EOS]), padded or packed
      (for sentence corpora such as lm1b).
    stream_separator: text put between examples in a stream; None puts EOS.
    tokenizer: default tokenizer kind, 'byte' or 'sentencepiece'.
    vocab_size: default SentencePiece vocabulary size.
    local: built by this package from files on this machine (no download).
  """
  name: str
  task: str
  train_split: str = 'train'
  eval_split: str = 'validation'
  text_key: str = 'text'
  languages: tuple[str, ...] = ()
  lm_mode: str = 'stream'
  stream_separator: str | None = None
  tokenizer: str = 'byte'
  vocab_size: int = 8000
  local: bool = False

  @property
  def text_features(self) -> tuple[str, ...]:
    """The text features of an example (what a token store holds)."""
    return self.languages if self.task == 'translation' else (self.text_key,)


DATASETS: dict[str, DatasetSpec] = {s.name: s for s in (
    # Paragraphs of plays, joined back with the blank line that separated them.
    DatasetSpec('shakespeare', 'lm', stream_separator='\n\n', local=True),
    # One example per split holding the whole text.
    DatasetSpec('tiny_shakespeare', 'lm', stream_separator=''),
    DatasetSpec('lm1b', 'lm', eval_split='test', lm_mode='examples',
                tokenizer='sentencepiece', vocab_size=32000),
    DatasetSpec('ding_en_de', 'translation', languages=('en', 'de'),
                tokenizer='sentencepiece', vocab_size=8000, local=True),
    # validation is newstest2013 and test newstest2014 (the paper's test set).
    DatasetSpec('wmt14_translate/de-en', 'translation',
                languages=('en', 'de'), tokenizer='sentencepiece',
                vocab_size=32000),
    DatasetSpec('wmt_t2t_translate/de-en', 'translation',
                languages=('en', 'de'), tokenizer='sentencepiece',
                vocab_size=32000),
)}


def get_spec(name: str) -> DatasetSpec:
  if name not in DATASETS:
    raise UsageError(f'Unknown dataset {name!r}; choose one of '
                     f'{sorted(DATASETS)}.')
  return DATASETS[name]


def default_data_dir() -> str:
  """$TFDS_DATA_DIR, else ~/tensorflow_datasets (the TFDS default)."""
  return os.path.expanduser(
      os.environ.get('TFDS_DATA_DIR', '~/tensorflow_datasets'))


def load_source(name: str, split: str, data_dir: str | None = None):
  """A random-access data source (len, [i]) over a prepared split."""
  data_dir = data_dir or default_data_dir()
  try:
    return tfds.data_source(
        get_spec(name).name, split=split, data_dir=data_dir, download=False,
        builder_kwargs={'file_format': 'array_record'})
  except (KeyError, FileNotFoundError, AssertionError) as e:
    # TFDS reports a missing dataset as an empty split dict.
    raise FileNotFoundError(
        f'Split {split!r} of {name!r} is not prepared under {data_dir}. Run:\n'
        f'  python scripts/prepare_data.py --dataset {name} '
        f'--data_dir {data_dir}') from e


def build(name: str, data_dir: str | None = None,
          builder_kwargs: Mapping[str, Any] | None = None):
  """Builds the TFDS dataset if it is not on disk yet; returns the builder.

  builder_kwargs go to the builder (e.g. ``source_dir`` for shakespeare,
  ``source_path`` for ding_en_de). Standard datasets download their sources;
  lm1b and WMT are built by our subclasses of TFDS's builders, which write
  the same files without TensorFlow (see ``downloads``).
  """
  kwargs = {'file_format': 'array_record', **(builder_kwargs or {})}
  builder = builders.builder(name, data_dir=data_dir or default_data_dir(),
                              **kwargs)
  builder.download_and_prepare()  # a no-op when the files exist
  return builder


def tokenizer_id(kind: str, vocab_size: int, model_type: str) -> str:
  if kind == tok.ByteTokenizer.kind:
    return 'byte'
  return f'spm_{model_type}_{vocab_size}'


def training_texts(spec: DatasetSpec, source,
                   max_examples: int = 1_000_000) -> Iterator[str]:
  """Texts to train a tokenizer on: every text feature of (a sample of) train.

  Large splits are sampled at evenly spaced indices, which is deterministic
  and covers the whole split (TFDS stores examples in shuffled order anyway).
  """
  n = len(source)
  indices = (range(n) if n <= max_examples
             else np.linspace(0, n - 1, max_examples).astype(np.int64))
  keys = spec.text_features
  for i in indices:
    example = source[int(i)]
    for key in keys:
      yield as_text(example[key])


@dataclasses.dataclass(frozen=True)
class PreparedData:
  """What ``prepare`` returns: everything the trainer needs to read the data."""
  spec: DatasetSpec
  data_dir: str
  tokenizer: tok.Tokenizer
  tokenizer_dir: str
  num_examples: dict[str, int]

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.vocab_size


def prepare(dataset_name: str, data_dir: str | None = None, *,
            tokenizer: str | None = None, vocab_size: int | None = None,
            model_type: str = 'unigram',
            builder_kwargs: Mapping[str, Any] | None = None
            ) -> PreparedData:
  """Builds the dataset and its tokenizer under data_dir (once).

  Repeated calls are cheap: TFDS skips a prepared dataset and a tokenizer
  directory that exists is loaded instead of trained. Run it on one process
  (e.g. ``scripts/prepare_data.py``) before a multi-host job starts.

  Args:
    dataset_name: a key of DATASETS.
    data_dir: root of the TFDS files (default: default_data_dir()).
    tokenizer: 'byte' or 'sentencepiece' (default: the dataset's).
    vocab_size: SentencePiece vocabulary size (default: the dataset's).
    model_type: SentencePiece 'unigram' or 'bpe'.
    builder_kwargs: passed to the TFDS builder (tests point the local
      builders at fixture files with these).
  """
  spec = get_spec(dataset_name)
  # Checked whatever the tokenizer, before the dataset is built: a typo
  # should not wait for a download.
  tok.check_model_type(model_type)
  data_dir = data_dir or default_data_dir()
  builder = build(spec.name, data_dir, builder_kwargs)
  kind = tokenizer or spec.tokenizer
  vocab_size = vocab_size or spec.vocab_size
  tok_dir = os.path.join(data_dir, spec.name,
                         'tokenizer_' + tokenizer_id(kind, vocab_size,
                                                     model_type))
  if os.path.exists(os.path.join(tok_dir, 'tokenizer.json')):
    tokenizer_obj = tok.load_tokenizer(tok_dir)
  else:
    texts = None
    if kind == tok.SentencePieceTokenizer.kind:
      texts = training_texts(spec, load_source(spec.name, spec.train_split,
                                               data_dir))
    tokenizer_obj = tok.make_tokenizer(kind, texts, vocab_size=vocab_size,
                                       model_type=model_type)
    _save_atomically(tokenizer_obj, tok_dir)
  num_examples = {split: info.num_examples
                  for split, info in builder.info.splits.items()}
  for split in num_examples:  # token ids, written once for this tokenizer
    token_store.open_or_build(
        data_dir, spec.name, split, tokenizer_obj, spec.text_features,
        lambda split=split: load_source(spec.name, split, data_dir))
  return PreparedData(spec, data_dir, tokenizer_obj, tok_dir, num_examples)


def _save_atomically(tokenizer: tok.Tokenizer, directory: str) -> None:
  # A crash mid-save must not leave a directory that looks complete.
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix='.tmp_tokenizer_')
  try:
    tokenizer.save(tmp)
    os.replace(tmp, directory)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
