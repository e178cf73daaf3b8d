"""Chat records as token rows: the tokenizer's own chat template, every
assistant turn trained.

A chat record (``{"messages": [{"role": ..., "content": ...}, ...]}``, see
``data/files.py``) is kept as its messages when the corpus is prepared
(:func:`stored_text`) and rendered only when it is tokenized into the token
store, where the tokenizer is known:

* a tokenizer with a ``chat_template`` (a Hugging Face tokenizer whose
  ``tokenizer_config.json`` or ``chat_template.jinja`` has one, kept by
  ``HuggingFaceTokenizer.chat_template``) renders the messages with it, as
  ``transformers``' ``apply_chat_template`` does: the roles, the turn
  markers and any message fields (``tool_calls``, ``name``) are the
  template's business;
* any other tokenizer uses the fixed template: each message but the
  assistant's as ``<|ROLE|>\\nCONTENT\\n`` (roles ``system``, ``user``,
  ``tool``), each assistant message as ``<|assistant|>\\n`` + CONTENT
  followed by the EOS token.

Every assistant message trains, with what ends its turn (the template's
end-of-turn marker, or EOS), unless it says ``"weight": 0``; the rest is
context. A row is ``[BOS] conversation [EOS]`` like every instruction row
(``batching.instruction_example``): a template's own leading BOS is that
BOS, and its trailing EOS that EOS. Segments are tokenized one at a time
(a turn never merges with its neighbour); a prompt for inference
(:func:`prompt_ids`) is the rendering up to the assistant's header,
tokenized whole, which is what ``apply_chat_template(messages,
add_generation_prompt=True)`` gives for an exported model
(``interop/hf_tokenizer.py`` writes the template and the BOS).

In the token store the record is the two instruction features: ``prompt``
the ids before the first trained token, ``completion`` the rest without
the final EOS, an id that does not train stored as ``-(id + 1)``
(:func:`stored_ids`, undone by ``batching.instruction_example``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from jinja2 import sandbox

from jax_transformer.data import batching
from jax_transformer.errors import UsageError

# A chat record's 'prompt' feature in a prepared corpus: MARK + its
# messages as JSON ('completion' is empty).
MARK = '\x00chat\x00'
# The instruction features a chat record fills (files.INSTRUCTION_KEYS).
FEATURES = ('prompt', 'completion')
# The fixed template (tokenizers without a chat_template).
HEADER = '<|{role}|>\n'
FIXED_ROLES = ('system', 'user', 'assistant', 'tool')


def stored_text(messages: Any, where: str) -> str:
  """The prepared form of a chat record's messages, checked: a non-empty
  list of objects, each with a string "role" and a string "content" (null
  with "tool_calls"), the last an assistant's, some assistant message
  with weight 1 (the default). UsageError names ``where``."""
  if not isinstance(messages, list) or not messages:
    raise UsageError(f'{where}: "messages" must be a non-empty list of '
                     '{"role": ..., "content": ...} objects.')
  for m in messages:
    content = m.get('content') if isinstance(m, dict) else None
    if (not isinstance(m, dict) or not isinstance(m.get('role'), str)
        or not m['role']
        or not (isinstance(content, str)
                or (content is None and m.get('tool_calls')))):
      raise UsageError(f'{where}: a message must be {{"role": a name such as '
                       f'{", ".join(FIXED_ROLES)}, "content": a string}}, got '
                       f'{json.dumps(m)[:80]}.')
    if m.get('weight', 1) not in (0, 1):
      raise UsageError(f'{where}: a message\'s "weight" is 0 (context only) '
                       f'or 1 (trains), got {json.dumps(m["weight"])}.')
  if messages[-1]['role'] != 'assistant':
    raise UsageError(f'{where}: the last message must be the assistant\'s '
                     '(the reply that trains).')
  if not any(m['role'] == 'assistant' and m.get('weight', 1)
             for m in messages):
    raise UsageError(f'{where}: every assistant message has "weight": 0, '
                     'so nothing would train.')
  return MARK + json.dumps(messages, ensure_ascii=False)


def is_stored(text: str) -> bool:
  return text.startswith(MARK)


def messages_of(text: str) -> list[dict[str, Any]]:
  return json.loads(text[len(MARK):])


# ----------------------------------------------------------------------------
# Rendering.


def template_of(tokenizer: Any) -> str | None:
  return getattr(tokenizer, 'chat_template', None)


def _marker_tokens(tokenizer: Any) -> tuple[str, str]:
  """(BOS, EOS) as the text a template writes for them: the tokens of the
  ids rows are framed with (``batching.markers``)."""
  bos, eos = batching.markers(tokenizer)
  token = getattr(tokenizer, 'id_to_token', None)
  if token is None:
    return '', ''
  return token(bos) or '', token(eos) or ''


@functools.lru_cache(maxsize=8)
def _compiled(template: str):
  def refuse(message):
    raise jinja2.exceptions.TemplateError(message)

  env = sandbox.ImmutableSandboxedEnvironment(
      trim_blocks=True, lstrip_blocks=True,
      extensions=['jinja2.ext.loopcontrols'])
  env.filters['tojson'] = lambda x, indent=None, **kw: json.dumps(
      x, ensure_ascii=False, indent=indent, sort_keys=kw.get('sort_keys',
                                                              False))
  env.globals['raise_exception'] = refuse
  try:
    return env.from_string(template)
  except jinja2.exceptions.TemplateError as e:
    raise UsageError(f'The tokenizer\'s chat template cannot be read '
                     f'({type(e).__name__}: {e}).') from None


def render_template(tokenizer: Any, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool, where: str = '') -> str:
  """The tokenizer's chat template applied to messages (the variables
  ``transformers`` gives it: messages, add_generation_prompt, bos_token,
  eos_token)."""
  bos, eos = _marker_tokens(tokenizer)
  template = _compiled(template_of(tokenizer))
  try:
    return template.render(
        messages=[{k: v for k, v in m.items() if k != 'weight'}
                  for m in messages],
        add_generation_prompt=add_generation_prompt, bos_token=bos,
        eos_token=eos)
  except jinja2.exceptions.TemplateError as e:
    said = f'{where}: ' if where else ''
    raise UsageError(f'{said}the tokenizer\'s chat template refuses these '
                     f'messages ({e}).') from None


Segment = tuple[str | int, bool]  # (text, or a token id; trains)


def _template_segments(tokenizer, messages, add_generation_prompt, where
                       ) -> list[Segment]:
  full = render_template(tokenizer, messages, add_generation_prompt, where)
  spans = []
  for i, m in enumerate(messages):
    if m['role'] != 'assistant' or add_generation_prompt:
      continue
    before = render_template(tokenizer, messages[:i], True, where)
    through = render_template(tokenizer, messages[:i + 1], False, where)
    if not (through.startswith(before) and full.startswith(through)):
      raise UsageError(
          f'{where or "A chat"}: the tokenizer\'s chat template renders '
          f'assistant message {i + 1} differently once later messages '
          'follow, so its turns cannot be told apart; give one record per '
          'assistant reply.')
    if m.get('weight', 1):
      spans.append((len(before), len(through)))
  bos, eos = _marker_tokens(tokenizer)
  start, end = 0, len(full)
  if bos and full.startswith(bos):
    start = len(bos)  # the row's own BOS
  if eos and not add_generation_prompt and full.endswith(eos):
    end -= len(eos)   # the row's own EOS
  segments: list[Segment] = []
  at = start
  for a, b in spans:
    a, b = max(a, start), min(b, end)
    if a > at:
      segments.append((full[at:a], False))
    if b > a:
      segments.append((full[a:b], True))
    at = max(at, b)
  if end > at:
    segments.append((full[at:end], False))
  return segments


def _fixed_segments(tokenizer, messages, add_generation_prompt, where
                    ) -> list[Segment]:
  eos = batching.markers(tokenizer)[1]
  segments: list[Segment] = []
  last = len(messages) - 1
  for i, m in enumerate(messages):
    role = m['role']
    if role not in FIXED_ROLES:
      raise UsageError(
          f'{where or "A chat"}: role {role!r} is not one of the fixed '
          f'template\'s ({", ".join(FIXED_ROLES)}); a tokenizer with its own '
          'chat_template (data.tokenizer_path, or a model\'s folder) decides '
          'its roles.')
    if not isinstance(m.get('content'), str):
      raise UsageError(f'{where or "A chat"}: the fixed template writes '
                       'string contents only (tool_calls need the '
                       'tokenizer\'s own chat_template).')
    if role != 'assistant':
      segments.append((HEADER.format(role=role) + m['content'] + '\n', False))
      continue
    trains = bool(m.get('weight', 1)) and not add_generation_prompt
    segments.append((HEADER.format(role=role), False))
    segments.append((m['content'], trains))
    if i < last or add_generation_prompt:
      segments.append((eos, trains))
    # The last reply's EOS is the row's own (batching).
  if add_generation_prompt:
    segments.append((HEADER.format(role='assistant'), False))
  return segments


def segments(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *,
             add_generation_prompt: bool = False, where: str = ''
             ) -> list[Segment]:
  """The conversation between the row's BOS and EOS as (text or id,
  trains) pieces, in order (module doc)."""
  make = _template_segments if template_of(tokenizer) else _fixed_segments
  out: list[Segment] = []
  for piece, trains in make(tokenizer, list(messages), add_generation_prompt,
                            where):
    if (out and isinstance(piece, str) and isinstance(out[-1][0], str)
        and out[-1][1] == trains):
      out[-1] = (out[-1][0] + piece, trains)  # one text, tokenized whole
    elif piece != '':
      out.append((piece, trains))
  return out


def _ids(tokenizer, piece: str | int) -> list[int]:
  return [piece] if isinstance(piece, int) else tokenizer.encode(piece)


def stored_ids(tokenizer: Any, text: str, where: str = ''
               ) -> tuple[list[int], list[int]]:
  """(prompt, completion) ids of a chat record's prepared text for the
  token store (module doc: an id that does not train, after the first
  that does, is stored as -(id + 1))."""
  prompt: list[int] = []
  completion: list[int] = []
  for piece, trains in segments(tokenizer, messages_of(text), where=where):
    ids = _ids(tokenizer, piece)
    if not completion and not trains:
      prompt.extend(ids)
    else:
      completion.extend(ids if trains else [-i - 1 for i in ids])
  return prompt, completion


def prompt_ids(tokenizer: Any, messages: Sequence[Mapping[str, Any]]
               ) -> list[int]:
  """A conversation's prompt for inference, as training saw it: [BOS] and
  the rendering through the assistant's header (the history's replies
  included), the template's text tokenized whole."""
  pieces = segments(tokenizer, messages, add_generation_prompt=True)
  ids = [batching.markers(tokenizer)[0]]
  text = ''
  for piece, _ in pieces:
    if isinstance(piece, int):
      ids += tokenizer.encode(text) + [piece] if text else [piece]
      text = ''
    else:
      text += piece
  return ids + (tokenizer.encode(text) if text else [])


def end_of_turn_ids(tokenizer: Any) -> list[int]:
  """The special tokens a chat template ends an assistant turn with
  (``<|im_end|>``, ``<|eot_id|>``): generation stops at them as at EOS.
  Empty without a template."""
  if not template_of(tokenizer):
    return []
  probe = [{'role': 'user', 'content': 'x'},
           {'role': 'assistant', 'content': 'y'}]
  try:
    before = render_template(tokenizer, probe[:1], True)
    through = render_template(tokenizer, probe, False)
  except UsageError:
    return []
  tail = through[len(before):]
  tail = tail[tail.find('y') + 1:] if 'y' in tail else tail
  special = set(getattr(tokenizer, 'special_ids', lambda: ())())
  return [i for i in tokenizer.encode(tail) if i in special]
