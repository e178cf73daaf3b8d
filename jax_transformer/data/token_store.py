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
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jax_transformer.data.tokenizers import Tokenizer, as_text

MANIFEST = 'manifest.json'
FORMAT = 1
# Texts tokenized per call: bounds memory while a store is written.
BATCH = 4096


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
                  source: Callable[[], Any]) -> TokenStore:
  """The split's store for tokenizer, written first if it is missing or
  torn (source() gives the split's text examples, read only then)."""
  directory = store_dir(data_dir, dataset, split, tokenizer)
  if not is_whole(directory):
    _build(directory, source(), tokenizer, features)
  return TokenStore(directory, features)


def _build(directory: str, source, tokenizer: Tokenizer,
           features: Sequence[str]) -> None:
  parent = os.path.dirname(directory)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix='.tmp_store_')
  try:
    _write_files(tmp, _tokenize(source, tokenizer, features), len(source))
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


def _tokenize(source, tokenizer: Tokenizer, features: Sequence[str]
              ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Per feature, (ids end to end [N_tok] int32, offsets [N + 1] int64)."""
  pieces = {f: [] for f in features}
  lengths = {f: [] for f in features}
  for start in range(0, len(source), BATCH):
    examples = _read(source, range(start, min(start + BATCH, len(source))))
    for feature in features:
      ids = [tokenizer.encode(as_text(ex[feature])) for ex in examples]
      lengths[feature].extend(len(x) for x in ids)
      pieces[feature].append(np.fromiter(
          (t for x in ids for t in x), np.int32))
  out = {}
  for feature in features:
    offsets = np.zeros(len(lengths[feature]) + 1, np.int64)
    np.cumsum(lengths[feature], out=offsets[1:])
    tokens = (np.concatenate(pieces[feature]) if pieces[feature]
              else np.zeros(0, np.int32))
    out[feature] = (tokens, offsets)
  return out
