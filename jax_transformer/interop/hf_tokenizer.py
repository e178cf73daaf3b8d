"""Tokenizers for ``transformers``: a workdir's tokenizer as a Hugging Face
tokenizer directory, and what an imported one puts where the trainer
expects its reserved ids.

The reader of Hugging Face tokenizer files, :class:`HuggingFaceTokenizer`,
is in ``jax_transformer.data.tokenizers`` (the pipeline and the decoders
use it); what only export and import need is here.
"""

from __future__ import annotations

import json
import os

from tokenizers import Tokenizer as _Backend
from tokenizers import decoders, models, pre_tokenizers

from jax_transformer.data.tokenizers import (
  HF_CONFIG_FILE,
  ByteTokenizer,
  HuggingFaceTokenizer,
  Tokenizer,
)
from jax_transformer.reserved_ids import BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID

# The reserved ids as the special tokens of a converted byte tokenizer.
_SPECIAL_TOKENS = {'pad': '<pad>', 'bos': '<s>', 'eos': '</s>', 'unk': '<unk>'}


def save_pretrained(tokenizer: HuggingFaceTokenizer,
                    directory: str | os.PathLike) -> None:
  """tokenizer.json and tokenizer_config.json, which transformers'
  ``AutoTokenizer.from_pretrained(directory)`` reads (and
  ``HuggingFaceTokenizer.from_pretrained`` too)."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, 'tokenizer.json'), 'w',
            encoding='utf-8') as f:
    f.write(tokenizer.tokenizer_json)
  config = {'tokenizer_class': 'PreTrainedTokenizerFast',
            **{f'{k}_token': v for k, v in tokenizer.special_tokens.items()
               if v is not None}}
  with open(os.path.join(directory, HF_CONFIG_FILE), 'w') as f:
    json.dump(config, f, indent=2, sort_keys=True)
    f.write('\n')


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's table from bytes to printable characters (the ByteLevel
  alphabet of ``tokenizers``)."""
  printable = {*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1),
               *range(ord('®'), ord('ÿ') + 1)}
  table, extra = {}, 0
  for b in range(256):
    if b in printable:
      table[b] = chr(b)
    else:
      table[b] = chr(256 + extra)
      extra += 1
  return table


def to_huggingface(tokenizer: Tokenizer) -> HuggingFaceTokenizer | None:
  """The same tokenizer (same ids, same text) for ``transformers``, or None
  where there is none here (SentencePiece).

  Bytes become a byte-level BPE without merges: byte b is id b + 4, the
  reserved ids are the special tokens <pad>, <s>, </s>, <unk>.
  """
  if isinstance(tokenizer, HuggingFaceTokenizer):
    return tokenizer
  if not isinstance(tokenizer, ByteTokenizer):
    return None
  names = list(_SPECIAL_TOKENS.values())  # ids 0 to 3, in order
  vocab = {name: i for i, name in enumerate(names)}
  vocab.update({c: b + NUM_RESERVED for b, c in _bytes_to_unicode().items()})
  backend = _Backend(models.BPE(vocab, merges=[]))
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                   use_regex=False)
  backend.decoder = decoders.ByteLevel()
  backend.add_special_tokens(names)
  return HuggingFaceTokenizer(backend.to_str(), _SPECIAL_TOKENS)


def reserved_id_mismatches(tokenizer: Tokenizer) -> list[str]:
  """'eos is 50256'-style notes for each of PAD/BOS/EOS that the tokenizer
  puts elsewhere than the reserved id the trainer and decoders use."""
  return [f'{name} is {getattr(tokenizer, f"{name}_id")}'
          for name, want in (('pad', PAD_ID), ('bos', BOS_ID),
                             ('eos', EOS_ID))
          if getattr(tokenizer, f'{name}_id', want) != want]
