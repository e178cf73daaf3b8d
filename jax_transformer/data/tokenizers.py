"""Tokenizers: UTF-8 bytes for language models, SentencePiece for translation,
and Hugging Face ``tokenizers`` files for imported models.

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

A tokenizer brought by path (:func:`from_path`, ``data.tokenizer_path``: a
SentencePiece ``.model`` or a Hugging Face ``tokenizer.json``) keeps its own
ids instead, and says them in ``pad_id``/``bos_id``/``eos_id``/``unk_id``
(None where it has none).

``encode`` never adds BOS/EOS (batching adds them where the task needs them);
``decode`` drops PAD, BOS and EOS wherever they appear, so it can be given a
raw row of model output.

A tokenizer is saved as a directory holding ``tokenizer.json`` (its kind and
ids) and, for SentencePiece, ``spm.model`` (for Hugging Face,
``hf_tokenizer.json``); ``load_tokenizer`` restores any kind from such a
directory. The trainer writes one beside every checkpoint.

A Hugging Face tokenizer (:class:`HuggingFaceTokenizer`, imported with a model)
keeps the file's own ids, since they index the model's embedding rows: its
``pad_id``, ``bos_id`` and ``eos_id`` are those of its special tokens (None
where it has none), and ``decode`` drops its special tokens. The trainer,
batching and decoders use the reserved ids above, so such a tokenizer fits
them when its special tokens sit at 0, 1 and 2 (train it with
``special_tokens=['<pad>', '<s>', '</s>', '<unk>']`` first);
:func:`jax_transformer.interop.hf_tokenizer.reserved_id_mismatches` names
the ones that do not (GPT-2's ``<|endoftext|>`` is 50256, and its ids 0, 1,
2 are ``!``, ``"``, ``#``); that module also writes any of these tokenizers
for ``transformers``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import sentencepiece as spm
from etils import epath
from tokenizers import Tokenizer as _Backend

from jax_transformer.errors import UsageError
from jax_transformer.reserved_ids import BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID, UNK_ID

_CONFIG_FILE = 'tokenizer.json'
_SPM_FILE = 'spm.model'
_HF_FILE = 'hf_tokenizer.json'
# transformers' tokenizer settings (written by interop.hf_tokenizer).
HF_CONFIG_FILE = 'tokenizer_config.json'
CHAT_TEMPLATE_FILE = 'chat_template.jinja'


def as_text(value: Any) -> str:
  """TFDS Text comes back as bytes from files (str from mock_data)."""
  if isinstance(value, bytes):
    return value.decode('utf-8')
  if isinstance(value, np.ndarray):
    return as_text(value.item())
  return str(value)


class Tokenizer(Protocol):
  """What the pipeline, trainer and decoders rely on."""

  kind: str
  pad_id: int | None
  bos_id: int | None
  eos_id: int | None

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
  # epath: a workdir may be in object storage (see storage.py).
  directory = epath.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  config = dict(dict(pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                     unk_id=UNK_ID), **config)
  (directory / _CONFIG_FILE).write_text(
      json.dumps(config, indent=2, sort_keys=True) + '\n')


class _ReservedIds:
  """The shared reserved ids, as attributes (HuggingFaceTokenizer has its
  own)."""
  pad_id, bos_id, eos_id, unk_id = PAD_ID, BOS_ID, EOS_ID, UNK_ID


class ByteTokenizer(_ReservedIds):
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


class SentencePieceTokenizer(_ReservedIds):
  """A SentencePiece model (unigram or BPE) with the shared reserved ids.

  Built from a serialized model proto (``train`` or ``load_tokenizer``), so the
  object needs no file and pickles to worker processes.
  """

  kind = 'sentencepiece'

  def __init__(self, model_proto: bytes):
    self._proto = bytes(model_proto)
    self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
    # The model's own special ids (a model trained here has the reserved
    # layout; one brought by data.tokenizer_path, e.g. Llama 2's, has its
    # own: unk 0, bos 1, eos 2, no pad); None where it has none.
    ids = [self._sp.pad_id(), self._sp.bos_id(), self._sp.eos_id(),
           self._sp.unk_id()]
    self.pad_id, self.bos_id, self.eos_id, self.unk_id = (
        i if i >= 0 else None for i in ids)
    if self.eos_id is None:
      raise UsageError('The SentencePiece model has no end-of-sequence '
                       'piece (eos_id -1): documents could not be ended.')
    self._special = frozenset(i for i in ids[:3] if i >= 0)

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
    check_model_type(model_type)
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
                            if int(i) not in self._special and 0 <= int(i) < n])

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def save(self, directory: str | os.PathLike) -> None:
    _write_config(directory, {'kind': self.kind, 'model_file': _SPM_FILE,
                              'vocab_size': self.vocab_size})
    (epath.Path(directory) / _SPM_FILE).write_bytes(self._proto)

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


_HF_SPECIALS = ('pad', 'bos', 'eos', 'unk')


class HuggingFaceTokenizer:
  """A Hugging Face ``tokenizers`` tokenizer (the text of a tokenizer.json).

  Ids are the file's own. ``special_tokens`` names the pad, bos, eos and unk
  tokens (a missing one is None, and so is its id). ``encode`` adds no
  special tokens; ``decode`` drops every special token and any id outside
  the vocabulary. Built from the JSON text, so it needs no file and pickles.
  """

  kind = 'huggingface'

  def __init__(self, tokenizer_json: str,
               special_tokens: Mapping[str, str | None] | None = None,
               chat_template: str | None = None):
    self._json = tokenizer_json
    self._tok = _Backend.from_str(tokenizer_json)
    # The checkpoint's chat template (a Jinja text), which renders chat
    # data (data/chat.py) and is exported again; None: the fixed one.
    self.chat_template = chat_template or None
    special_tokens = special_tokens or {}
    self.special_tokens = {k: special_tokens.get(k) for k in _HF_SPECIALS}
    for name, token in self.special_tokens.items():
      if token is not None and self._tok.token_to_id(token) is None:
        raise UsageError(f'The {name} token {token!r} is not in the '
                         'tokenizer\'s vocabulary.')

  @classmethod
  def from_pretrained(cls, directory: str | os.PathLike
                      ) -> HuggingFaceTokenizer:
    """From a transformers tokenizer directory: its tokenizer.json, with the
    special tokens named in tokenizer_config.json or special_tokens_map.json.
    """
    with open(os.path.join(directory, 'tokenizer.json'),
              encoding='utf-8') as f:
      text = f.read()
    specials = {}
    for name in ('special_tokens_map.json', HF_CONFIG_FILE):
      path = os.path.join(directory, name)
      if not os.path.exists(path):
        continue
      with open(path, encoding='utf-8') as f:
        specials.update(_named_specials(json.load(f)))
    return cls(text, specials, chat_template_in(directory))

  def _special_id(self, name: str) -> int | None:
    token = self.special_tokens[name]
    return None if token is None else self._tok.token_to_id(token)

  pad_id = property(lambda self: self._special_id('pad'))
  bos_id = property(lambda self: self._special_id('bos'))
  eos_id = property(lambda self: self._special_id('eos'))
  unk_id = property(lambda self: self._special_id('unk'))

  @functools.cached_property
  def vocab_size(self) -> int:
    # Once: building the vocabulary takes milliseconds (60 for GPT-2's
    # 50,257 tokens), and decode asks for it on every call.
    return max(self._tok.get_vocab(with_added_tokens=True).values()) + 1

  def encode(self, text: str, add_special_tokens: bool = False
             ) -> list[int]:
    """The text's ids; with add_special_tokens, framed as the file's
    post-processor frames them (Llama's BOS first, GPT-2's nothing), as
    transformers' tokenizers encode by default."""
    return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

  def id_to_token(self, i: int) -> str | None:
    return self._tok.id_to_token(i)

  def special_ids(self) -> list[int]:
    """The ids of its special tokens (the turn markers of a chat template
    among them)."""
    return sorted(i for i, t in self._tok.get_added_tokens_decoder().items()
                  if t.special)

  def decode(self, ids: Iterable[int]) -> str:
    n = self.vocab_size
    return self._tok.decode([int(i) for i in ids if 0 <= int(i) < n],
                            skip_special_tokens=True)

  def save(self, directory: str | os.PathLike) -> None:
    _write_config(directory, {
        'kind': self.kind, 'model_file': _HF_FILE,
        'vocab_size': self.vocab_size, 'special_tokens': self.special_tokens,
        **{f'{k}_id': self._special_id(k) for k in _HF_SPECIALS},
        **({'chat_template': self.chat_template} if self.chat_template
           else {})})
    (epath.Path(directory) / _HF_FILE).write_text(self._json,
                                                 encoding='utf-8')

  @property
  def tokenizer_json(self) -> str:
    """The tokenizer.json text it was built from."""
    return self._json

  def __getstate__(self):
    state = {'json': self._json, 'special_tokens': self.special_tokens}
    if self.chat_template:  # absent otherwise: fingerprints unchanged
      state['chat_template'] = self.chat_template
    return state

  def __setstate__(self, state):
    self.__init__(state['json'], state['special_tokens'],
                  state.get('chat_template'))

  def __repr__(self) -> str:
    return f'HuggingFaceTokenizer(vocab_size={self.vocab_size})'


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
  """Restores a tokenizer written by ``save`` (any kind)."""
  directory = epath.Path(directory)
  path = directory / _CONFIG_FILE
  if not path.exists():
    raise FileNotFoundError(f'No {_CONFIG_FILE} in {directory}: not a '
                            'directory written by Tokenizer.save.')
  config = json.loads(path.read_text())
  if config['kind'] == ByteTokenizer.kind:
    return ByteTokenizer()
  if config['kind'] == SentencePieceTokenizer.kind:
    return SentencePieceTokenizer(
        (directory / config['model_file']).read_bytes())
  if config['kind'] == HuggingFaceTokenizer.kind:
    return HuggingFaceTokenizer(
        (directory / config['model_file']).read_text(encoding='utf-8'),
        config['special_tokens'], config.get('chat_template'))
  raise UsageError(f"Unknown tokenizer kind {config['kind']!r} in {path}")


