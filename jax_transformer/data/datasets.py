"""Which datasets exist, how to read them, and how to prepare one.

A ``DatasetSpec`` says what the pipeline must know about a dataset: its
task, splits, text features and default tokenizer. ``DATASETS`` holds the
built-ins; the other kinds of source (any TFDS name, your files, Hugging
Face datasets, mixtures) make their spec from a run's config, see
``sources`` (``source_for``, ``spec_for``, ``prepare_for``).

Every kind ends as a TFDS dataset read by name (``'shakespeare'``,
``'ding_en_de'``, ``'wmt14_translate/de-en'``, ``'lm1b'``,
``'your_files/<fingerprint>'``, ...), with ``tfds.data_source`` from
ArrayRecord files (``load_source``), so TensorFlow is never needed. Once
a source has built it (``build``), ``prepare_spec`` gives it its
tokenizer, trained on the corpus (``data.tokenizer``, ``data.vocab_size``,
``data.spm_model_type``) or given by ``data.tokenizer_path``
(``given_tokenizer``), and its token stores, keyed by the tokenizer so
that two tokenizers never share one. ``prepare(name)`` does all of it for
a built-in by name.

Files live under ``data_dir`` (default: ``$TFDS_DATA_DIR``, else
``~/tensorflow_datasets``, as TFDS itself does)::

  <data_dir>/<name>/[<config>/]<version>/...   the TFDS ArrayRecord files
  <data_dir>/<name>/tokenizer_<id>/            the tokenizer (see tokenizers)

where ``<id>`` is ``byte`` or e.g. ``spm_unigram_8000``, so tokenizers with
different settings never overwrite each other.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from jax_transformer.data import builders, files, token_store
from jax_transformer.data import tokenizers as tok
from jax_transformer.data.tokenizers import as_text
from jax_transformer.errors import UsageError, first_line
from jax_transformer.experiment.data import DataConfig


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
    files: for ``data.name='files'``: (train paths, eval paths, held-out
      fraction), see ``files``.
    hf: for a Hugging Face dataset: what it is built from, see
      ``hf_datasets.spec_fields``.
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
  files: tuple | None = None
  hf: tuple | None = None

  @property
  def text_features(self) -> tuple[str, ...]:
    """The text features of an example (what a token store holds)."""
    return self.languages if self.task == 'translation' else (self.text_key,)

  @property
  def home(self) -> str:
    """The folder under data_dir holding its tokenizers and token stores
    (the name, a version after '@' rather than ':')."""
    return self.name.replace(':', '@')


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


LM_MODES = ('stream', 'examples')
TASKS = ('lm', 'translation')


def load_source(name: str | DatasetSpec, split: str,
                data_dir: str | None = None):
  """A random-access data source (len, [i]) over a prepared split (a
  slice such as 'train[:99%]' too) of a dataset name or spec."""
  data_dir = data_dir or default_data_dir()
  tfds_name = (name.name if isinstance(name, DatasetSpec)
               else DATASETS[name].name if name in DATASETS else name)
  try:
    return tfds.data_source(
        tfds_name, split=split, data_dir=data_dir, download=False,
        builder_kwargs={'file_format': 'array_record'})
  except (KeyError, FileNotFoundError, AssertionError, ValueError,
          tfds.core.registered.DatasetNotFoundError) as e:
    # TFDS reports a missing dataset as an empty split dict.
    how = (f'--dataset {tfds_name}' if tfds_name in DATASETS
           else "--config <the run's config>")
    raise FileNotFoundError(
        f'Split {split!r} of {tfds_name!r} is not prepared under {data_dir} '
        f'({first_line(e)}). Run:\n'
        f'  python scripts/prepare_data.py {how} --data_dir {data_dir}'
    ) from e


def build(name: str, data_dir: str | None = None,
          builder_kwargs: Mapping[str, Any] | None = None):
  """Builds the TFDS dataset if it is not on disk yet; returns the builder.

  builder_kwargs go to the builder (e.g. ``source_dir`` for shakespeare,
  ``source_path`` for ding_en_de). Standard datasets download their sources;
  lm1b and WMT are built by our subclasses of TFDS's builders, which write
  the same files without TensorFlow (see ``downloads``). A dataset prepared
  elsewhere is read back from its files, without its builder class.
  """
  kwargs = {'file_format': 'array_record', **(builder_kwargs or {})}
  root = data_dir or default_data_dir()
  try:
    builder = builders.builder(name, data_dir=root, **kwargs)
  except tfds.core.registered.DatasetNotFoundError:
    raise UsageError(
        f'config.data.name={name!r}: TFDS has no such dataset and '
        f'{data_dir or default_data_dir()} holds none prepared under that '
        'name (name/config:version).') from None
  except ValueError as e:  # e.g. an unknown config or version
    raise UsageError(f'config.data.name={name!r}: {first_line(e)}') from None
  with files.without_log('Variant folder '):  # "... has no dataset_info"
    prepared = builder.is_prepared()
  if not prepared:
    # The folders of the dataset (name, config), not its version's
    # (TFDS's own incomplete.* folder, removed on failure).
    made = files.new_folders(root, *os.path.relpath(
        os.fspath(builder.data_dir), root).split(os.sep)[:-1])
    try:
      builder.download_and_prepare()
    except BaseException:
      files.remove_if_empty(made)  # a refusal leaves no empty folder
      raise
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
  """What ``prepare`` returns: everything the trainer needs to read the data.

  stores: the token stores written by this call, per split, with how fast
  they were written (``token_store.BuildStats``); empty when all existed.
  """
  spec: DatasetSpec
  data_dir: str
  tokenizer: tok.Tokenizer
  tokenizer_dir: str
  num_examples: dict[str, int]
  stores: dict[str, Any] = dataclasses.field(default_factory=dict)

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
  ``sources.prepare_for`` does the same from a run's data config.

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
  data_dir = data_dir or default_data_dir()
  return prepare_spec(spec, data_dir,
                      functools.partial(build, spec.name, data_dir,
                                        builder_kwargs),
                      tokenizer=tokenizer, vocab_size=vocab_size,
                      model_type=model_type)


def given_tokenizer(data_cfg: Any) -> tok.Tokenizer | None:
  """The tokenizer ``data.tokenizer_path`` gives (``tokenizers.from_path``),
  or None where it is unset (a tokenizer trained on the corpus); refuses in
  one sentence a path that is no tokenizer, and a ``data.tokenizer`` or
  ``data.vocab_size`` that says otherwise than the tokenizer."""
  d = DataConfig.of(data_cfg)
  path = d.tokenizer_path
  if path is None:
    return None
  if not isinstance(path, str) or not path:
    raise UsageError('config.data.tokenizer_path must be the path of a '
                     'tokenizer (a SentencePiece .model, a tokenizer.json or '
                     f'a folder holding one), got {path!r}.')
  tokenizer = tok.from_path(path)
  # Unset: None, or on the command line '' and 0 (a recipe's value cannot
  # be set back to None there).
  kind = d.tokenizer
  if kind and kind != tokenizer.kind:
    raise UsageError(
        f'config.data.tokenizer={kind!r} trains a tokenizer on the corpus '
        f'but config.data.tokenizer_path={path} gives a {tokenizer.kind} '
        'one; unset it (--config.data.tokenizer=).')
  size = d.vocab_size
  if size and size != tokenizer.vocab_size:
    raise UsageError(
        f'config.data.vocab_size={size} but the tokenizer of '
        f'config.data.tokenizer_path={path} has {tokenizer.vocab_size} ids; '
        'unset it (--config.data.vocab_size=0): the tokenizer gives it.')
  return tokenizer


def check_split(prepared: PreparedData, split: str,
                 seq_len: int | None) -> None:
  """Refuses in one sentence a prepared split that is empty or (given
  seq_len) a stream split with fewer tokens than one window."""
  spec = prepared.spec
  store = token_store.TokenStore(
      token_store.store_dir(prepared.data_dir, spec.home, split,
                            prepared.tokenizer), spec.text_features)
  if not len(store):
    raise UsageError(f'Split {split!r} of {spec.name} is empty: nothing to '
                     'train or evaluate on.')
  if seq_len and spec.task == 'lm' and spec.lm_mode == 'stream':
    offsets = store.offsets(spec.text_key)
    tokens = int(offsets[-1]) + len(offsets) - 2  # with one EOS between
    if tokens < seq_len + 1:
      raise UsageError(
          f'Split {split!r} of {spec.name} holds {tokens} tokens: too few '
          f'for one window of seq_len + 1 = {seq_len + 1}; give it more text '
          '(e.g. config.data.files.eval) or lower config.seq_len.')


def check_features(spec: DatasetSpec, builder) -> None:
  """Refuses in one sentence a text feature the dataset does not have."""
  try:
    have = list(builder.info.features.keys())
  except (AttributeError, TypeError):  # not a dict of features
    return
  for key in spec.text_features:
    if key not in have:
      field = ('config.data.text_key' if spec.task == 'lm'
               else 'config.data.direction')
      raise UsageError(f'{spec.name} has no feature {key!r} (it has '
                       f'{", ".join(map(repr, have))}); set {field} to its '
                       'text feature.')


def _check_splits_exist(spec: DatasetSpec, builder,
                        splits: tuple[str, ...]) -> None:
  """Refuses in one sentence a split (or a slice's split) the dataset does
  not have, e.g. 'validation' of a dataset with 'train' alone."""
  try:
    have = set(builder.info.splits.keys())
  except (AttributeError, TypeError):
    return
  if not have:
    return
  for split in splits:
    for part in split.split('+'):
      base = part.split('[')[0].strip()
      if base and base not in have:
        raise UsageError(
            f'{spec.name} has no split {base!r} (it has '
            f'{", ".join(map(repr, sorted(have)))}); set '
            'config.data.train_split/eval_split, slices too (e.g. '
            "'train[:99%]' and 'train[99%:]').")


def prepare_spec(spec: DatasetSpec, data_dir: str,
                 make_builder: Callable[[], Any], *,
                 tokenizer: str | None, vocab_size: int | None,
                 model_type: str,
                 splits: tuple[str, ...] | None = None,
                 train_split: str | None = None,
                 refuse_other_tokenizer: bool = False,
                 workers: int | None = None,
                 given: tok.Tokenizer | None = None,
                 given_dir: str | None = None) -> PreparedData:
  """The dataset of spec built under data_dir (``make_builder()``, its
  source's ``build``), its tokenizer (given, loaded, or trained on its
  train_split) and the token stores of splits (default: all), once."""
  # Checked whatever the tokenizer, before the dataset is built: a typo
  # should not wait for a download.
  tok.check_model_type(model_type)
  builder = make_builder()
  check_features(spec, builder)
  if splits:
    _check_splits_exist(spec, builder, splits)
  if given is not None:  # data.tokenizer_path: used as it is
    return _tokenize(spec, data_dir, builder, given,
                     os.path.abspath(os.path.expanduser(given_dir or '')),
                     splits, workers)
  kind = tokenizer or spec.tokenizer
  if kind not in (tok.ByteTokenizer.kind, tok.SentencePieceTokenizer.kind):
    raise UsageError(f"config.data.tokenizer must be 'byte' or "
                     f"'sentencepiece', got {kind!r}.")
  vocab_size = vocab_size or spec.vocab_size
  home = os.path.join(data_dir, spec.home)
  tok_name = 'tokenizer_' + tokenizer_id(kind, vocab_size, model_type)
  tok_dir = os.path.join(home, tok_name)
  train_split = train_split or spec.train_split
  if os.path.exists(os.path.join(tok_dir, 'tokenizer.json')):
    tokenizer_obj = tok.load_tokenizer(tok_dir)
    if tokenizer_obj.kind != kind:
      raise UsageError(f'{tok_dir} holds a {tokenizer_obj.kind} tokenizer, '
                       f'not the {kind} one its name says; delete it.')
  else:
    others = sorted(n for n in (os.listdir(home) if os.path.isdir(home)
                                else ()) if n.startswith('tokenizer_'))
    if refuse_other_tokenizer and others and not spec.local:
      raise UsageError(
          f'{home} was prepared with {", ".join(others)}, not the {tok_name} '
          'this run\'s config asks for; prepare it for this run with '
          'python scripts/prepare_data.py --config <the same config and '
          'overrides>.')
    texts = None
    if kind == tok.SentencePieceTokenizer.kind:
      texts = training_texts(spec, load_source(spec, train_split, data_dir))
    tokenizer_obj = tok.make_tokenizer(kind, texts, vocab_size=vocab_size,
                                       model_type=model_type)
    _save_atomically(tokenizer_obj, tok_dir)
  return _tokenize(spec, data_dir, builder, tokenizer_obj, tok_dir, splits,
                   workers)


def _tokenize(spec: DatasetSpec, data_dir: str, builder,
              tokenizer_obj: tok.Tokenizer, tok_dir: str,
              splits: tuple[str, ...] | None,
              workers: int | None) -> PreparedData:
  """The token stores of splits (default: all), keyed by the tokenizer."""
  num_examples = {split: info.num_examples
                  for split, info in builder.info.splits.items()}
  stores = {}
  for split in (splits or tuple(num_examples)):
    # Token ids, written once for this tokenizer.
    store = token_store.open_or_build(
        data_dir, spec.home, split, tokenizer_obj, spec.text_features,
        functools.partial(load_source, spec, split, data_dir),
        workers=workers)
    if store.built is not None:
      stores[split] = store.built
  return PreparedData(spec, data_dir, tokenizer_obj, tok_dir, num_examples,
                      stores)


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
