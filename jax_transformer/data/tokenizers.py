"""Tokenizers: UTF-8 bytes for language models, SentencePiece for translation.

Every tokenizer here shares one id layout, so models, losses and decoders can
hard-code it:

====== ==== ===============================================================
name   id   meaning
====== ==== ===============================================================
PAD    0    padding; never a real token, so ``ids > 0`` marks real tokens
BOS    1    begin of sequence; the first decoder input (``tgt_in[0]``)
EOS    2    end of sequence; the last target (``tgt_out[-1]``)
UNK    3    unknown piece (SentencePiece only; bytes cannot be unknown)
====== ==== ===============================================================

``encode`` never adds BOS/EOS (batching adds them where the task needs them);
``decode`` drops PAD, BOS and EOS wherever they appear, so it can be given a
raw row of model output.

A tokenizer is saved as a directory holding ``tokenizer.json`` (its kind and
ids) and, for SentencePiece, ``spm.model``; ``load_tokenizer`` restores either
kind from such a directory. The trainer writes one beside every checkpoint.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
UNK_ID = 3
NUM_RESERVED = 4  # ids below this are the control ids above

_CONFIG_FILE = 'tokenizer.json'
_SPM_FILE = 'spm.model'
_SPECIAL_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID))


class Tokenizer(Protocol):
  """What the pipeline, trainer and decoders rely on."""

  kind: str

  @property
  def vocab_size(self) -> int:
    ...

  def encode(self, text: str) -> list[int]:
    ...

  def decode(self, ids: Iterable[int]) -> str:
    ...

  def save(self, directory: str | os.PathLike) -> None:
    ...


def _write_config(directory: str | os.PathLike, config: dict) -> None:
  os.makedirs(directory, exist_ok=True)
  config = dict(config, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                unk_id=UNK_ID)
  with open(os.path.join(directory, _CONFIG_FILE), 'w') as f:
    json.dump(config, f, indent=2, sort_keys=True)
    f.write('\n')


class ByteTokenizer:
  """UTF-8 bytes shifted past the reserved ids: byte b has id b + 4.

  vocab_size is 260 (4 reserved + 256 bytes). Any string round-trips exactly;
  decoding a byte sequence cut mid-character (as a sampled continuation can be)
  replaces the broken character rather than failing.
  """

  kind = 'byte'

  @property
  def vocab_size(self) -> int:
    return NUM_RESERVED + 256

  def encode(self, text: str) -> list[int]:
    return [b + NUM_RESERVED for b in text.encode('utf-8')]

  def decode(self, ids: Iterable[int]) -> str:
    data = bytes(int(i) - NUM_RESERVED for i in ids
                 if NUM_RESERVED <= int(i) < self.vocab_size)
    return data.decode('utf-8', errors='replace')

  def save(self, directory: str | os.PathLike) -> None:
    _write_config(directory, {'kind': self.kind,
                              'vocab_size': self.vocab_size})

  def __repr__(self) -> str:
    return 'ByteTokenizer()'


class SentencePieceTokenizer:
  """A SentencePiece model (unigram or BPE) with the shared reserved ids.

  Built from a serialized model proto (``train`` or ``load_tokenizer``), so the
  object needs no file and pickles to worker processes.
  """

  kind = 'sentencepiece'

  def __init__(self, model_proto: bytes):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self._proto = bytes(model_proto)
    self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
    ids = (self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id(),
           self._sp.unk_id())
    if ids != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
      raise ValueError(
          f'SentencePiece model has (pad, bos, eos, unk) ids {ids}; this '
          f'project needs {(PAD_ID, BOS_ID, EOS_ID, UNK_ID)}. Train it with '
          'SentencePieceTokenizer.train.')

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int, *,
            model_type: str = 'unigram',
            character_coverage: float = 0.9995,
            max_sentences: int = 2_000_000) -> SentencePieceTokenizer:
    """Trains a model in memory on texts (each split into lines).

    Args:
      texts: training text; for translation pass both sides (joint vocab).
      vocab_size: wanted size; a corpus too small for it gets a smaller vocab
        instead of an error (read ``vocab_size`` afterwards).
      model_type: 'unigram' or 'bpe'.
      character_coverage: share of characters given their own piece; the rest
        are spelled as UTF-8 byte pieces (byte fallback), so nothing is UNK.
      max_sentences: cap on the lines SentencePiece keeps (it samples them).
    """
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    if model_type not in ('unigram', 'bpe'):
      raise ValueError(f"model_type must be 'unigram' or 'bpe', not "
                       f'{model_type!r}')
    model = io.BytesIO()
    spm.set_random_generator_seed(0)  # the line sample is then reproducible
    spm.SentencePieceTrainer.train(
        sentence_iterator=_lines(texts),
        model_writer=model,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        byte_fallback=True,
        split_digits=True,
        # A soft limit lets tiny test corpora train; real corpora reach it.
        hard_vocab_limit=False,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
    )
    return cls(model.getvalue())

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def model_proto(self) -> bytes:
    return self._proto

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def decode(self, ids: Iterable[int]) -> str:
    n = self.vocab_size
    return self._sp.decode([int(i) for i in ids
                            if int(i) not in _SPECIAL_IDS and 0 <= int(i) < n])

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def save(self, directory: str | os.PathLike) -> None:
    _write_config(directory, {'kind': self.kind, 'model_file': _SPM_FILE,
                              'vocab_size': self.vocab_size})
    with open(os.path.join(directory, _SPM_FILE), 'wb') as f:
      f.write(self._proto)

  def __getstate__(self):
    return {'proto': self._proto}

  def __setstate__(self, state):
    self.__init__(state['proto'])

  def __repr__(self) -> str:
    return f'SentencePieceTokenizer(vocab_size={self.vocab_size})'


def _lines(texts: Iterable[str]) -> Iterator[str]:
  # SentencePiece skips inputs over max_sentence_length (4192 bytes), so long
  # documents are fed as their lines.
  for text in texts:
    for line in text.splitlines():
      if line.strip():
        yield line


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
  """Restores a tokenizer written by ``save`` (either kind)."""
  path = os.path.join(directory, _CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f'No {_CONFIG_FILE} in {directory}: not a '
                            'directory written by Tokenizer.save.')
  with open(path) as f:
    config = json.load(f)
  if config['kind'] == ByteTokenizer.kind:
    return ByteTokenizer()
  if config['kind'] == SentencePieceTokenizer.kind:
    with open(os.path.join(directory, config['model_file']), 'rb') as f:
      return SentencePieceTokenizer(f.read())
  raise ValueError(f"Unknown tokenizer kind {config['kind']!r} in {path}")


def make_tokenizer(kind: str, texts: Iterable[str] | None = None, *,
                   vocab_size: int = 8000,
                   model_type: str = 'unigram') -> Tokenizer:
  """'byte' -> ByteTokenizer(); 'sentencepiece' -> trained on texts."""
  if kind == ByteTokenizer.kind:
    return ByteTokenizer()
  if kind == SentencePieceTokenizer.kind:
    if texts is None:
      raise ValueError('A SentencePiece tokenizer needs training texts.')
    return SentencePieceTokenizer.train(texts, vocab_size,
                                        model_type=model_type)
  raise ValueError(f"Unknown tokenizer kind {kind!r}: 'byte' or "
                   "'sentencepiece'.")


__all__: Sequence[str] = (
    'PAD_ID', 'BOS_ID', 'EOS_ID', 'UNK_ID', 'NUM_RESERVED', 'Tokenizer',
    'ByteTokenizer', 'SentencePieceTokenizer', 'load_tokenizer',
    'make_tokenizer')