# The usual names of special tokens, for a bare tokenizer.json that comes
# without the tokenizer_config.json naming them.
_USUAL_SPECIALS = {
    'pad': ('<pad>', '[PAD]', '<|pad|>'),
    'bos': ('<s>', '<|begin_of_text|>', '<bos>', '<|startoftext|>',
            '[CLS]'),
    'eos': ('</s>', '<|end_of_text|>', '<|endoftext|>', '<eos>', '[SEP]'),
    'unk': ('<unk>', '[UNK]', '<|unk|>'),
}
_SPM_FILES = ('tokenizer.model', _SPM_FILE)


def from_path(path: str | os.PathLike,
              field: str = 'config.data.tokenizer_path') -> Tokenizer:
  """An existing tokenizer, given by path (``data.tokenizer_path``):

  * a SentencePiece model (``*.model``, or a folder holding
    ``tokenizer.model``), with its own pad/bos/eos/unk ids;
  * a Hugging Face ``tokenizer.json`` (GPT-2's, Llama's, one trained with
    the ``tokenizers`` library), or a folder holding one: its special
    tokens are those its ``tokenizer_config.json`` or
    ``special_tokens_map.json`` names, else the usual names found in its
    vocabulary (``<s>``/``</s>``, ``<|endoftext|>``, ...); with an end but
    no begin token (GPT-2) the end token begins documents too;
  * a folder written by ``Tokenizer.save`` (a workdir's ``tokenizer/``).

  Refuses in one sentence naming ``field`` a path that is missing,
  unreadable or none of these, and a tokenizer without an end-of-document
  token.
  """
  shown = os.fspath(path)
  p = epath.Path(os.path.expanduser(shown))

  def refuse(why: str) -> UsageError:
    return UsageError(f'{field}={shown}: {why}.')

  try:
    if not p.exists():
      raise refuse('no such file or folder')
    if p.is_dir():
      if (p / _CONFIG_FILE).exists():
        if 'kind' in json.loads((p / _CONFIG_FILE).read_text()):
          return load_tokenizer(p)  # written by Tokenizer.save
        return _hf_with_specials(p / _CONFIG_FILE, refuse)
      model = next((p / n for n in _SPM_FILES if (p / n).exists()), None)
      if model is None:
        raise refuse('the folder holds no tokenizer.json and no '
                      'tokenizer.model')
      return _spm_from(model, refuse)
    if p.name.endswith('.model'):
      return _spm_from(p, refuse)
    if p.name.endswith('.json'):
      return _hf_with_specials(p, refuse)
  except UsageError:
    raise
  except (OSError, ValueError, KeyError, RuntimeError, TypeError) as e:
    raise refuse(f'cannot be read as a tokenizer ({type(e).__name__}: '
                 f'{str(e).splitlines()[0] if str(e) else ""})') from None
  raise refuse('not a tokenizer file (a SentencePiece .model, a Hugging '
               'Face tokenizer.json, or a folder holding one)')


