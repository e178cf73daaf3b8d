"""Your own files as a dataset: ``data.name='files'``.

``data.files.train`` (and optionally ``data.files.eval``) are globs, local or
``gs://``, of

* plain text (``.txt``): one document per file;
* JSON lines (``.jsonl``, ``.json``, ``.ndjson``): one record per line, the
  text under ``data.text_key`` (translation: under the two languages of
  ``data.direction``);
* Parquet (``.parquet``): one record per row, the same keys as columns;
* TSV (``.tsv``, translation only): ``source<TAB>target`` per line, in the
  order of ``data.direction``;
* instruction data (JSON lines, ``data.direction='prompt-completion'``):
  ``{"prompt": ..., "completion": ...}`` per line, or chat messages
  ``{"messages": [{"role": "user", "content": ...}, ...,
  {"role": "assistant", "content": ...}]}`` kept as messages and rendered
  when tokenized, with the tokenizer's own chat template or the fixed one
  (``data/chat.py``), every assistant message training. A decoder LM
  trains on the completion tokens only (``data.pipeline``,
  ``batching.instruction_example``);

each optionally compressed (``.gz``, ``.zst``). They are written once into
the form the built-in datasets take, a TFDS ArrayRecord dataset::

  <data_dir>/your_files/<fingerprint>/1.0.0/...

where the fingerprint hashes the task, the keys, every file's path, size and
modification time and the held-out fraction, so a changed corpus is
prepared again and never read stale. The dataset is then read like any
TFDS dataset by name (``your_files/<fingerprint>``), and tokenized into a
token store as the built-ins are. Without ``files.eval``, the training
documents whose hash is below ``data.files.eval_fraction`` (at least one)
are the ``validation`` split (``held_out_indices``): a document's side
depends on its text alone, so files added later never move one into
training.

Reading streams: one record at a time, from one file at a time, so the
memory used does not grow with the corpus (TFDS's writer buffers at most
1 GB before it spills to disk). A bad input is refused in one sentence
naming the file and line (``UsageError``), and TFDS writes into a
temporary folder renamed into place at the end, so a failed preparation
leaves nothing that reads as prepared.
"""

from __future__ import annotations

import contextlib
import glob as globlib
import gzip
import hashlib
import io
import json
import logging
import os
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import tensorflow_datasets as tfds
import zstandard
from etils import epath
from tensorflow_datasets.core.utils import tqdm_utils

from jax_transformer.data import chat
from jax_transformer.errors import UsageError

NAME = 'files'
BUILDER = 'your_files'
VERSION = '1.0.0'
DEFAULT_EVAL_FRACTION = 0.01
TEXT_SUFFIXES = ('.txt', '.text', '.md')
JSON_SUFFIXES = ('.jsonl', '.json', '.ndjson')
COMPRESSIONS = ('.gz', '.zst', '.zstd')
_GLOB_CHARS = '*?['
# The two text features of instruction data (data.direction, read by
# data.pipeline as a decoder LM's prompt and completion).
INSTRUCTION_KEYS = ('prompt', 'completion')
INSTRUCTION_DIRECTION = '-'.join(INSTRUCTION_KEYS)


def expand(patterns: str, field: str) -> list[str]:
  """The files a comma-separated list of globs (or folders) names, sorted;
  refused in one sentence when a pattern matches nothing."""
  out: list[str] = []
  for pattern in [p.strip() for p in str(patterns).split(',') if p.strip()]:
    matches = _glob(pattern)
    if not matches:
      raise UsageError(f'config.data.{field}={pattern!r} matches no file.')
    out.extend(m for m in matches if m not in out)
  if not out:
    raise UsageError(f'config.data.{field} is empty: give a glob of files.')
  return out


def _glob(pattern: str) -> list[str]:
  if '://' not in pattern:
    pattern = os.path.abspath(os.path.expanduser(pattern))
    if os.path.isdir(pattern):
      return sorted(os.path.join(pattern, f) for f in os.listdir(pattern)
                    if _kind_or_none(f) and not f.startswith('.'))
    return sorted(p for p in globlib.glob(pattern, recursive=True)
                  if os.path.isfile(p))
  scheme, rest = pattern.split('://', 1)
  parts = rest.split('/')
  first = next((i for i, part in enumerate(parts)
                if any(c in part for c in _GLOB_CHARS)), None)
  if first is None:
    path = epath.Path(pattern)
    if path.is_dir():
      return sorted(os.fspath(p) for p in path.iterdir()
                    if _kind_or_none(p.name) and not p.name.startswith('.'))
    return [pattern] if path.exists() else []
  root = epath.Path(f'{scheme}://' + '/'.join(parts[:first]))
  if not root.exists():
    return []
  return sorted(os.fspath(p) for p in root.glob('/'.join(parts[first:]))
                if not p.is_dir())


