"""Token ids of a prepared split, written once and read instead of text.

Decoding a TFDS record and tokenizing its text costs tens of microseconds
of Python per example, under one GIL, at every epoch of every run. A store
pays that once: for each text feature of a split, all its examples' token
ids end to end (``<feature>.tokens.npy``, int32) and where each example
starts (``<feature>.offsets.npy``, int64, N + 1 entries), read back by
memory map. It lives beside the TFDS files::

  DATA_DIR/<dataset>/token_store/<tokenizer fingerprint>/<split>/

keyed by the tokenizer's fingerprint (a hash of its saved files), so a
changed tokenizer finds no store and builds its own. A store is written
into a temporary folder and renamed into place whole; its manifest
(``manifest.json``) records every file's size, and a store whose files do
not match it (torn by a full disk or a partial copy) is rebuilt, never read.

Writing streams: examples are read and tokenized a batch at a time and
their ids appended to the files, so memory stays bounded whatever the
split's size; a split of more than ``PARALLEL_MIN`` examples is tokenized
by worker processes (each opens the split itself), in order. ``BuildStats``
says how fast.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from jax_transformer.data import chat
from jax_transformer.data.tokenizers import Tokenizer, as_text

MANIFEST = 'manifest.json'
FORMAT = 1
# Texts tokenized per call: bounds memory while a store is written.
BATCH = 4096
# Splits with more examples are tokenized by worker processes.
PARALLEL_MIN = 8 * BATCH
# An .npy header of a fixed size, so that a file can be written before its
# length is known (numpy pads headers with spaces to a multiple of 64).
_HEADER = 128


@dataclasses.dataclass(frozen=True)
class BuildStats:
  """How a store was written: examples, tokens (all features), seconds,
  worker processes (1: this one) and text bytes read."""
  examples: int
  tokens: int
  seconds: float
  processes: int
  text_bytes: int

  @property
  def tokens_per_second_per_core(self) -> float:
    return self.tokens / max(self.seconds, 1e-9) / self.processes


def fingerprint(tokenizer: Tokenizer) -> str:
  """16 hex digits identifying the tokenizer (a hash of its saved files)."""
  digest = hashlib.sha256()
  with tempfile.TemporaryDirectory() as tmp:
    tokenizer.save(tmp)
    for name in sorted(os.listdir(tmp)):
      digest.update(name.encode())
      with open(os.path.join(tmp, name), 'rb') as f:
        digest.update(f.read())
  return digest.hexdigest()[:16]


def store_dir(data_dir: str, dataset: str, split: str,
              tokenizer: Tokenizer) -> str:
  return os.path.join(data_dir, dataset, 'token_store',
                      fingerprint(tokenizer), split)


class TokenStore:
  """Random access to a split's token ids: ``store[i]`` is example i as
  {feature: int32 ids}; ``store.ids(feature)`` the whole feature [N_tok]."""

  def __init__(self, directory: str, features: Sequence[str]):
    self.directory, self.features = directory, tuple(features)
    # Plain arrays over the mapped files: slicing a np.memmap costs a
    # subclass's bookkeeping per slice, an ndarray view does not.
    self._tokens = {f: np.asarray(np.load(self._path(f, 'tokens'),
                                          mmap_mode='r'))
                    for f in features}
    self._offsets = {f: np.load(self._path(f, 'offsets'))
                     for f in features}
    self._count = len(next(iter(self._offsets.values()))) - 1
    self.built: BuildStats | None = None  # set where open_or_build wrote it

  def __reduce__(self):
    # To a worker process by name: it maps the files itself, instead of
    # receiving a pickled copy of every token.
    return TokenStore, (self.directory, self.features)

  def _path(self, feature: str, kind: str) -> str:
    return os.path.join(self.directory, f'{feature}.{kind}.npy')

  def __len__(self) -> int:
    return self._count

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    out = {}
    for feature, tokens in self._tokens.items():
      offsets = self._offsets[feature]
      out[feature] = tokens[offsets[i]:offsets[i + 1]]
    return out

  def ids(self, feature: str) -> np.ndarray:
    """Every example's ids of feature, end to end."""
    return np.asarray(self._tokens[feature])

  def offsets(self, feature: str) -> np.ndarray:
    return self._offsets[feature]