def _spm_from(path: epath.Path, refuse) -> SentencePieceTokenizer:
  try:
    return SentencePieceTokenizer(path.read_bytes())
  except RuntimeError as e:  # not a model proto
    raise refuse(f'not a SentencePiece model ({str(e).splitlines()[0]})'
                 ) from None
  except UsageError as e:
    raise refuse(str(e).rstrip('.')) from None


def _hf_with_specials(path: epath.Path, refuse) -> HuggingFaceTokenizer:
  """The tokenizer.json at path, its specials from the files beside it,
  else guessed from their usual names; refused without an end token."""
  text = path.read_text(encoding='utf-8')
  if not isinstance(json.loads(text).get('model'), dict):
    raise refuse('not a Hugging Face tokenizer.json (it has no "model")')
  specials: dict[str, str] = {}
  for name in ('special_tokens_map.json', HF_CONFIG_FILE):
    config_path = path.parent / name
    if path.name != _CONFIG_FILE or not config_path.exists():
      continue
    specials.update(_named_specials(
        json.loads(config_path.read_text(encoding='utf-8'))))
  try:
    backend = _Backend.from_str(text)
  except Exception as e:  # the tokenizers library raises its own
    raise refuse(f'not a Hugging Face tokenizer ({str(e).splitlines()[0]})'
                 ) from None
  for key, usual in _USUAL_SPECIALS.items():
    if key not in specials:
      found = next((t for t in usual if backend.token_to_id(t) is not None),
                   None)
      if found is not None:
        specials[key] = found
  if 'eos' not in specials:
    raise refuse('the tokenizer names no end-of-document token (eos); put '
                 'a tokenizer_config.json with "eos_token" beside its '
                 'tokenizer.json')
  specials.setdefault('bos', specials['eos'])  # GPT-2: <|endoftext|>
  try:
    return HuggingFaceTokenizer(
        text, specials,
        chat_template_in(path.parent) if path.name == _CONFIG_FILE else None)
  except UsageError as e:  # a named special token not in the vocabulary
    raise refuse(str(e).rstrip('.')) from None