def _split_suffix(name: str) -> tuple[str, str]:
  """(format suffix, compression suffix) of a file name."""
  lower = name.lower()
  compression = next((c for c in COMPRESSIONS if lower.endswith(c)), '')
  base = lower[:len(lower) - len(compression)]
  return os.path.splitext(base)[1], compression


def _kind_or_none(name: str) -> str | None:
  suffix, _ = _split_suffix(name)
  if suffix in TEXT_SUFFIXES:
    return 'text'
  if suffix in JSON_SUFFIXES:
    return 'jsonl'
  if suffix == '.parquet':
    return 'parquet'
  if suffix == '.tsv':
    return 'tsv'
  return None


def file_kind(path: str) -> str:
  kind = _kind_or_none(os.path.basename(path))
  if kind is None:
    raise UsageError(
        f'{path}: not a file kind config.data.name=files reads (.txt, .jsonl,'
        ' .json, .ndjson, .parquet or .tsv, optionally .gz or .zst).')
  return kind


def fingerprint(task: str, keys: Sequence[str], train: Sequence[str],
                evaluation: Sequence[str], eval_fraction: float) -> str:
  """16 hex digits naming a corpus: its files (path, size, mtime), task,
  keys and held-out fraction."""
  digest = hashlib.sha256()
  digest.update(json.dumps([task, list(keys), eval_fraction if not evaluation
                            else None]).encode())
  if not evaluation:  # held out by document hash since (held_out_indices)
    digest.update(b'held out by document hash')
  if is_instruction(keys):  # chats kept as messages since (data/chat.py)
    digest.update(b'chat messages')
  for part, paths in (('train', train), ('eval', evaluation)):
    digest.update(part.encode())
    for path in paths:
      stat = epath.Path(path).stat()
      digest.update(json.dumps([path, stat.length, stat.mtime]).encode())
  return digest.hexdigest()[:16]


# ----------------------------------------------------------------------------
# Reading records.