def is_whole(directory: str) -> bool:
  """Whether directory holds a store whose files match its manifest."""
  try:
    with open(os.path.join(directory, MANIFEST)) as f:
      manifest = json.load(f)
    if manifest.get('format') != FORMAT:
      return False
    return all(os.path.getsize(os.path.join(directory, name)) == size
               for name, size in manifest['sizes'].items())
  except (OSError, ValueError, KeyError, AttributeError):
    return False


def open_or_build(data_dir: str, dataset: str, split: str,
                  tokenizer: Tokenizer, features: Sequence[str],
                  source: Callable[[], Any], workers: int | None = None
                  ) -> TokenStore:
  """The split's store for tokenizer, written first if it is missing or
  torn (source() gives the split's text examples, read only then; a
  picklable source lets worker processes open it themselves; workers:
  how many, default every core)."""
  directory = store_dir(data_dir, dataset, split, tokenizer)
  stats = None
  if not is_whole(directory):
    stats = _build(directory, source, tokenizer, features, workers)
  store = TokenStore(directory, features)
  store.built = stats
  return store


def _build(directory: str, opener: Callable[[], Any], tokenizer: Tokenizer,
           features: Sequence[str], workers: int | None) -> BuildStats:
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix='.tmp_store_')
  try:
    stats = _write_streaming(tmp, opener, tokenizer, features, workers)
    os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide it from other users
    if os.path.exists(directory):  # torn: replaced whole
      shutil.rmtree(directory)
    try:
      os.replace(tmp, directory)
    except OSError:
      if not is_whole(directory):  # not another host's finished store
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return stats


def write(directory: str,
          arrays: dict[str, tuple[np.ndarray, np.ndarray]]) -> TokenStore:
  """A store of given (ids, offsets) per feature at directory (benchmarks
  write synthetic splits with it)."""
  os.makedirs(directory, exist_ok=True)
  count = len(next(iter(arrays.values()))[1]) - 1
  _write_files(directory, arrays, count)
  return TokenStore(directory, list(arrays))


def _write_files(directory: str,
                 arrays: dict[str, tuple[np.ndarray, np.ndarray]],
                 count: int) -> None:
  """The arrays' files, then the manifest that vouches for them."""
  sizes = {}
  for feature, (tokens, offsets) in arrays.items():
    for kind, array in (('tokens', tokens), ('offsets', offsets)):
      name = f'{feature}.{kind}.npy'
      np.save(os.path.join(directory, name), array)
      sizes[name] = os.path.getsize(os.path.join(directory, name))
  with open(os.path.join(directory, MANIFEST), 'w') as f:
    json.dump({'format': FORMAT, 'examples': count,
               'features': list(arrays), 'sizes': sizes}, f)


def _read(source, indices: range) -> list:
  """source's examples at indices, in one read where it takes a batch."""
  try:
    return list(source.__getitems__(list(indices)))
  except (AttributeError, TypeError):  # no batch read (TFDS's mock data)
    return [source[i] for i in indices]


def _tokenize_range(source, tokenizer: Tokenizer, features: Sequence[str],
                    start: int, stop: int
                    ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int]:
  """({feature: (ids [n_tok] int32, lengths [n] int64)}, text bytes) of
  examples start..stop."""
  examples = _read(source, range(start, stop))
  out, text_bytes = {}, 0
  chats = {}
  if tuple(features) == chat.FEATURES:  # instruction data: chats rendered
    for j, ex in enumerate(examples):
      text = as_text(ex[features[0]])
      if chat.is_stored(text):
        chats[j] = chat.stored_ids(tokenizer, text,
                                   f'record {start + j + 1} of the split')
  for k, feature in enumerate(features):
    texts = [as_text(ex[feature]) for ex in examples]
    text_bytes += sum(len(t.encode('utf-8')) for t in texts)
    ids = [chats[j][k] if j in chats else tokenizer.encode(t)
           for j, t in enumerate(texts)]
    lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
    flat = np.fromiter((t for x in ids for t in x), np.int32,
                       int(lengths.sum()))
    out[feature] = (flat, lengths)
  return out, text_bytes


