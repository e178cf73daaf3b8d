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

from jax_transformer.data import batching, chat
from jax_transformer.data.tokenizers import (
  CHAT_TEMPLATE_FILE,
  HF_CONFIG_FILE,
  ByteTokenizer,
  HuggingFaceTokenizer,
  Tokenizer,
)
from jax_transformer.errors import UsageError
from jax_transformer.reserved_ids import BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID

# The reserved ids as the special tokens of a converted byte tokenizer.
_SPECIAL_TOKENS = {'pad': '<pad>', 'bos': '<s>', 'eos': '</s>', 'unk': '<unk>'}


# The fixed chat template (data/chat.py) for transformers: what training
# rendered for a tokenizer without a chat template of its own.
FIXED_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "<|assistant|>\n{{ m['content'] }}{{ eos_token }}{% else %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
GENERATION_CONFIG = 'generation_config.json'


def _with_bos(tokenizer_json: str, bos: str, bos_id: int) -> str:
  """tokenizer.json whose post-processor puts BOS first, as every row of
  training began (``tokenizer(text)`` then gives [BOS] + ids)."""
  spec = json.loads(tokenizer_json)
  spec['post_processor'] = {
      'type': 'TemplateProcessing',
      'single': [{'SpecialToken': {'id': bos, 'type_id': 0}},
                 {'Sequence': {'id': 'A', 'type_id': 0}}],
      'pair': [{'SpecialToken': {'id': bos, 'type_id': 0}},
               {'Sequence': {'id': 'A', 'type_id': 0}},
               {'Sequence': {'id': 'B', 'type_id': 1}}],
      'special_tokens': {bos: {'id': bos, 'ids': [bos_id], 'tokens': [bos]}}}
  return json.dumps(spec, ensure_ascii=False)


def chat_template_for_export(tokenizer: HuggingFaceTokenizer) -> str:
  """The chat template that renders what training rendered: the
  tokenizer's own, with ``{{ bos_token }}`` first where it does not begin
  with the BOS that every row began with; else the fixed one."""
  template = tokenizer.chat_template
  if not template:
    return FIXED_CHAT_TEMPLATE
  bos = tokenizer.id_to_token(batching.markers(tokenizer)[0])
  probe = [{'role': 'user', 'content': 'x'}]
  try:
    starts = chat.render_template(tokenizer, probe, True).startswith(bos)
  except UsageError:
    starts = True  # a template that needs more than one user message
  return template if starts else '{{ bos_token }}' + template


def generation_config(tokenizer: Tokenizer) -> dict:
  """generation_config.json: the BOS rows began with, the EOS (and a chat
  template's end-of-turn tokens) decoding stops at, the pad."""
  bos, eos = batching.markers(tokenizer)
  stops = [eos, *(i for i in chat.end_of_turn_ids(tokenizer) if i != eos)]
  pad = getattr(tokenizer, 'pad_id', None)
  return {'_from_model_config': False, 'bos_token_id': bos,
          'eos_token_id': stops if len(stops) > 1 else eos,
          'pad_token_id': eos if pad is None else pad}


def save_pretrained(tokenizer: HuggingFaceTokenizer,
                    directory: str | os.PathLike, add_bos: bool = True,
                    trained: Tokenizer | None = None) -> None:
  """tokenizer.json, tokenizer_config.json, chat_template.jinja and
  generation_config.json, which transformers' ``from_pretrained(directory)``
  reads (and ``HuggingFaceTokenizer.from_pretrained`` too). add_bos: the
  tokenizer puts the BOS first, as training did (rows of examples and
  instructions; a stream LM's windows had none). trained: the tokenizer
  training used, where ``tokenizer`` is its conversion (bytes)."""
  os.makedirs(directory, exist_ok=True)
  trained = trained or tokenizer
  bos_id, _ = batching.markers(trained)
  specials = dict(tokenizer.special_tokens)
  specials['bos'] = tokenizer.id_to_token(bos_id)
  text = tokenizer.tokenizer_json
  if add_bos:
    text = _with_bos(text, specials['bos'], bos_id)
  with open(os.path.join(directory, 'tokenizer.json'), 'w',
            encoding='utf-8') as f:
    f.write(text)
  config = {'tokenizer_class': 'PreTrainedTokenizerFast',
            **{f'{k}_token': v for k, v in specials.items()
               if v is not None}}
  with open(os.path.join(directory, HF_CONFIG_FILE), 'w') as f:
    json.dump(config, f, indent=2, sort_keys=True)
    f.write('\n')
  with open(os.path.join(directory, CHAT_TEMPLATE_FILE), 'w',
            encoding='utf-8') as f:
    f.write(chat_template_for_export(tokenizer))
  with open(os.path.join(directory, GENERATION_CONFIG), 'w') as f:
    json.dump(generation_config(trained), f, indent=2, sort_keys=True)
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