def _open_binary(path: str):
  """A binary stream of path's decompressed bytes."""
  _, compression = _split_suffix(os.path.basename(path))
  try:
    raw = epath.Path(path).open('rb')
  except OSError as e:
    raise UsageError(f'{path}: cannot be read ({e.__class__.__name__}: '
                     f'{e}).') from None
  if compression == '.gz':
    return gzip.GzipFile(fileobj=raw, mode='rb')
  if compression in ('.zst', '.zstd'):
    # Buffered: zstandard's reader has no readline of its own.
    return io.BufferedReader(
        zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
  return raw


def _read_errors():
  return (OSError, EOFError, UnicodeDecodeError, zlib.error,
          zstandard.ZstdError)


def _lines(path: str) -> Iterator[tuple[int, str]]:
  """(line number from 1, line without its newline), streamed."""
  number = offset = 0  # offset: of the line's first byte in the file
  try:
    with _open_binary(path) as raw:
      for number, line in enumerate(raw, 1):
        yield number, line.rstrip(b'\r\n').decode('utf-8')
        offset += len(line)
  except _read_errors() as e:
    # A line that is not UTF-8 is the one being decoded; a corrupt or
    # truncated stream fails while reading the next one.
    if isinstance(e, UnicodeDecodeError):
      where = f'{path}, line {number}'
    else:
      where = f'{path}, line {number + 1}' if number else path
    raise UsageError(f'{where}: cannot be read ({_reason(e, offset)}).'
                     ) from None


def _reason(e: BaseException, offset: int = 0) -> str:
  """Why a file could not be read; for bytes that are not UTF-8, the
  first one and its byte offset in the (decompressed) file, offset being
  where the decoded bytes start."""
  if isinstance(e, UnicodeDecodeError):
    return (f'not UTF-8 text: byte 0x{e.object[e.start]:02x} at byte offset '
            f'{offset + e.start}')
  text = str(e).split('\n')[0]
  return f'{e.__class__.__name__}: {text}' if text else e.__class__.__name__


def records(path: str, keys: Sequence[str]
            ) -> Iterator[tuple[str, dict[str, str]]]:
  """(where, {key: text}) for every record of path, in order; where names
  the file and line (or row). Refuses in one sentence a record that is not
  JSON, lacks a key or holds a text that is not a string."""
  kind = file_kind(path)
  if kind == 'text':
    if len(keys) != 1:
      raise UsageError(f'{path}: a text file holds one document; translation '
                       'reads .jsonl, .parquet or .tsv pairs.')
    try:
      with _open_binary(path) as f:
        text = f.read().decode('utf-8')
    except _read_errors() as e:
      raise UsageError(f'{path}: cannot be read ({_reason(e)}).') from None
    _check_text(path, text)
    yield path, {keys[0]: text}
  elif kind == 'jsonl':
    for number, line in _lines(path):
      if not line.strip():
        continue
      where = f'{path}, line {number}'
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise UsageError(f'{where}: not JSON ({e.msg} at column {e.colno}).'
                         ) from None
      yield where, _texts(record, keys, where)
  elif kind == 'tsv':
    if len(keys) != 2:
      raise UsageError(f'{path}: TSV holds translation pairs; for a language '
                       'model use .txt or .jsonl.')
    for number, line in _lines(path):
      if not line.strip():
        continue
      columns = line.split('\t')
      if len(columns) != 2:
        raise UsageError(f'{path}, line {number}: {len(columns)} tab-'
                         'separated columns; a pair needs exactly 2.')
      yield f'{path}, line {number}', dict(zip(keys, columns))
  else:
    yield from _parquet_records(path, keys)


def _check_text(where: str, text: str) -> None:
  """Refuses a text of NUL bytes alone (with whitespace, if any): a binary
  file or a blank record read as text, with nothing to train on."""
  if '\0' in text and not text.replace('\0', '').strip():
    raise UsageError(f'{where}: holds no text, only NUL bytes; not a text '
                     'file.')


def empty_corpus(field: str, paths: Sequence[str]) -> UsageError:
  """The refusal of files that hold no document with text, naming them."""
  shown = ', '.join(paths[:3]) + (f' and {len(paths) - 3} more'
                                  if len(paths) > 3 else '')
  return UsageError(f'config.data.{field} holds no document with text (it '
                    f'reads {shown}): the corpus is empty.')


def is_instruction(keys: Sequence[str]) -> bool:
  return tuple(keys) == INSTRUCTION_KEYS


def render_chat(messages: Any, where: str) -> dict[str, str]:
  """{'prompt', 'completion'} of a chat record as prepared: the prompt
  holds its messages (``chat.stored_text``, checked), rendered with the
  tokenizer's chat template (or the fixed one) when tokenized
  (``data/chat.py``); UsageError naming the record."""
  return {'prompt': chat.stored_text(messages, where), 'completion': ''}


def _texts(record: Any, keys: Sequence[str], where: str) -> dict[str, str]:
  if not isinstance(record, dict):
    raise UsageError(f'{where}: not a JSON object.')
  if (is_instruction(keys) and 'messages' in record
      and 'prompt' not in record):
    return render_chat(record['messages'], where)
  out = {}
  for key in keys:
    if key not in record:
      raise UsageError(f'{where}: the record has no key {key!r} (it has '
                       f'{", ".join(map(repr, list(record)[:8]))}); set '
                       'config.data.text_key (or direction) to its text key.')
    value = record[key]
    if not isinstance(value, str):
      raise UsageError(f'{where}: {key!r} holds a {type(value).__name__}, '
                       'not a string.')
    _check_text(where, value)
    out[key] = value
  return out


def _parquet_records(path: str, keys: Sequence[str]
                     ) -> Iterator[tuple[str, dict[str, str]]]:
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  try:
    with epath.Path(path).open('rb') as f:
      table = pq.ParquetFile(f)
      missing = [k for k in keys if k not in table.schema_arrow.names]
      if missing:
        raise UsageError(f'{path}: no column {missing[0]!r} (it has '
                         f'{", ".join(table.schema_arrow.names[:8])}); set '
                         'config.data.text_key (or direction) to it.')
      row = 0
      for batch in table.iter_batches(batch_size=4096, columns=list(keys)):
        columns = [batch.column(k).to_pylist() for k in keys]
        for values in zip(*columns):
          row += 1
          where = f'{path}, row {row}'
          yield where, _texts(dict(zip(keys, values)), keys, where)
  except UsageError:
    raise
  except Exception as e:  # pyarrow's errors have no common base
    raise UsageError(f'{path}: cannot be read as Parquet '
                     f'({_reason(e)}).') from None


def documents(paths: Sequence[str], keys: Sequence[str]
              ) -> Iterator[dict[str, str]]:
  """Every non-empty record of paths, in order."""
  for path in paths:
    for _, record in records(path, keys):
      if any(record[k].strip() for k in keys):
        yield record


def document_hash(record: Mapping[str, str], keys: Sequence[str]) -> float:
  """A document's place in [0, 1), from its text alone (sha256): the same
  document gets the same place whatever file holds it and whatever other
  files the corpus has."""
  text = json.dumps([record[k] for k in keys], ensure_ascii=False)
  return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8],
                        'big') / 2**64