# In a worker process: the split and tokenizer it was started with.
_WORKER: dict[str, Any] = {}


def _worker_init(opener, tokenizer, features) -> None:
  # Ctrl-C reaches the whole process group: the parent stops (and ends
  # this pool); a worker's own KeyboardInterrupt would only add tracebacks.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  _WORKER.update(source=opener(), tokenizer=tokenizer, features=features)


def _worker_range(bounds: tuple[int, int]):
  return _tokenize_range(_WORKER['source'], _WORKER['tokenizer'],
                         _WORKER['features'], *bounds)


def _picklable(*values) -> bool:
  try:
    pickle.dumps(values)
  except Exception:  # lambdas, open files: tokenized here instead
    return False
  return True


def _chunks(source, opener, tokenizer, features, workers: int
            ) -> Iterator[tuple[dict, int]]:
  """The split's tokenized batches in order, from worker processes
  (spawned: the caller may hold JAX's threads, which fork would copy
  mid-lock) or from this one."""
  n = len(source)
  bounds = [(i, min(i + BATCH, n)) for i in range(0, n, BATCH)]
  if workers <= 1:
    for start, stop in bounds:
      yield _tokenize_range(source, tokenizer, features, start, stop)
    return
  context = multiprocessing.get_context('spawn')
  with context.Pool(workers, _worker_init,
                    (opener, tokenizer, tuple(features))) as pool:
    # imap keeps order and at most a few batches per worker in flight.
    yield from pool.imap(_worker_range, bounds, chunksize=1)


def _write_streaming(directory: str, opener: Callable[[], Any],
                     tokenizer: Tokenizer, features: Sequence[str],
                     workers: int | None) -> BuildStats:
  """The store's files, written as the batches come, then its manifest."""
  start_time = time.perf_counter()
  source = opener()
  n = len(source)
  workers = workers or os.cpu_count() or 1
  if n < PARALLEL_MIN or not _picklable(opener, tokenizer):
    workers = 1
  workers = max(1, min(workers, -(-n // BATCH)))
  files = {}
  for feature in features:
    for kind in ('tokens', 'offsets'):
      f = open(os.path.join(directory, f'{feature}.{kind}.npy'), 'wb')
      f.write(b'\0' * _HEADER)
      files[feature, kind] = f
  for feature in features:
    files[feature, 'offsets'].write(np.zeros(1, np.int64).tobytes())
  totals = dict.fromkeys(features, 0)
  text_bytes = 0
  try:
    for chunk, chunk_bytes in _chunks(source, opener, tokenizer, features,
                                      workers):
      text_bytes += chunk_bytes
      for feature, (ids, lengths) in chunk.items():
        files[feature, 'tokens'].write(ids.tobytes())
        ends = totals[feature] + np.cumsum(lengths)
        files[feature, 'offsets'].write(ends.tobytes())
        totals[feature] += int(lengths.sum())
    sizes = {}
    for (feature, kind), f in files.items():
      dtype, length = ((np.int32, totals[feature]) if kind == 'tokens'
                       else (np.int64, n + 1))
      f.seek(0)
      f.write(_npy_header(dtype, length))
      f.close()
      name = f'{feature}.{kind}.npy'
      sizes[name] = os.path.getsize(os.path.join(directory, name))
  finally:
    for f in files.values():
      f.close()
  with open(os.path.join(directory, MANIFEST), 'w') as f:
    json.dump({'format': FORMAT, 'examples': n, 'features': list(features),
               'sizes': sizes}, f)
  return BuildStats(n, sum(totals.values()),
                    time.perf_counter() - start_time, workers, text_bytes)


def _npy_header(dtype, length: int) -> bytes:
  """An .npy (version 1.0) header of exactly _HEADER bytes for a 1-D
  array."""
  text = repr({'descr': np.lib.format.dtype_to_descr(np.dtype(dtype)),
               'fortran_order': False, 'shape': (length,)})
  body_size = _HEADER - 10
  text = text.ljust(body_size - 1) + '\n'
  header = (b'\x93NUMPY\x01\x00' + body_size.to_bytes(2, 'little')
            + text.encode('latin1'))
  assert len(header) == _HEADER, len(header)
  return header