def fingerprint(tokenizer: Tokenizer) -> str:
  """A sha256 hex digest of what fixes the tokenizer's ids (its kind and
  model), equal for equal tokenizers however they were saved or loaded."""
  digest = hashlib.sha256(tokenizer.kind.encode())
  state = tokenizer.__getstate__() or {}  # None for ByteTokenizer
  for key in sorted(state):
    value = state[key]
    digest.update(key.encode())
    digest.update(value if isinstance(value, bytes)
                  else json.dumps(value, sort_keys=True).encode())
  return digest.hexdigest()


def check_model_type(model_type: str) -> None:
  """Refuses a SentencePiece model type other than 'unigram' or 'bpe'."""
  if model_type not in ('unigram', 'bpe'):
    raise UsageError("The SentencePiece model_type (a training config's "
                     "data.spm_model_type) must be 'unigram' or 'bpe', got "
                     f'{model_type!r}.')


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
  raise UsageError(f"Unknown tokenizer kind {kind!r}: 'byte' or "
                   "'sentencepiece'.")


__all__: Sequence[str] = (
    'PAD_ID', 'BOS_ID', 'EOS_ID', 'UNK_ID', 'NUM_RESERVED', 'Tokenizer',
    'ByteTokenizer', 'SentencePieceTokenizer', 'HuggingFaceTokenizer',
    'from_path', 'load_tokenizer', 'make_tokenizer')


def chat_template_in(directory: str | os.PathLike) -> str | None:
  """The chat template a transformers tokenizer folder holds
  (``chat_template.jinja``, else ``tokenizer_config.json``'s
  ``chat_template``: a text, or a list of named ones whose 'default' is
  taken); None where it has none."""
  folder = epath.Path(directory)
  jinja = folder / CHAT_TEMPLATE_FILE
  if jinja.exists():
    return jinja.read_text(encoding='utf-8') or None
  config = folder / HF_CONFIG_FILE
  if not config.exists():
    return None
  template = json.loads(config.read_text(encoding='utf-8')).get(
      'chat_template')
  if isinstance(template, list):
    named = {t.get('name'): t.get('template') for t in template
             if isinstance(t, dict)}
    template = named.get('default')
  return template if isinstance(template, str) and template else None


def _named_specials(config: dict) -> dict[str, str]:
  """{'bos': '<s>', ...}: the special tokens a Hugging Face tokenizer
  config file names (special_tokens_map.json, tokenizer_config.json)."""
  out = {}
  for key in _HF_SPECIALS:
    token = config.get(f'{key}_token')
    if isinstance(token, dict):  # AddedToken as saved by older versions
      token = token.get('content')
    if isinstance(token, str):
      out[key] = token
  return out