def held_out_indices(docs: Iterable[Mapping[str, str]], keys: Sequence[str],
                     fraction: float) -> tuple[set[int], int]:
  """(indices of the documents held out for validation, how many there
  are): those whose ``document_hash`` is below ``fraction``, so adding
  files never moves a document that was held out into training. Where
  none is (a small corpus), the one of lowest hash; where all are, all but
  the one of highest hash, so both splits hold at least one document."""
  held: set[int] = set()
  lowest = highest = (None, -1)
  count = 0
  for i, record in enumerate(docs):
    count += 1
    h = document_hash(record, keys)
    if h < fraction:
      held.add(i)
    if lowest[0] is None or h < lowest[0]:
      lowest = (h, i)
    if highest[0] is None or h > highest[0]:
      highest = (h, i)
  if count and not held:
    held = {lowest[1]}
  if count > 1 and len(held) == count:
    held.discard(highest[1])
  return held, count


# ----------------------------------------------------------------------------
# The TFDS builder.

with tfds.core.registered.skip_registration():
  # Not registered by name: a prepared corpus is read back from its files
  # (tfds.builder falls back to them), which needs neither this class nor
  # the files it was made from.

  class YourFiles(tfds.core.GeneratorBasedBuilder):
    """Files as a TFDS dataset, one config per corpus fingerprint."""

    VERSION = tfds.core.Version(VERSION)
    RELEASE_NOTES = {str(VERSION): 'Files given by globs.'}

    def __init__(self, *, fingerprint: str, keys: Sequence[str],
                 train: Sequence[str], evaluation: Sequence[str],
                 eval_fraction: float, **kwargs):
      kwargs.setdefault('file_format', 'array_record')
      kwargs['config'] = tfds.core.BuilderConfig(
          name=fingerprint, version=VERSION, release_notes={},
          description=f'{len(train)} training files')
      self._keys, self._train = tuple(keys), tuple(train)
      self._evaluation = tuple(evaluation)
      self._eval_fraction = eval_fraction
      super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
      return tfds.core.DatasetInfo(
          builder=self, description='Your files (jax_transformer.data.files).',
          features=tfds.features.FeaturesDict(
              {k: tfds.features.Text() for k in self._keys}))

    def _split_generators(self, dl_manager):
      del dl_manager
      if self._evaluation:
        return {'train': self._generate_examples(self._train, None,
                                                 'files.train'),
                'validation': self._generate_examples(self._evaluation, None,
                                                      'files.eval')}
      held, count = held_out_indices(documents(self._train, self._keys),
                                     self._keys, self._eval_fraction)
      if not count:
        raise empty_corpus('files.train', self._train)
      if count < 2:
        raise UsageError(
            f'config.data.files.train holds {count} document'
            f'{"" if count == 1 else "s"}: too few to hold some out for '
            'evaluation; give config.data.files.eval.')
      print(f'Evaluating on {len(held)} of {count} documents of '
            'config.data.files.train, chosen by a hash of each document '
            '(no config.data.files.eval given).', flush=True)
      return {'train': self._generate_examples(
                  self._train, lambda i: i not in held, 'files.train'),
              'validation': self._generate_examples(
                  self._train, held.__contains__, 'files.train')}

    def _generate_examples(self, paths, keep=None, field: str = ''):
      yielded = 0
      for i, record in enumerate(documents(paths, self._keys)):
        if keep is None or keep(i):
          yielded += 1
          yield i, record
      if not yielded:  # TFDS would refuse it later, less clearly
        raise empty_corpus(field, paths)


@contextlib.contextmanager
def quiet_tfds():
  """TFDS silent while this package prepares a dataset of its own (your
  files, a Hugging Face dataset): no progress bars and no log lines below
  errors, so that a refusal is one line and a success says only what this
  package says. A builder made inside says nothing either: ``quiet``."""
  logger = logging.getLogger('absl')  # TFDS logs through absl
  shown = tqdm_utils._active  # pylint: disable=protected-access
  tfds.display_progress_bar(False)
  logger.addFilter(_drop_tfds_chatter)
  try:
    yield
  finally:
    tfds.display_progress_bar(shown)
    logger.removeFilter(_drop_tfds_chatter)


def _drop_tfds_chatter(record: logging.LogRecord) -> bool:
  return (record.levelno >= logging.ERROR
          or 'tensorflow_datasets' not in record.pathname)


@contextlib.contextmanager
def without_log(prefix: str):
  """TFDS's log lines that start with prefix dropped, inside."""
  def keep(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(prefix)
  logger = logging.getLogger('absl')
  logger.addFilter(keep)
  try:
    yield
  finally:
    logger.removeFilter(keep)


def quiet(builder):
  """builder, without the lines TFDS prints (not logs) before and after
  preparing ("Downloading and preparing dataset Unknown size ...")."""
  builder._log_download_bytes = builder._log_download_done = lambda: None  # pylint: disable=protected-access
  return builder


def remove_if_empty(folders: Sequence[str]) -> None:
  """Removes each folder that is empty, in order (the deepest first): what
  a refused preparation made and left empty."""
  for folder in folders:
    try:
      os.rmdir(folder)
    except OSError:  # not empty (another run's), or gone
      pass


def new_folders(data_dir: str, *parts: str) -> list[str]:
  """The folders data_dir/parts[0]/parts[1]/... (and data_dir, and TFDS's
  downloads/extracted) that do not exist yet, the deepest first."""
  paths = [data_dir]
  for part in parts:
    paths.append(os.path.join(paths[-1], part))
  downloads = os.path.join(data_dir, 'downloads')
  paths += [downloads, os.path.join(downloads, 'extracted')]
  return sorted((p for p in paths if not os.path.exists(p)), key=len,
                reverse=True)


def builder_dir(data_dir: str, fp: str) -> str:
  return os.path.join(data_dir, BUILDER, fp, VERSION)


def build(data_dir: str, *, fingerprint: str, keys: Sequence[str],
          train: Sequence[str], evaluation: Sequence[str],
          eval_fraction: float) -> None:
  """Writes the corpus as a TFDS dataset under data_dir (once)."""
  if os.path.exists(os.path.join(builder_dir(data_dir, fingerprint),
                                 'dataset_info.json')):
    return
  made = new_folders(data_dir, BUILDER, fingerprint)
  try:
    with quiet_tfds():
      _prepare(data_dir, fingerprint=fingerprint, keys=keys, train=train,
               evaluation=evaluation, eval_fraction=eval_fraction)
  except BaseException:
    remove_if_empty(made)  # a refusal leaves no empty your_files/<fp>/
    raise


def _prepare(data_dir: str, *, fingerprint: str, keys: Sequence[str],
             train: Sequence[str], evaluation: Sequence[str],
             eval_fraction: float) -> None:
  builder = quiet(YourFiles(fingerprint=fingerprint, keys=keys, train=train,
                            evaluation=evaluation, eval_fraction=eval_fraction,
                            data_dir=data_dir))
  try:
    builder.download_and_prepare()
  except UsageError:
    raise
  except FileExistsError:
    # Another process on the same data_dir (a second run started beside
    # this one) finished the same corpus first: the same files, so the same
    # dataset. This one's unfinished copy is left to TFDS's incomplete.*.
    if os.path.exists(os.path.join(builder_dir(data_dir, fingerprint),
                                   'dataset_info.json')):
      return
    raise
  except Exception as e:
    # TFDS may wrap what a generator raised; the reason is the first one.
    cause = e
    while cause.__cause__ is not None or cause.__context__ is not None:
      cause = cause.__cause__ or cause.__context__
      if isinstance(cause, UsageError):
        raise cause from None
    raise
